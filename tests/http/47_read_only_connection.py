"""A pooled connection that reached a node that no longer takes writes.

After a failover, a connection the API opened to the old primary can be to
a node that now refuses writes (SQLSTATE 25006), with the new primary one
reconnection away (libpq's target_session_attrs=read-write picks it). Such
a connection must be dropped and made again, never kept: otherwise every
later request on it gets a 503 until the API is restarted.

Here the read-only node is the test database with the API's role set
read-only (ALTER ROLE ... SET default_transaction_read_only), which only
sessions that start afterwards see: the API's pooled connections are made
read-only, then the role is set back, so that a new connection can write
while the pooled ones still cannot. A worker opens its whole pool when it
starts: with 4 connections a worker here, all 8 are read-only, and 12
attempts outlast them.

/healthz on such a node answers 503 saying it is read-only (it said 200
"up" before issue 29), and 200 again once the node takes writes."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (HEALTH_BOUND, Api, Tap, concurrently, get, new_key, request, sql,  # noqa: E402
                     wait_until)

t = Tap()


def role_read_only(on):
    # The psql session itself may be read-only: its transaction is not.
    sql("begin read write; alter role idem " +
        ("set default_transaction_read_only = on" if on else
         "reset default_transaction_read_only") + "; commit")


def read_only_health(port):
    r = request(port, "GET", "/healthz", timeout=HEALTH_BOUND)
    return (r.status == 503 and r.headers.get("retry-after") == "1"
            and b"read-only" in r.body)


order = {"customer_id": "c-read-only", "amount": 1000, "currency": "RUB"}
api = None
try:
    role_read_only(True)
    api = Api(conf_extra=["pgsql_conn_max 4"])
    # /healthz says the node takes no writes (it said 200 "up" before).
    super(Api, api).start(lambda: read_only_health(api.port))
    t.ok(True, "/healthz on a read-only node: 503 saying it is read-only")
    # Reads work on a read-only node, on the read-only connections both
    # workers opened at start.
    reads = concurrently(8, get, api.port, "/v1/bonuses/c-read-only")
    t.ok(all(r.status == 200 for r in reads),
         "reads on read-only connections: 200", reads)
    role_read_only(False)
    wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
               "/healthz 200 once the node takes writes")
    t.ok(True, "/healthz says 200 again once the node takes writes")

    # The same key, sent again and again, one request at a time: each
    # attempt takes a worker's first free connection.
    key = new_key("read-only")
    answers = [api.post("/v1/orders", order, key=key) for _ in range(12)]
    refused = [r for r in answers if r.status == 503]
    t.ok(refused and all(r.headers.get("retry-after") == "1" and
                         b"database-unavailable" in r.body for r in refused),
         "a write on a read-only connection: a retryable 503 problem",
         answers[:2])
    t.ok(all(r.status != 500 for r in answers), "never a 500", answers)
    t.ok(any(r.status == 201 for r in answers),
         "the connection is made again: a retry with the same key creates "
         "the order", answers)
    first = next((i for i, r in enumerate(answers) if r.status == 201), None)
    t.ok(first is not None and all(r.status == 201 for r in answers[first + 1:]),
         "and every later retry replays it (no read-only connection kept)",
         answers)
    rows = sql(f"select count(*) from orders where idem_key = '{key}'")
    t.eq(rows[0][0], "1", "one order for the key")
finally:
    role_read_only(False)
    if api is not None:
        api.stop()

t.done()
