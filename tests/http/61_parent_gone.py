"""A kill -9 of an instance's parent (the OOM killer, a crash of the parent)
left its two workers running without it, reparented to init, for minutes:
they kept serving the instance's port with the old code, and the
supervisor's new instance failed to bind it every second. A worker now
stops once its parent is gone, finishing what it holds as a normal stop
does, and a new instance starts on the same port."""

import http.client
import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, EXIT_BOUND, Api, Background, Tap, alive, new_key,  # noqa: E402
                     request, wait_until)

t = Tap()
api = Api(name="api-orphan").start()
workers = api.workers()
t.eq(len(workers), 2, "two workers")

# An order in flight when the parent goes (a slow one is not needed: the
# worker's stop finishes it either way, and its answer is one the service
# may give).
inflight = Background(api.post, "/v1/orders", {"customer_id": "c-orphan",
                                                "amount": 100, "currency": "RUB"},
                      key=new_key("orphan"), timeout=ANSWER_BOUND)
os.kill(api.proc.pid, signal.SIGKILL)
api.proc.wait(EXIT_BOUND)
killed = time.monotonic()
try:
    wait_until(lambda: not any(alive(w) for w in workers),
               "the orphaned workers to stop")
except TimeoutError:
    pass
took = time.monotonic() - killed
t.ok(not any(alive(w) for w in workers),
     f"the workers stopped after their parent was killed ({took:.1f} s)",
     [w for w in workers if alive(w)])
# A 201 or a 503, or cut with the worker (the client retries with its key).
try:
    r = inflight.wait(ANSWER_BOUND)
except (OSError, http.client.HTTPException) as e:
    r = e
t.ok(isinstance(r, (OSError, http.client.HTTPException)) or r.status in (201, 503),
     "the order in flight got a 201, a 503, or was cut", r)

# The supervisor's new instance on the same port.
again = Api(name="api-orphan-again", port=api.port).start()
r = again.post("/v1/orders", {"customer_id": "c-orphan", "amount": 100, "currency": "RUB"},
               key=new_key("orphan"))
t.eq(r.status, 201, "a new instance serves the same port")
t.eq(request(again.port, "GET", "/healthz").status, 200, "and its /healthz says 200")
again.stop()
t.done()
