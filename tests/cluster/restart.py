"""make test-cluster, after make cluster was stopped and started again
(scripts/test-cluster): every key the first run acknowledged with a 201
(a sample of them, saved by failover.py) replays its answer, byte for
byte, through haproxy."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap, post  # noqa: E402

PORT = int(os.environ["IDEM_PORT"])
WHAT = sys.argv[1]

t = Tap()
with open(os.path.join(os.environ["IDEM_TEST_TMP"], "acknowledged.json")) as f:
    acknowledged = json.load(f)
wrong = []
for a in acknowledged:
    r = post(PORT, a["path"], a["body"], key=a["key"], timeout=30)
    if r.status != 201 or not r.replayed or r.body.decode() != a["response"]:
        wrong.append((a["key"], r))
t.ok(acknowledged and not wrong, f"{WHAT}: each of the {len(acknowledged)} acknowledged "
     "keys sampled replays its answer", wrong[:3])
t.done()
