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

import http.client
import json
import os
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, TOKENS, Api, Background, PsqlSession, Tap,  # noqa: E402
                     check_openapi, key_row, new_key, request, server_end, sql_value, wait_until,
                     waiting_backends)

t = Tap()
# B's deadline (IDEM_DB_TIMEOUT_MS) counts from its queueing, and the
# test's own steps (a stopped worker, a commit, A's leaving) pass inside
# it: far above them however slow the machine, so that a 503 can only be
# the defect's (B asleep to its deadline, a connection free). Above
# ANSWER_BOUND, the read of B's answer: before the fix that read gave up.
DEADLINE_MS = 60000
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
    return api.post("/v1/orders", body(customer), key=key, timeout=ANSWER_BOUND)


def send(key, customer):
    """An order sent on a raw connection, its answer not read yet."""
    payload = json.dumps(body(customer)).encode()
    raw = socket.create_connection(("127.0.0.1", api.port))
    raw.sendall(b"POST /v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + TOKENS["shop-1"].encode() + b"\r\n"
                b"Idempotency-Key: " + key.encode() + b"\r\n"
                b"Content-Type: application/json\r\n"
                b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return raw


def queued():
    """Waits until what was sent before is queued: the one worker reads a
    request whose bytes came first, and runs its handler (which queues it
    for the pool), no later than a /healthz on a connection made after it;
    /healthz answers from a connection of its own."""
    r = request(api.port, "GET", "/healthz")
    t.ok(r.status == 200, "/healthz answers meanwhile, from its own connection", r)


# The pooled connection made, the token cached: from here the requests
# need the pool only for their order.
t.eq(order(new_key("woken-warm"), "c-woken-r").status, 201, "a first order")

lock = PsqlSession()
lock.run("begin; lock table orders in share mode;")
key_r, key_a, key_b = new_key("woken-r"), new_key("woken-a"), new_key("woken-b")
first = Background(order, key_r, "c-woken-r")
wait_until(lambda: waiting_backends("%tx_execute(%") == 1,
           "the first order to hold the only connection, blocked on the table")

# A: a raw client, so that it can leave without reading its answer; then
# B, queued behind A (raw too, so that it is sent before the check that it
# is queued).
raw = send(key_a, "c-woken-a")
queued()
started_b = time.monotonic()
raw_b = send(key_b, "c-woken-b")
queued()

os.kill(worker, signal.SIGSTOP)
try:
    lock.run("commit;")
    # The first order commits; its answer waits on the stopped worker's
    # socket.
    wait_until(lambda: sql_value("select count(*) from orders where idem_key = "
                                 f"'{key_r}'") == "1", "the first order to commit")
    port_a = raw.getsockname()[1]
    raw.close()
    wait_until(lambda: server_end(api.port, port_a) == "CLOSE_WAIT",
               "the server's end of A to have A's leaving")
finally:
    os.kill(worker, signal.SIGCONT)
lock.close()

r = first.wait(ANSWER_BOUND)
t.eq(r.status, 201, "the first order is answered 201")
raw_b.settimeout(ANSWER_BOUND)
b = http.client.HTTPResponse(raw_b)
b.begin()
check_openapi("POST", "/v1/orders", b.status, {k.lower(): v for k, v in b.getheaders()},
              b.read())
raw_b.close()
# The service's own deadline is the verdict here (the defect was B sleeping
# out its IDEM_DB_TIMEOUT_MS while a connection was free): docs/testing.md,
# "The bounds that remain".
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
