"""GET /docs in a real browser: headless Chromium (Debian's chromium, which
scripts/deps installs as root; without it this test fails, unless
IDEM_TEST_NO_BROWSER=1 skips it) loads the page, which fetches
/openapi.json and renders it; every route of the document must be a
heading of the rendered page. The browser may reach 127.0.0.1 only: any
other host fails to resolve, so a page that needed the network would not
render."""

import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, ROOT, TMP, Api, Tap)  # noqa: E402

# make test renders the page: a machine without chromium fails here, unless
# its user said the browser check is to be skipped.
browser = shutil.which("chromium")
if browser is None:
    if os.environ.get("IDEM_TEST_NO_BROWSER") == "1":
        print("1..0 # SKIP IDEM_TEST_NO_BROWSER=1: GET /docs was not rendered")
        sys.exit(0)
    print("1..1")
    print("not ok 1 - chromium is not installed (scripts/deps installs Debian's "
          "chromium as root; apt-get install chromium), so GET /docs was not "
          "rendered; IDEM_TEST_NO_BROWSER=1 skips this check")
    sys.exit(1)

t = Tap()
api = Api().start()

with open(os.path.join(ROOT, "docs", "openapi.json")) as f:
    doc = json.load(f)
routes = sorted(f"{m.upper()} {p}" for p, item in doc["paths"].items()
                for m in item)

profile = tempfile.mkdtemp(prefix="chromium-", dir=TMP)
try:
    out = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-dev-shm-usage", "--no-first-run", "--no-zygote",
         f"--user-data-dir={profile}",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         # Runs the page's timers and fetches to the end before the dump.
         "--virtual-time-budget=15000", "--dump-dom",
         f"http://127.0.0.1:{api.port}/docs"],
        capture_output=True, text=True, timeout=COMMAND_BOUND)
finally:
    shutil.rmtree(profile, ignore_errors=True)

dom = out.stdout
t.ok(out.returncode == 0 and "<html" in dom, "chromium rendered GET /docs",
     out.stderr[-2000:])
t.ok('data-rendered="yes"' in dom, "the page rendered /openapi.json",
     re.search(r'<div id="error">(.*?)</div>', dom, re.S))

headings = {re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", h))).strip()
            for h in re.findall(r"<h2[^>]*>(.*?)</h2>", dom, re.S)}
for route in routes:
    t.ok(route in headings, f"{route} is on the page")
t.ok(routes and len(routes) >= 12, f"{len(routes)} routes in all")

for what in ("Idempotency-Key", "Idempotent-Replayed", "Retry-After",
             "request-in-progress", "card-declined", "refund-exceeds-payment"):
    t.ok(what in dom, f"the page shows {what}")
t.ok("9007199254740991" in dom and "customer_id" in dom,
     "and the bodies' members with their limits")

api.stop()
t.done()
