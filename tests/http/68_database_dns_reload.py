"""A reload never waits on the database's host name resolution, and does
not forget the addresses it had (issue 29, review).

The worker resolved the database URL's host names in a thread running
the module's code, so a reload held until it was done: with a resolver
that holds its queries a reload deferred every request of the worker
(static ones too) until the C library gave up, and with a resolver that
keeps failing slowly the reload never came. A reload also forgot the
addresses: reloaded during a DNS outage, the worker refused every call
("host name not resolved") although the database was there.

Now the names are resolved by the C library's getaddrinfo_a(), whose
threads run no module code; the resolution in flight and the last
addresses each name had are kept across a reload (a tagged Kore
allocation). In a network namespace of its own (harness.in_netns) with a
resolver on its loopback, the verdicts are conditions: the worker
reloads while its query is still held (or while the resolver fails
slowly), a static request is served after, the query answered after the
reload is used; after a reload while the resolver fails, an order is
made at the address the name had; and a resolution held past its bound
is given up and the name asked again."""

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, HEALTH_BOUND, REQUEST_BOUND, Api, DbProxy, Tap,  # noqa: E402
                     in_netns, new_key, pg_socket, request, sql_value, wait_until)
from fake_dns import Resolver  # noqa: E402

in_netns("dnsreload")

t = Tap()
NAME = "db.idem.test"
TIMEOUT_MS = 2000


def url(port):
    db = sql_value("select current_database()")
    return (f"host={NAME} port={port} dbname={db} user=idem sslmode=disable "
            f"gssencmode=disable connect_timeout=3 application_name=dns-reload")


def order(api):
    return api.post("/v1/orders", {"customer_id": "c-dns", "amount": 100,
                                   "currency": "RUB"},
                    key=new_key("dnsr"), timeout=ANSWER_BOUND)


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


def start(name, **env):
    api = Api(name=name, conf_extra=["workers 1", "pgsql_conn_max 4"],
              IDEM_DB_TIMEOUT_MS=TIMEOUT_MS, **env)
    api.env["IDEM_DATABASE_URL"] = url(pg.port)
    super(Api, api).start(lambda: True)
    wait_until(lambda: "worker 1 started" in api.read_log(),
               "the worker to start")
    return api


def reload(api, what):
    """SIGHUP: the parent and the worker both reload."""
    before = reloads(api)
    api.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: reloads(api) >= before + 2,
               f"the parent and the worker to reload ({what})")


dns = Resolver(NAME)
pg = DbProxy(unix=pg_socket())
api = None
try:
    # 1. A resolver that holds every query: the worker reloads while its
    # query is held, serves meanwhile, and takes the answer that comes
    # after the reload.
    dns.set("hold")
    api = start("dnsr-hold")
    wait_until(lambda: dns.queries > 0 and api.workers(),
               "the worker's query to reach the resolver")
    workers = api.workers()
    reload(api, "resolver holding")
    t.ok(dns.answered == 0,
         "the worker reloaded while its query was still held",
         f"resolver answered {dns.answered}")
    r = request(api.port, "GET", "/openapi.json", timeout=REQUEST_BOUND)
    t.eq(r.status, 200, "a static request is served after that reload")
    dns.set("answer")
    wait_until(lambda: up(api), "/healthz 200 once the held query is answered")
    t.eq(order(api).status, 201, "an order is made once the name resolves")
    t.eq(api.workers(), workers, "no worker died or was replaced (held)")
    api.stop()

    # 2. A resolver that keeps failing, slowly: the reload still comes.
    dns.set("slowfail")
    api = start("dnsr-slowfail")
    wait_until(lambda: dns.answered >= 2,
               "two slow failures of the worker's queries")
    reload(api, "resolver failing slowly")
    r = request(api.port, "GET", "/openapi.json", timeout=REQUEST_BOUND)
    t.eq(r.status, 200, "a static request is served after a reload while "
         "the resolver fails slowly")
    t.ok("forced no reloaded" not in api.read_log(),
         "the resolver never held the reload back")
    dns.set("answer")
    wait_until(lambda: up(api), "/healthz 200 once the resolver answers")
    api.stop()

    # 3. A reload during a DNS outage keeps the addresses the name had.
    dns.set("answer")
    api = start("dnsr-outage")
    wait_until(lambda: up(api), "/healthz 200 once the name resolves")
    t.eq(order(api).status, 201, "an order before the outage")
    workers = api.workers()
    dns.set("fail")
    failed = api.read_log().count("host name not resolved")
    reload(api, "resolver failing")
    # The reloaded image asks the name at once, and is refused.
    wait_until(lambda: api.read_log().count("host name not resolved") > failed,
               "the reloaded worker to be refused by the resolver")
    r = order(api)
    t.eq(r.status, 201, "an order is made after a reload during a DNS outage "
         "(the address the name had)")
    t.ok(up(api), "/healthz 200 after that reload", repr(healthz(api)))
    t.eq(api.workers(), workers, "no worker died or was replaced (outage)")
    api.stop()

    # 4. A resolution that never reports (a resolver thread killed, say)
    # is given up at its bound and the names asked again: here the bound
    # is shortened (the dev build's IDEM_TEST_RESOLVE_GIVE_UP_MS) below
    # the C library's own 30 s (resolv.conf of the namespace), and the
    # resolver holds every query.
    dns.set("hold")
    asked, answered = dns.queries, dns.answered
    api = start("dnsr-stuck", IDEM_TEST_RESOLVE_GIVE_UP_MS="1500")
    wait_until(lambda: dns.queries > asked, "the worker's first query")
    wait_until(lambda: "has not reported in 1500 ms" in api.read_log(),
               "the worker to give the held resolution up")
    first = dns.queries
    wait_until(lambda: dns.queries > first,
               "a new resolution while the first is still held")
    t.ok(dns.answered == answered, "a resolution still held was given up and "
         "the name asked again", f"resolver answered {dns.answered - answered}")
    dns.set("answer")
    wait_until(lambda: up(api), "/healthz 200 once the resolver answers")
    t.eq(order(api).status, 201, "an order is made after a resolution was given up")
finally:
    dns.set("answer")
    if api is not None:
        api.stop()

t.done()
