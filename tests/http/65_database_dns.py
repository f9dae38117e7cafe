"""No name lookup on a worker's event loop (issue 29).

libpq resolves a host name with a blocking getaddrinfo() inside
PQconnectStartParams(): with the database URL naming its host, a worker
waited on the resolver before it served anything, static files included
(a static request waited 9.2 s behind a 0.5 s resolver). The service now
resolves the URL's names in a thread of its own and gives libpq the
address (hostaddr) with the name.

The test runs in a network namespace of its own (harness.in_netns) whose
resolv.conf names a resolver on its loopback, served here: it can hold
every query unanswered, fail every query (SERVFAIL), or answer. The
verdicts are conditions: a static request is answered while the resolver
still holds the worker's query; a request that needs the database gets
its 503 with Retry-After while the query is still held, and while the
resolver fails; a name that resolves again, or to another address after
a connection failure, is used without a restart.

A name with more than one address (two A records, and /etc/hosts'
localhost with ::1 and 127.0.0.1) has its addresses sorted by the C
library (RFC 6724) over a netlink socket: under the worker's seccomp
filter that killed the resolver thread, the name never resolved and a
reload then waited on it forever. Both are served, and reloaded, here."""

import os
import signal
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, HEALTH_BOUND, REQUEST_BOUND, Api, DbProxy, Tap,  # noqa: E402
                     in_netns, new_key, pg_socket, quote, request, sql, sql_value, wait_until)
from fake_dns import Resolver  # noqa: E402

# The namespace's own /etc/hosts: localhost has two addresses.
in_netns("dns", files={"hosts": "127.0.0.1 localhost\n::1 localhost\n"})

t = Tap()
NAME = "db.idem.test"
APP = "dns-api"
TIMEOUT_MS = 2000


def url(port):
    db = sql_value("select current_database()")
    return (f"host={NAME} port={port} dbname={db} user=idem sslmode=disable "
            f"gssencmode=disable connect_timeout=3 application_name={APP}")


def order(api):
    return api.post("/v1/orders", {"customer_id": "c-dns", "amount": 100,
                                   "currency": "RUB"},
                    key=new_key("dns"), timeout=ANSWER_BOUND)


def healthz(api):
    try:
        return request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND)
    except OSError:
        return None


def up(api):
    r = healthz(api)
    return r is not None and r.status == 200


def reloads(api):
    return api.read_log().count("reloaded '")


def reload_serves(api, what):
    """SIGHUP: the worker reloads (the parent and the worker say so), a
    static request is served after it, and an order made."""
    before = reloads(api)
    api.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: reloads(api) >= before + 2,
               f"the parent and the worker to reload ({what})")
    r = request(api.port, "GET", "/openapi.json", timeout=REQUEST_BOUND)
    t.eq(r.status, 200, f"a static request is served after a reload ({what})")
    wait_until(lambda: up(api), f"/healthz 200 after the reload ({what})")
    t.eq(order(api).status, 201, f"an order is made after the reload ({what})")


dns = Resolver(NAME)
pg = DbProxy(unix=pg_socket())
api = None
try:
    # 1. A resolver that holds every query.
    api = Api(name="dns-api", conf_extra=["workers 1", "pgsql_conn_max 4"],
              IDEM_DB_TIMEOUT_MS=TIMEOUT_MS)
    api.env["IDEM_DATABASE_URL"] = url(pg.port)
    super(Api, api).start(lambda: True)
    # The parent's check of the schema at start asks too, before the
    # worker is forked, from a process the parent forks (and reaps before
    # it forks the worker): its child was once read as the worker (under
    # the sanitizer, "no worker died" then saw the worker's pid instead).
    # The worker's own line first, then a query.
    wait_until(lambda: "worker 1 started" in api.read_log() and dns.queries > 0,
               "the worker to start and the resolver to be asked")
    workers = api.workers()

    try:
        static = request(api.port, "GET", "/openapi.json", timeout=REQUEST_BOUND)
    except OSError as e:
        static = e
    held = dns.answered == 0 and dns.mode == "hold"
    t.ok(getattr(static, "status", None) == 200 and held,
         "a static request is answered while the resolver holds the worker's query",
         f"{static!r}, resolver answered {dns.answered}")

    try:
        r = order(api)
    except OSError as e:
        r = e
    t.ok(getattr(r, "status", None) == 503 and "retry-after" in r.headers
         and dns.answered == 0,
         "an order is answered 503 with Retry-After within its deadline, "
         "while the query is still held", repr(r))
    r = healthz(api)
    t.ok(r is not None and r.status == 503 and dns.answered == 0,
         "/healthz is answered 503 while the query is held", repr(r))

    # The resolver answers: the worker connects, without a restart.
    dns.set("answer")
    wait_until(lambda: up(api), "/healthz 200 once the name resolves")
    r = order(api)
    t.eq(r.status, 201, "an order is made once the name resolves")
    t.eq(api.workers(), workers, "no worker died or was replaced")
    log = api.read_log()
    t.ok("sandbox violation" not in log and "SIGSYS" not in log,
         "the resolver thread stays within the worker's seccomp filter")
    api.stop()

    # 2. A resolver that fails: every request that needs the database is
    # refused at once (no address to try), and the name is asked again.
    dns.set("fail")
    before = dns.queries
    api = Api(name="dns-api-fail", conf_extra=["workers 1", "pgsql_conn_max 4"],
              IDEM_DB_TIMEOUT_MS=TIMEOUT_MS)
    api.env["IDEM_DATABASE_URL"] = url(pg.port)
    super(Api, api).start(lambda: True)
    wait_until(lambda: dns.queries > before, "the worker to ask the resolver")
    wait_until(lambda: "host name not resolved" in api.read_log(),
               "the worker to log the failed resolution")
    r = healthz(api)
    t.ok(r is not None and r.status == 503 and "not resolved" in r.body.decode(),
         "/healthz says the host name does not resolve", repr(r))
    r = order(api)
    t.ok(r.status == 503 and "retry-after" in r.headers,
         "an order is answered 503 with Retry-After while the resolver fails", repr(r))
    asked = dns.queries
    wait_until(lambda: dns.queries > asked + 1, "the name to be asked again")
    t.ok(True, "a failed name is asked again")

    dns.set("answer")
    wait_until(lambda: up(api), "/healthz 200 once the resolver answers")
    t.eq(order(api).status, 201, "an order is made once the resolver answers")

    # 3. The database moves to another address: connections fail at the
    # old one, the name is asked again and the new address used.
    moved = DbProxy(unix=pg_socket(), host="127.0.0.2", port=pg.port)
    dns.set("answer", "127.0.0.2")
    pg.close()
    sql("select pg_terminate_backend(pid) from pg_stat_activity "
        f"where application_name = {quote(APP)}")
    wait_until(lambda: up(api) and moved.accepted > 0,
               "connections to the new address")
    t.eq(order(api).status, 201, "an order is made at the new address")
    t.ok(moved.accepted > 0, "the name was resolved again after the "
         "connections failed at its old address")
    api.stop()

    # 4. A name with two addresses, the first refusing (nothing listens on
    # 127.0.0.3): the C library sorts them over netlink, in the resolver's
    # thread, under the worker's seccomp filter. The worker connects to
    # the second, and a reload does not wait on the resolver.
    dns.set("answer", ["127.0.0.3", "127.0.0.2"])
    api = Api(name="dns-api-two", conf_extra=["workers 1", "pgsql_conn_max 4"],
              IDEM_DB_TIMEOUT_MS=TIMEOUT_MS)
    api.env["IDEM_DATABASE_URL"] = url(moved.port)
    super(Api, api).start(lambda: True)
    wait_until(lambda: up(api), "/healthz 200 with a name of two addresses")
    # Read once it serves (the parent forks briefly before the worker).
    workers = api.workers()
    t.eq(order(api).status, 201, "an order is made with a name of two addresses")
    reload_serves(api, "a name of two addresses")
    t.eq(api.workers(), workers, "no worker died or was replaced (two addresses)")
    api.stop()

    # 5. host=localhost, which the namespace's /etc/hosts gives ::1 and
    # 127.0.0.1 (nothing listens on ::1).
    local = DbProxy(unix=pg_socket(), host="127.0.0.1")
    print("# localhost here:", sorted({a[4][0] for a in socket.getaddrinfo(
        "localhost", local.port, type=socket.SOCK_STREAM)}))
    api = Api(name="dns-api-localhost", conf_extra=["workers 1", "pgsql_conn_max 4"],
              IDEM_DB_TIMEOUT_MS=TIMEOUT_MS)
    api.env["IDEM_DATABASE_URL"] = url(local.port).replace(f"host={NAME}",
                                                           "host=localhost")
    super(Api, api).start(lambda: True)
    wait_until(lambda: up(api), "/healthz 200 with host=localhost (::1 and 127.0.0.1)")
    # Read once it serves (the parent forks briefly before the worker).
    workers = api.workers()
    t.eq(order(api).status, 201, "an order is made with host=localhost")
    reload_serves(api, "localhost")
    t.eq(api.workers(), workers, "no worker died or was replaced (localhost)")
finally:
    dns.set("answer")
    if api is not None:
        api.stop()

t.done()
