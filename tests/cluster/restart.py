"""make test-cluster, after make cluster was stopped and started again
(scripts/test-cluster): every key the first run acknowledged with a 201
(saved by failover.py) replays its answer, byte for byte, through
haproxy."""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap, cluster_port, post  # noqa: E402

# haproxy over TLS, its chain verified (scripts/test-cluster).
PORT = cluster_port()
WHAT = sys.argv[1]
THREADS = 8

t = Tap()
with open(os.path.join(os.environ["IDEM_TEST_TMP"], "acknowledged.json")) as f:
    acknowledged = json.load(f)
pending = list(acknowledged)
wrong = []
lock = threading.Lock()
deadline = time.monotonic() + 300


def replay():
    while True:
        with lock:
            # A broken start shows in a few keys; it needs no hour to say so.
            if not pending or len(wrong) >= 10 or time.monotonic() > deadline:
                return
            a = pending.pop()
        try:
            r = post(PORT, a["path"], a["body"], key=a["key"], timeout=30)
            ok = r.status == 201 and r.replayed and r.body.decode() == a["response"]
        except OSError as e:
            r, ok = e, False
        if not ok:
            with lock:
                wrong.append((a["key"], r))


started = time.monotonic()
threads = [threading.Thread(target=replay) for _ in range(THREADS)]
for th in threads:
    th.start()
for th in threads:
    th.join()
print(f"# {WHAT}: {len(acknowledged) - len(pending)} keys replayed in "
      f"{time.monotonic() - started:.1f} s")
t.ok(acknowledged and not pending and not wrong,
     f"{WHAT}: every one of the {len(acknowledged)} acknowledged keys replays its "
     "answer", wrong[:3] or f"{len(pending)} not replayed")
t.done()
