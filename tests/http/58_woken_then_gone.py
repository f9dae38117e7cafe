"""A request queued for a pooled connection is woken by Kore for the one
that came free, and its client leaves before it runs: Kore frees it
without its taking the connection, and wakes nobody else for it. The next
queued request slept on until its IDEM_DB_TIMEOUT_MS deadline, then got a
503, while the pool had a free connection. It is now woken in its place.

Made exact with SIGSTOP: one worker, one pooled connection, held by an
order blocked on a locked table; A and B queue behind it. With the worker
stopped, the order is let go (its answer waits on the worker's socket) and
A's client closes; the worker then sees both in one pass of its event
loop: the order finishes and gives its connection back, Kore wakes A, and
A's disconnect frees it before it runs."""

import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (TOKENS, Api, Background, PsqlSession, Tap, key_row,  # noqa: E402
                     new_key, sql_value, wait_until, waiting_backends)

t = Tap()
DEADLINE_MS = 8000
# No job queries in the window: Kore's queue of waiting calls is one for
# all pools, so a job giving back its own connection would wake A first.
api = Api(name="api-woken", conf_extra=["workers 1", "pgsql_conn_max 1"],
          IDEM_DB_TIMEOUT_MS=DEADLINE_MS, IDEM_AUTH_CACHE_SECONDS=600,
          IDEM_CLEANUP_INTERVAL_SECONDS=3600, IDEM_RECOVERY_INTERVAL_SECONDS=3600,
          IDEM_REPLAY_CACHE_SECONDS=0).start()
worker = api.workers()[0]


def body(customer):
    return {"customer_id": customer, "amount": 1000, "currency": "RUB"}


def order(key, customer):
    return api.post("/v1/orders", body(customer), key=key, timeout=30)


# The pooled connection made, the token cached: from here the requests
# need the pool only for their order.
t.eq(order(new_key("woken-warm"), "c-woken-r").status, 201, "a first order")

lock = PsqlSession()
lock.run("begin; lock table orders in share mode;")
key_r, key_a, key_b = new_key("woken-r"), new_key("woken-a"), new_key("woken-b")
first = Background(order, key_r, "c-woken-r")
wait_until(lambda: waiting_backends("%tx_execute(%") == 1,
           "the first order to hold the only connection, blocked on the table")

# A: a raw client, so that it can leave without reading its answer.
payload = json.dumps(body("c-woken-a")).encode()
raw = socket.create_connection(("127.0.0.1", api.port))
raw.sendall(b"POST /v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + TOKENS["shop-1"].encode() + b"\r\n"
            b"Idempotency-Key: " + key_a.encode() + b"\r\n"
            b"Content-Type: application/json\r\n"
            b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
time.sleep(0.5)
started_b = time.monotonic()
second = Background(order, key_b, "c-woken-b")
time.sleep(0.5)

os.kill(worker, signal.SIGSTOP)
try:
    lock.run("commit;")
    # The first order commits; its answer waits on the stopped worker's
    # socket.
    wait_until(lambda: sql_value("select count(*) from orders where idem_key = "
                                 f"'{key_r}'") == "1", "the first order to commit")
    raw.close()
    time.sleep(0.3)
finally:
    os.kill(worker, signal.SIGCONT)
lock.close()

r = first.wait(30)
t.eq(r.status, 201, "the first order is answered 201")
b = second.wait(30)
t.eq(b.status, 201, "the request queued behind the one whose client left gets the "
     "connection that came free (it slept to its deadline and got a 503 before)")
t.ok(time.monotonic() - started_b < DEADLINE_MS / 1000,
     "and before its deadline", round(time.monotonic() - started_b, 2))
t.eq(key_row(key_a), None, "the request whose client left was never run: no key row")
t.eq(sql_value(f"select count(*) from orders where idem_key = '{key_a}'"), "0",
     "and no order")
t.eq(api.workers(), [worker], "the worker serves on: none died")
api.stop()
t.done()
