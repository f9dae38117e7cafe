"""make test-cluster, after make cluster was stopped and started again
(scripts/test-cluster): every key the first run acknowledged with a 201
(saved by failover.py, and by this script's --add) replays its answer,
byte for byte, through haproxy.

    restart.py WHAT            every saved key replays (a TAP test)
    restart.py --add N WHAT    N new keys (orders and payments) sent until
                               each is acknowledged, added to the saved ones
                               (before a stop: what the start must keep)
"""

import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ANSWER_BOUND, Tap, cluster_port, post  # noqa: E402

# haproxy over TLS, its chain verified (scripts/test-cluster).
PORT = cluster_port()
WHAT = sys.argv[1]
THREADS = 8

SAVED = os.path.join(os.environ["IDEM_TEST_TMP"], "acknowledged.json")


def add(n, what):
    """n new keys, each sent (retried on a retryable answer, 120 s at most
    for all: a bound on a hang) until its 201, added to SAVED."""
    try:
        with open(SAVED) as f:
            saved = json.load(f)
    except FileNotFoundError:
        saved = []
    run = f"rs{int(time.time() * 1000)}"
    deadline = time.monotonic() + 120
    for i in range(n):
        key = f"{run}-{i}"
        if i % 2:
            path, body = "/v1/payments", {"amount": 1000 + i, "currency": "RUB",
                                          "recipient": f"acc-{i % 7}", "purpose": key}
        else:
            path, body = "/v1/orders", {"customer_id": f"{run}-c{i % 5}",
                                        "amount": 100 + i, "currency": "RUB"}
        while True:
            try:
                r = post(PORT, path, body, key=key, timeout=ANSWER_BOUND)
            except OSError as e:
                r = e
            if getattr(r, "status", None) == 201:
                break
            if time.monotonic() > deadline:
                sys.exit(f"{what}: {key} not acknowledged within 120 s: {r}")
            time.sleep(0.5)
        saved.append({"key": key, "path": path, "body": body,
                      "response": r.body.decode()})
    with open(SAVED, "w") as f:
        json.dump(saved, f)
    print(f"# {what}: {n} keys acknowledged ({len(saved)} saved in all)")


if sys.argv[1] == "--add":
    add(int(sys.argv[2]), sys.argv[3])
    sys.exit(0)

t = Tap()
with open(SAVED) as f:
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
            r = post(PORT, a["path"], a["body"], key=a["key"], timeout=ANSWER_BOUND)
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
