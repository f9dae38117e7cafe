"""The database layer never makes a worker wait on PostgreSQL (issue 18).

Kore 4.1's pgsql layer, which the service rode before, cancelled a
statement with a blocking PQcancel() and PQgetResult() when its request
went away, made connections with a blocking PQconnectdb(), remade them
with PQreset(), grew a pool with every burst, and handed out connections
that had died while idle. Each scenario below failed on it; each asserts
what a client or an operator sees: answers, their time where the contract
bounds it, connection counts, the server's log."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, DB_URL, HEALTH_BOUND, ROOT, Api, Background, DbProxy, Kore, PsqlSession,  # noqa: E402
                     Tap, cluster, concurrently, free_port, new_key, quote, request, sql,
                     sql_value, wait_server_closed, wait_until)

t = Tap()
PGPORT = int(os.environ["IDEM_TEST_PGPORT"])
PGDATA = os.environ["IDEM_TEST_PGDATA"]
DB = sql_value("select current_database()")
CONN_MAX = 4
# One worker: pgsql_conn_max for requests, 1 for /healthz, 2 for token
# lookups, 4 for the jobs (worker 1 runs them): docs/operations.md, The database layer.
FORMULA_ONE_WORKER = CONN_MAX + 1 + 2 + 4
# A bound on a hang for an instance's pools to be made: the sanitizers'
# build is slow to connect.
POOLS_BOUND = 60
# The service's stated bounds, kept as verdicts (docs/testing.md, "The
# bounds that remain"): an order whose database address never answers is a
# 503 within IDEM_DB_TIMEOUT_MS plus its grace (0.5 s), plus a second for the
# deadline timer's step and a loaded machine's scheduling; once the
# address answers again, the service serves within BACK_BOUND: its dead
# connections are dropped within IDEM_DB_TIMEOUT_MS and remade in the
# background, one attempt every 250 ms (docs/operations.md, "The database
# layer").
HOLE_GRACE = 0.5 + 1.0
BACK_BOUND = 10
# How long the database stays down in the restart under load: the fault's
# length, not a bound.
OUTAGE_SECONDS = 1


def url(app, **extra):
    """The test database's URL, its connections named app."""
    return DB_URL + f" application_name={app}" + "".join(
        f" {k}={v}" for k, v in extra.items())


def api_with(name, workers=1, conn_max=CONN_MAX, database_url=None, **env):
    api = Api(name=name, conf_extra=[f"workers {workers}",
                                     f"pgsql_conn_max {conn_max}"], **env)
    api.env["IDEM_DATABASE_URL"] = database_url or url(name)
    return api


def connections(app):
    return int(sql_value("select count(*) from pg_stat_activity "
                         f"where application_name = {quote(app)}"))


def who(app):
    """The connections named app, for a wait's failure: how many, and each
    backend's pid, start and state."""
    rows = sql("select pid, backend_start::time(0), state from pg_stat_activity "
               f"where application_name = {quote(app)} order by backend_start")
    return f"{len(rows)} connections: " + ", ".join(" ".join(r) for r in rows)


def order(api, customer, timeout=ANSWER_BOUND, key=None):
    return api.post("/v1/orders", {"customer_id": customer, "amount": 100,
                                   "currency": "RUB"},
                    key=key or new_key("db"), timeout=timeout)


def timed_healthz(port, timeout=HEALTH_BOUND):
    started = time.monotonic()
    try:
        r = request(port, "GET", "/healthz", timeout=timeout)
    except OSError as e:
        r = e
    return r, time.monotonic() - started


def raw_order(port, customer):
    """An order sent on a raw socket, left open: the client that will leave."""
    body = ('{"customer_id": "%s", "amount": 100, "currency": "RUB"}' % customer).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/orders HTTP/1.1\r\nHost: x\r\n"
              b"Authorization: Bearer dev-shop-1\r\n"
              + f"Idempotency-Key: {new_key('db-leaves')}\r\n".encode()
              + b"Content-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return s


def problem_type(r):
    return r.json().get("type", "").rsplit("/", 1)[-1]


# --- a client leaves while its statement hangs in a stopped backend --------

def client_leaves_while_backend_hangs():
    api = api_with("api-db-leaves").start()
    lock = PsqlSession()
    lock.run("begin; lock table orders in share mode;")
    client = raw_order(api.port, "c-db-leaves")
    wait_until(lambda: sql_value(
        "select count(*) from pg_stat_activity where wait_event_type = 'Lock' "
        "and application_name = 'api-db-leaves'") == "1",
        "the order to wait on the held table")
    pid = int(sql_value("select pid from pg_stat_activity where "
                        "wait_event_type = 'Lock' and application_name = 'api-db-leaves'"))
    os.kill(pid, signal.SIGSTOP)
    try:
        lock.run("commit;")
        lock.close()
        # The client gives up: the request is freed with its statement
        # still in flight on a backend that cannot answer.
        wait_server_closed(api.port, client,
                           "the worker to free the request whose client left")
        slow = []
        for _ in range(3):
            r, took = timed_healthz(api.port)
            if isinstance(r, Exception) or r.status != 200 or took > 1.0:
                slow.append((r, round(took, 2)))
        t.ok(not slow, "a client left while its statement hangs: /healthz on new "
             "connections answers 200 within a second", slow)
        r = order(api, "c-db-other", timeout=ANSWER_BOUND)
        t.eq(r.status, 201, "and another order is served meanwhile")
    finally:
        os.kill(pid, signal.SIGCONT)
    # The abandoned statement ends (its connection read in the background,
    # or closed past its bound); the worker goes on serving.
    wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
               "the worker to serve after the backend goes on")
    wait_until(lambda: connections("api-db-leaves") == FORMULA_ONE_WORKER,
               f"the instance to hold its {FORMULA_ONE_WORKER} connections",
               show=lambda: who("api-db-leaves"))
    t.eq(order(api, "c-db-leaves-after", timeout=ANSWER_BOUND).status, 201,
         "the worker serves on once the backend goes on")
    api.stop()


# --- a statement the server ended itself: no cancel request ---------------

def no_cancel_after_lock_timeout():
    """A cancel request is a connection of its own to the server: every
    connection the instance makes goes through a proxy that counts them."""
    proxy = DbProxy()
    api = api_with("api-db-lock", IDEM_DB_TIMEOUT_MS=700,
                   database_url=f"host=127.0.0.1 port={proxy.port} dbname={DB} "
                   "user=idem sslmode=disable gssencmode=disable "
                   "application_name=api-db-lock").start()
    # Its pools, and the start's check of the schema.
    made = FORMULA_ONE_WORKER + 1
    wait_until(lambda: proxy.accepted == made, f"the pools to be made ({made} connections)",
               timeout=POOLS_BOUND, show=lambda: proxy.accepted)
    lock = PsqlSession()
    lock.run("begin; lock table orders in share mode;")
    answers = [order(api, f"c-db-lock-{i}", timeout=ANSWER_BOUND) for i in range(3)]
    lock.run("rollback;")
    lock.close()
    t.ok([a.status for a in answers] == [503] * 3,
         "orders past lock_timeout are 503s", answers)
    t.eq(order(api, "c-db-lock-after", timeout=ANSWER_BOUND).status, 201,
         "the same connections serve the next order")
    # Whatever the worker sent, it sent before it ended.
    api.stop()
    t.eq(proxy.all_accepted(), made,
         "a statement the server ended itself: the instance made no connection "
         "beyond its pools (no cancel request)")
    proxy.close()


# --- bursts do not grow the pools ------------------------------------------

def connections_are_named():
    api = api_with("api-db-named", database_url=DB_URL).start()
    # Only this API names its connections idem-api: no other runs now (the
    # runner kills and fails what a test leaves running, tests/run-one).
    # The count is exact once its pools are made; a connection made again
    # on the way (its old backend not yet gone) puts it off by one for a
    # moment, not for good. A bound on a hang of a minute: the sanitizers'
    # build is slow to connect.
    wait_until(lambda: connections("idem-api") == FORMULA_ONE_WORKER,
               f"{FORMULA_ONE_WORKER} connections named idem-api", timeout=POOLS_BOUND,
               show=lambda: who("idem-api"))
    t.eq(connections("idem-api"), FORMULA_ONE_WORKER,
         "a URL without application_name: the connections are named idem-api")
    api.stop()


def bursts_hold_the_formula():
    api = api_with("api-db-burst", workers=2).start()
    formula = 2 * (CONN_MAX + 1 + 2) + 4
    wait_until(lambda: connections("api-db-burst") == formula,
               f"the pools to be made ({formula} connections)",
               show=lambda: who("api-db-burst"))
    health = concurrently(200, lambda: request(api.port, "GET", "/healthz", timeout=ANSWER_BOUND))
    t.ok(all(r.status == 200 for r in health), "200 concurrent /healthz are answered 200",
         sorted({r.status for r in health}))
    t.eq(connections("api-db-burst"), formula,
         f"and the instance still holds {formula} connections")
    unknown = concurrently(100, lambda: api.post(
        "/v1/orders", {"customer_id": "c", "amount": 1, "currency": "RUB"},
        key=new_key("db"), token=f"unknown-{new_key()}", timeout=ANSWER_BOUND))
    t.ok(all(r.status == 401 for r in unknown), "100 unknown tokens at once are 401s",
         sorted({r.status for r in unknown}))
    t.eq(connections("api-db-burst"), formula,
         "and the token lookups took no connection beyond their pool")
    again = concurrently(50, lambda: api.post(
        "/v1/orders", {"customer_id": "c", "amount": 1, "currency": "RUB"},
        key=new_key("db"), token="unknown-same-token", timeout=ANSWER_BOUND))
    t.ok(all(r.status == 401 for r in again), "one unknown token sent 50 times: 401s")
    api.stop()


# --- an address that accepts and never answers ----------------------------

def database_address_never_answers():
    proxy = DbProxy()
    timeout_ms = 2000
    api = api_with("api-db-hole", IDEM_DB_TIMEOUT_MS=timeout_ms,
                   database_url=f"host=127.0.0.1 port={proxy.port} dbname={DB} "
                   "user=idem connect_timeout=2 application_name=api-db-hole").start()
    wait_until(lambda: connections("api-db-hole") == FORMULA_ONE_WORKER,
               "the pools to be made", show=lambda: who("api-db-hole"))
    proxy.black_hole()
    orders = [Background(lambda i=i: (time.monotonic(), order(api, f"c-db-hole-{i}", timeout=ANSWER_BOUND),
                                      time.monotonic())) for i in range(6)]
    slow = []
    for _ in range(8):
        r, took = timed_healthz(api.port)
        if isinstance(r, Exception) or r.status != 503 or took > 1.0:
            slow.append((r, round(took, 2)))
        time.sleep(0.2)
    t.ok(not slow, "the database's address accepts and never answers: every /healthz "
         "is a 503 within a second", slow)
    late = []
    for b in orders:
        start, r, end = b.wait(ANSWER_BOUND)
        if r.status != 503 or end - start > timeout_ms / 1000 + HOLE_GRACE:
            late.append((r, round(end - start, 2)))
    t.ok(not late, "every order is a 503 within IDEM_DB_TIMEOUT_MS and its grace", late)
    proxy.restore()
    back = time.monotonic()
    wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
               "the service to be back with the database")
    t.ok(time.monotonic() - back < BACK_BOUND, "the service is back within seconds of the "
         f"database ({time.monotonic() - back:.1f} s, bound {BACK_BOUND} s)")
    t.eq(order(api, "c-db-hole-after").status, 201, "and an order is created")
    api.stop()


# --- a restart under load ---------------------------------------------------

def restart_under_load():
    api = api_with("api-db-restart", workers=2, conn_max=16).start()
    stop = threading.Event()
    seen = []

    def load():
        i = 0
        while not stop.is_set():
            i += 1
            try:
                seen.append(order(api, f"c-db-load-{i}", timeout=ANSWER_BOUND).status)
            except OSError:
                seen.append("cut")

    loaders = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for th in loaders:
        th.start()
    wait_until(lambda: seen.count(201) >= 20, "the load to run")
    cluster("stop")
    time.sleep(OUTAGE_SECONDS)
    cluster("start")
    wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
               "/healthz to say 200 after the restart")
    stop.set()
    for th in loaders:
        th.join(ANSWER_BOUND)
    statuses = [order(api, f"c-db-after-restart-{i}").status for i in range(100)]
    t.eq(sorted(set(statuses)), [201], "after a restart under load, once /healthz says "
         "200, 100 writes in a row are all 201", )
    t.ok(set(seen) <= {201, 503}, "under the restart the load saw 201s and 503s only",
         sorted(set(map(str, seen))))
    api.stop()


# --- synchronous_commit pinned ----------------------------------------------

def synchronous_commit_is_pinned():
    sql("alter role idem set synchronous_commit = local")
    sql("alter system set synchronous_standby_names = 'never_confirms'")
    sql("select pg_reload_conf()")
    key = new_key("db-sync")
    try:
        api = api_with("api-db-sync", IDEM_DB_TIMEOUT_MS=1000).start()
        r = order(api, "c-db-sync", key=key, timeout=ANSWER_BOUND)
        t.ok(r.status == 503, "the role's default is synchronous_commit = local and the "
             "named standby never confirms: the order is not acknowledged", r)
        t.eq(sql_value("set synchronous_commit = local; select idem_standby()"), "f",
             "idem_standby() is false where commits do not wait for the standby")
        t.eq(sql_value("set synchronous_commit = on; select idem_standby()"), "t",
             "and true where they do")
    finally:
        sql("alter role idem reset synchronous_commit")
        sql("alter system reset synchronous_standby_names")
        sql("select pg_reload_conf()")
    # The standby unnamed, the waiting commit goes through: the retry
    # with the same key gets the order, once.
    r = order(api, "c-db-sync", key=key, timeout=ANSWER_BOUND)
    t.eq(r.status, 201, "the retry with the same key gets the order", )
    t.eq(sql_value(f"select count(*) from orders where idem_key = {quote(key)}"), "1",
         "made once")
    api.stop()


# --- refusals that no retry changes -----------------------------------------

def start_refused(api):
    return Kore.start(api, lambda: request(api.port, "GET", "/healthz",
                                           timeout=HEALTH_BOUND).status == 503)


def refused(name, database_url, cause, words):
    api = api_with(name, database_url=database_url)
    start_refused(api)
    h, took = timed_healthz(api.port)
    t.ok(h.status == 503 and problem_type(h) == "database-misconfigured" and
         cause in h.json()["detail"] and took <= 1.0,
         f"{cause}: /healthz is a 503 database-misconfigured naming it", h)
    r = order(api, "c-db-refused")
    t.ok(r.status == 503 and problem_type(r) == "database-misconfigured" and
         cause in r.json()["detail"],
         f"{cause}: an order is a 503 database-misconfigured naming it", r)
    log = api.read_log()
    t.ok(cause in log and words in log, f"{cause}: the log says it in the server's words",
         [l for l in log.splitlines() if "database" in l][-3:])
    # Once per pool and interval, not once per call (the jobs call every
    # second, /healthz and the order above once each).
    t.ok("database call failed" not in log and "retrying in" not in log,
         f"{cause}: no line per failed call", [l for l in log.splitlines()
                                               if "failed" in l][:3])
    api.stop()


def permanent_refusals_named():
    base = f"host=127.0.0.1 port={PGPORT} connect_timeout=3"
    refused("api-db-nodb", f"{base} dbname=idem_no_such_db user=idem",
            "no such database", 'database "idem_no_such_db" does not exist')
    # Two hosts, the second refusing connections: the pool's cause is the
    # first's refusal, not the second's silence (it was the last address
    # tried, and the missing database was taken as a retryable outage).
    refused("api-db-nodb-two", f"host=127.0.0.1,127.0.0.1 port={PGPORT},{free_port()} "
            "connect_timeout=3 dbname=idem_no_such_db user=idem",
            "no such database", 'database "idem_no_such_db" does not exist')

    hba = os.path.join(PGDATA, "pg_hba.conf")
    with open(hba) as f:
        original = f.read()
    sql("drop role if exists idem_pw")
    sql("create role idem_pw login password 'right'")
    try:
        with open(hba, "w") as f:
            f.write("host all idem_pw 127.0.0.1/32 scram-sha-256\n" + original)
        sql("select pg_reload_conf()")
        refused("api-db-password", f"{base} dbname={DB} user=idem_pw password=wrong",
                "authentication failed", 'password authentication failed for user "idem_pw"')
    finally:
        with open(hba, "w") as f:
            f.write(original)
        sql("select pg_reload_conf()")
        sql("drop role if exists idem_pw")

    sql("drop database if exists idem_unmigrated")
    sql("create database idem_unmigrated")
    try:
        api = api_with("api-db-unmigrated",
                       database_url=f"{base} dbname=idem_unmigrated user=idem")
        start_refused(api)
        h = request(api.port, "GET", "/healthz")
        t.ok(problem_type(h) == "database-misconfigured" and
             "schema not migrated" in h.json()["detail"],
             "schema not migrated: /healthz names it", h)
        r = order(api, "c-db-unmigrated")
        t.ok(r.status == 503 and problem_type(r) == "database-misconfigured" and
             "schema not migrated" in r.json()["detail"],
             "schema not migrated: an order is a 503 database-misconfigured", r)
        api.stop()
    finally:
        sql("drop database if exists idem_unmigrated")


# --- a migration makes a prepared statement stale ---------------------------

def stale_prepared_statement():
    """Each statement is prepared once per connection. A migration that
    changes a function's result type makes PostgreSQL refuse the prepared
    statement ("cached plan must not change result type"): the service
    prepares it again and the call succeeds."""
    api = api_with("api-db-stale").start()
    for _ in range(3):
        request(api.port, "GET", "/healthz")
    swap = ("begin; drop function idem_standby(); create function idem_standby() "
            "returns {t} language sql stable as $$ select {v} $$; commit;")
    try:
        sql(swap.format(t="text", v="'no'::text"))
        answers = [request(api.port, "GET", "/healthz").status for _ in range(3)]
        t.eq(answers, [200] * 3, "a function's result type changed under prepared "
             "statements: /healthz still answers 200")
        t.ok("prepared statements are stale" in api.read_log(),
             "the log says the statements were prepared again")
    finally:
        # Back as the migration makes it.
        sql("drop function if exists idem_standby()")
        subprocess.run(["psql", DB_URL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f",
                        os.path.join(ROOT, "sql", "002_transactional.sql")],
                       check=True, capture_output=True)
    t.eq(request(api.port, "GET", "/healthz").status, 200,
         "and again once the function is back")
    t.eq(order(api, "c-db-stale").status, 201, "orders are served")
    api.stop()


SCENARIOS = [client_leaves_while_backend_hangs, no_cancel_after_lock_timeout,
             connections_are_named, bursts_hold_the_formula, database_address_never_answers,
             synchronous_commit_is_pinned, permanent_refusals_named,
             stale_prepared_statement, restart_under_load]
# IDEM_TEST_SCENARIO=name runs that one alone.
for scenario in SCENARIOS:
    if os.environ.get("IDEM_TEST_SCENARIO", scenario.__name__) == scenario.__name__:
        scenario()
t.done()
