"""make test-cluster, after make cluster was stopped and started again
(scripts/test-cluster): every key the first run acknowledged with a 201
(a sample of them, saved by failover.py) replays its answer, byte for
byte, through haproxy."""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap, post  # noqa: E402

PORT = int(os.environ["IDEM_PORT"])
WHAT = sys.argv[1]

t = Tap()
with open(os.path.join(os.environ["IDEM_TEST_TMP"], "acknowledged.json")) as f:
    acknowledged = json.load(f)
wrong = []
deadline = time.monotonic() + 300
for a in acknowledged:
    r = post(PORT, a["path"], a["body"], key=a["key"], timeout=30)
    if r.status != 201 or not r.replayed or r.body.decode() != a["response"]:
        wrong.append((a["key"], r))
    # A broken start shows in a few keys; it needs no hour to say so.
    if len(wrong) >= 10 or time.monotonic() > deadline:
        wrong.append(("stopped", f"after {len(wrong)} wrong answers or 300 s"))
        break
t.ok(acknowledged and not wrong, f"{WHAT}: each of the {len(acknowledged)} acknowledged "
     "keys sampled replays its answer", wrong[:3])
t.done()
