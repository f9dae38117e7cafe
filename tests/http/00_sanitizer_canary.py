"""make test-sanitize only: before the suite's silence is trusted, a
deliberate heap overflow and a deliberate signed overflow in the module
must be reported by AddressSanitizer and UndefinedBehaviorSanitizer, in a
worker that is then restarted by Kore. (Its log is left out of the scan
for reports; every other server log must have none.)"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (REQUEST_BOUND, Api, Tap, request, wait_until)  # noqa: E402

if not os.environ.get("IDEM_TEST_KORE_PRELOAD"):
    print("1..0 # SKIP the sanitizer build only (make test-sanitize)")
    sys.exit(0)

t = Tap()
api = Api(name="sanitizer-canary").start()
for bug, report in (("heap", "ERROR: AddressSanitizer: heap-buffer-overflow"),
                    ("ub", "runtime error: signed integer overflow")):
    try:
        r = request(api.port, "GET", f"/dev/sanitizer-canary/{bug}",
                    timeout=REQUEST_BOUND)
        answered = r.status
    except OSError:
        answered = None
    t.eq(answered, None, f"{bug}: the worker stops on the bug")
    wait_until(lambda: report in api.read_log(), f"the {bug} report")
    t.ok(report in api.read_log(), f"{bug}: the sanitizer reports it")
    wait_until(lambda: request(api.port, "GET", "/healthz").status == 200,
               "the worker to be restarted")
api.stop()
t.done()
