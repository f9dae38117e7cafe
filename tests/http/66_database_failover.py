"""Failover finds the live host (issue 29).

With several hosts in the database URL, the pool moved one shared
counter once per failed attempt: an even number of simultaneous failures
(a 16-connection pool timing out together) started the next attempts at
the dead host again. And with no TCP keepalive, an idle connection to a
host that vanished without a reset stayed in the pool until a client's
request waited its whole deadline on it, one client per connection.

Now each connection walks the addresses itself, each at most
connect_timeout, and every connection has keepalives (found dead within
5 + 3 x 1 s idle) and tcp_user_timeout (docs/operations.md, The database
layer), each of them also when the URL sets another.

Here two addresses reach the same test database, each through a proxy:
the first in a network namespace of its own ("the host"), joined to the
test's namespace (harness.in_netns) by a veth pair on link-local
addresses that exist only between the two; the second on the test's own
loopback. The host goes silent as one that lost power: its end of the
link goes down, and every packet sent to it is dropped, no reset, no
refusal."""

import ctypes
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, HEALTH_BOUND, Api, Background, DbProxy, Tap,  # noqa: E402
                     in_netns, new_key, pg_socket, request, sql_value, wait_until)

NS = in_netns("failover")
CLONE_NEWNET = 0x40000000

t = Tap()
CONN_MAX = 4
# One worker: requests, /healthz, token lookups, jobs (docs/operations.md).
POOLS = CONN_MAX + 1 + 2 + 4
CONNECT_TIMEOUT = 2
# Keepalives find a silent idle connection within 5 + 3 x 1 s, the next
# attempt spends connect_timeout on the silent address: a bound on a
# hang far above that.
HANG = 60


def url(a, b, first="169.254.77.2"):
    db = sql_value("select current_database()")
    return (f"host={first},127.0.0.1 port={a.port},{b.port} dbname={db} "
            f"user=idem sslmode=disable gssencmode=disable "
            f"connect_timeout={CONNECT_TIMEOUT} application_name=failover-api")


class Host:
    """A network namespace joined to ours by a veth pair: 169.254.N.1 here,
    169.254.N.2 there; a DbProxy listens there."""

    def __init__(self, ns, n=77):
        self.ns = f"{ns}-host{n}"
        self.address = f"169.254.{n}.2"
        self.link = f"v{n}{os.getpid() % 100000}"
        here, there = self.link + "a", self.link + "b"
        ip = lambda *a: subprocess.run(["ip", *a], check=True)  # noqa: E731
        ip("netns", "add", self.ns)
        ip("link", "add", here, "type", "veth", "peer", "name", there)
        ip("link", "set", there, "netns", self.ns)
        ip("addr", "add", f"169.254.{n}.1/30", "dev", here)
        ip("link", "set", here, "up")
        for cmd in (("link", "set", "lo", "up"),
                    ("addr", "add", f"{self.address}/30", "dev", there),
                    ("link", "set", there, "up")):
            ip("netns", "exec", self.ns, "ip", *cmd)
        self.there = there
        # The proxy's listening socket is made in the host's namespace
        # (setns() moves this thread alone, and only while it binds).
        libc = ctypes.CDLL(None, use_errno=True)
        ours = os.open("/proc/self/ns/net", os.O_RDONLY)
        theirs = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
        try:
            if libc.setns(theirs, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            self.proxy = DbProxy(unix=pg_socket(), host=self.address)
        finally:
            libc.setns(ours, CLONE_NEWNET)
            os.close(ours)
            os.close(theirs)

    def silence(self):
        """The host's end of the link goes down: what is sent to it is lost."""
        subprocess.run(["ip", "netns", "exec", self.ns, "ip", "link", "set",
                        self.there, "down"], check=True)

    def remove(self):
        subprocess.run(["ip", "netns", "del", self.ns])


def order(api, timeout=ANSWER_BOUND):
    return api.post("/v1/orders", {"customer_id": "c-failover", "amount": 100,
                                   "currency": "RUB"},
                    key=new_key("fo"), timeout=timeout)


def checked(api):
    """The start's schema check has ended (it logged what it found): a
    host silenced before then would leave it waiting up to its own bound
    (82_schema_check_silent.py)."""
    return re.search(r"\]: schema (current|ahead|behind|not)", api.read_log())


def up(api):
    try:
        return request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200
    except OSError:
        return False


host = Host(NS)
host2 = None
a = host.proxy
b = DbProxy(unix=pg_socket())
api = None
try:
    api = Api(name="failover-api", conf_extra=["workers 1",
                                               f"pgsql_conn_max {CONN_MAX}"])
    api.env["IDEM_DATABASE_URL"] = url(a, b)
    api.start()
    # The pools, and the parent's one check of the schema at start.
    wait_until(lambda: a.accepted >= POOLS + 1, "every connection made at the first host")
    wait_until(lambda: checked(api), "the start's schema check to end")
    t.eq((a.accepted, b.accepted), (POOLS + 1, 0),
         "every connection is made at the first host while it answers")
    t.eq(order(api).status, 201, "an order is made")

    # The first host goes silent. No request is sent: the idle
    # connections are found dead by their keepalives, and made again at
    # the second host.
    host.silence()
    wait_until(lambda: b.accepted >= POOLS,
               "every connection made again at the live host, with no request",
               timeout=HANG)
    t.ok(True, "keepalives find every idle connection to the silent host, "
         "and each is made again at the live one")
    wait_until(lambda: up(api), "/healthz 200")
    results = [order(api).status for _ in range(2 * CONN_MAX)]
    t.eq(results, [201] * (2 * CONN_MAX),
         "every order after the move is made, none waits on the silent host")
    api.stop()

    # A new instance while the first host is silent: each connection
    # spends connect_timeout there, then goes on to the next host by
    # itself, and an order sent at once, whose deadline is above one
    # connect_timeout, is made (the shared counter sent the pool back to
    # the silent host after its 4 simultaneous failures).
    made = b.accepted
    api = Api(name="failover-api-2", conf_extra=["workers 1",
                                                 f"pgsql_conn_max {CONN_MAX}"],
              IDEM_DB_TIMEOUT_MS=2 * CONNECT_TIMEOUT * 1000)
    api.env["IDEM_DATABASE_URL"] = url(a, b)
    super(Api, api).start(lambda: request(api.port, "GET", "/openapi.json",
                                          timeout=HEALTH_BOUND).status == 200)
    first = Background(order, api)
    r = first.wait(timeout=HANG)
    t.eq(r.status, 201, "an order sent as the instance starts is made within its "
         "deadline, twice connect_timeout")
    wait_until(lambda: b.accepted - made >= POOLS, "every connection at the live host",
               timeout=HANG)
    t.ok(True, "every connection of the new instance is made at the live host")
    api.stop()

    # A URL that sets one keepalive setting of its own keeps the other
    # defaults (any one of them dropped all five: the kernel's 75 s
    # between 9 probes found the silent host after minutes).
    host2 = Host(NS, 78)
    api = Api(name="failover-api-3", conf_extra=["workers 1",
                                                 f"pgsql_conn_max {CONN_MAX}"])
    api.env["IDEM_DATABASE_URL"] = (url(host2.proxy, b, host2.address) +
                                    " keepalives_idle=5")
    api.start()
    wait_until(lambda: host2.proxy.accepted >= POOLS + 1,
               "every connection made at another first host")
    wait_until(lambda: checked(api), "the start's schema check to end")
    made = b.accepted
    host2.silence()
    wait_until(lambda: b.accepted - made >= POOLS,
               "every connection made again at the live host, with no request "
               "(keepalives_idle in the URL)", timeout=HANG)
    t.ok(True, "with keepalives_idle in the URL, keepalives still find every "
         "idle connection to the silent host within the defaults' bound")
finally:
    if api is not None:
        api.stop()
    host.remove()
    if host2 is not None:
        host2.remove()

t.done()
