"""Kore 4.1 opened a pooled connection with a blocking PQconnectdb(), in
the worker's event loop, the first time the pool needed one. A burst on a
worker that had opened none made it open up to pgsql_conn_max of them in
a row, and everything else the worker had to do waited for all of them:
/healthz took 2.4 s in a CI run, on a loaded machine, while no request was
doing anything slow. The service's own database layer makes every
connection without waiting, all of them when the worker starts, so a
burst finds its connections made, and a database that is slow to accept
or never answers holds nothing but the calls that need it.

Made visible here with a database that takes a while to accept a
connection (a remote server, a loaded one): a proxy in front of it that
waits DELAY before it passes a new connection on."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, HEALTH_BOUND, Api, Background, DbProxy, Kore,  # noqa: E402
                     PsqlSession, Tap, new_key, request, sql_value, waiting_backends,
                     wait_until)

DELAY = 0.15
CONNECTIONS = 16
HOLD_BOUND = 60
t = Tap()


db = sql_value("select current_database()")


def through(proxy, name, conn_max, connect_timeout=5, **env):
    api = Api(name=name, conf_extra=["workers 1", f"pgsql_conn_max {conn_max}"], **env)
    api.env["IDEM_DATABASE_URL"] = f"host=127.0.0.1 port={proxy.port} dbname={db}" \
        f" user=idem connect_timeout={connect_timeout}"
    return api


proxy = DbProxy(DELAY)
# The burst is held by the test's lock for as long as its steps take: the
# orders' statements, and their wait for a connection, outlast them
# (IDEM_DB_TIMEOUT_MS, 5 s by default). A bound on a hang.
api = through(proxy, "api-cold", CONNECTIONS,
              IDEM_DB_TIMEOUT_MS=HOLD_BOUND * 1000).start()
# The pools opened at start: 16 for requests, 1 for /healthz, 2 for token
# lookups, 4 for the jobs (this one worker runs them); and the parent's
# one check of the schema at start.
at_start = CONNECTIONS + 1 + 2 + 4 + 1
wait_until(lambda: proxy.accepted == at_start,
           f"the worker to open its pools ({at_start} connections)")
t.eq(proxy.accepted, at_start, "the worker opened its pools when it started")


def order(i):
    return api.post("/v1/orders", {"customer_id": f"c-cold-{i}", "amount": 100,
                                   "currency": "RUB"}, key=new_key("cold"), timeout=ANSWER_BOUND)


# A burst twice as wide as the pool, on a worker that has served only
# /healthz, held in flight by a lock on the orders table: every request
# connection waits on it, the other half of the burst waits for them.
lock = PsqlSession()
lock.run("begin; lock table orders in share mode;")
try:
    burst = [Background(order, i) for i in range(2 * CONNECTIONS)]
    wait_until(lambda: waiting_backends("%tx_execute(%") == CONNECTIONS,
               f"the burst to hold all {CONNECTIONS} request connections", timeout=HOLD_BOUND)
    busy = sum(not b.done() for b in burst)
    started = time.monotonic()
    h = request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND)
    took = time.monotonic() - started
    t.ok(h.status == 200 and took <= 1.0 and busy == 2 * CONNECTIONS,
         f"/healthz answers within a second while a burst holds every request "
         f"connection of a fresh worker ({took:.2f} s, {busy} orders in flight)", h)
finally:
    lock.run("commit;")
    lock.close()
answers = [b.wait(ANSWER_BOUND) for b in burst]
t.eq(sorted({a.status for a in answers}), [201], "every order of the burst is created")
t.eq(proxy.accepted, at_start, "the burst opened no connection")
t.eq(request(api.port, "GET", "/healthz").status, 200, "the worker lives")
api.stop()

# pgsql_conn_max 0 (no limit): the worker opens 16 for requests all the same.
proxy = DbProxy(DELAY)
api = through(proxy, "api-cold-unlimited", 0).start()
wait_until(lambda: proxy.accepted >= 16 + 1 + 2 + 4 + 1,
           "the worker to open its pools with no limit")
# A window for a connection too many to show (a slow machine only widens
# it): not a bound, and the verdict does not depend on it.
time.sleep(4 * DELAY)
t.eq(proxy.accepted, 16 + 1 + 2 + 4 + 1,
     "with no limit, 16 request connections are opened at start")
api.stop()

# A database that does not answer at the start: the worker serves at
# once all the same (/healthz a 503 within a second), and once the
# database answers (its connection attempts time out and are made again),
# it serves.
proxy = DbProxy(DELAY)
proxy.hold = True
api = through(proxy, "api-cold-silent", CONNECTIONS, connect_timeout=2)
Kore.start(api, lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 503)
slow = []
for _ in range(5):
    started = time.monotonic()
    h = request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND)
    took = time.monotonic() - started
    if h.status != 503 or took > 1.0:
        slow.append((h, round(took, 2)))
t.ok(not slow, "a database that does not answer: the worker serves at once, every "
     "/healthz a 503 within a second", slow)
proxy.restore()
wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
           "the worker to serve once the database answers")
t.eq(api.post("/v1/orders", {"customer_id": "c-cold-late", "amount": 100,
                             "currency": "RUB"}, key=new_key("cold")).status, 201,
     "and an order is created")
api.stop()
t.done()
