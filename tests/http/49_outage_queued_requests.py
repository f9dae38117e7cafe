"""PostgreSQL stops under more load than the pool has connections, so
that requests wait in Kore's queue for a pooled connection. When the
database goes, Kore itself frees the connections whose socket reports an
error with a query in flight, and Kore 4.1 wakes no queued request then
(only a connection given back does): the queued requests slept until
their IDEM_DB_TIMEOUT_MS deadline, a 503 seconds late, or until a
connection was given back after the database had returned. Found by the
chaos soak (47_chaos_soak.py). Each such loss now wakes the oldest queued
request, which makes a new connection, or fails at once and wakes the
next: every request during the outage gets its 503 at once."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, Api, Tap, cluster, database_errors, new_key,  # noqa: E402
                     wait_until)

t = Tap()
# A deadline far above what an answer should take, so that a request that
# sleeps in the queue until it is seen as such.
DEADLINE_MS = 8000
# A bound on a hang only: the conditions waited on come within a second or
# two even on a loaded machine.
HANG_BOUND = 60
# How long the database stays down each time, and the load runs on after
# the last outage: the fault's length, long so that an order that slept
# through it is far from one answered at once, even on a loaded machine.
OUTAGE_SECONDS = 8
api = Api(IDEM_DB_TIMEOUT_MS=DEADLINE_MS).start()
answers = []
stop = threading.Event()


def load(n):
    """Orders with fresh keys, back to back: 60 clients for 2 workers of 16
    connections each keep a queue."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            r = api.post("/v1/orders", {"customer_id": f"c-queue-{n % 5}", "amount": 1000,
                                        "currency": "RUB"}, key=new_key("queue"), timeout=ANSWER_BOUND)
            answers.append((started, time.monotonic() - started, r.status))
        except OSError as e:
            answers.append((started, time.monotonic() - started, repr(e)))


threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(60)]
for th in threads:
    th.start()
outages = []
try:
    for i in range(3):
        wait_until(lambda: sum(1 for a in answers if a[2] == 201) >= 100 * (i + 1),
                   "orders before the outage", timeout=HANG_BOUND)
        down = time.monotonic()
        cluster("stop")
        time.sleep(OUTAGE_SECONDS)
        cluster("start")
        up = time.monotonic()
        outages.append((down, up))
        # An order sent after the restart succeeds: the API serves again.
        # Not a /healthz poll: a health check's call has a bound of its own
        # (under a second), and one that finds the pool still connecting
        # under load says "no database connection came free" too, which the
        # count below would take for an order that gave up.
        wait_until(lambda: any(a[0] > up and a[2] == 201 for a in answers),
                   "the API to serve orders again", timeout=HANG_BOUND)
    time.sleep(OUTAGE_SECONDS)
finally:
    stop.set()
    for th in threads:
        th.join(ANSWER_BOUND)
    cluster("start")

statuses = {a[2] for a in answers}
t.ok(statuses <= {201, 503}, "every answer was a 201 or a 503", statuses)
# Still a duration, between two behaviours far apart: an order answered at
# once takes milliseconds (a second or so on a loaded machine), one that
# slept in the queue through an outage (8 s of a stopped database, with
# its stop and start) or until its deadline (8 s) takes seconds more than
# this, if it was queued in the outage's first half.
SLEPT_S = OUTAGE_SECONDS / 2
slow = sorted((round(took, 2), status) for started, took, status in answers if took > SLEPT_S)
t.eq(slow, [], f"each of {len(answers)} orders through {len(outages)} outages was answered"
     f" within {SLEPT_S} s, none slept in the queue for a connection")
# Not the readiness poll's /healthz at the start, which may wait out its
# own bound (under a second) for the health pool's first connection.
gave_up = [l for l in database_errors(api.read_log()) if "no database connection came free" in l]
t.eq(gave_up, [], "no request gave up waiting for a pooled connection")
t.ok(sum(1 for a in answers if a[2] == 503) > 0, "the outages were seen (503s)")
api.stop()
t.done()
