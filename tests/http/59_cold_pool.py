"""Kore 4.1 opens a pooled connection with a blocking PQconnectdb(), in
the worker's event loop, the first time the pool needs one. A burst on a
worker that had opened none made it open up to pgsql_conn_max of them in
a row, and everything else the worker had to do waited for all of them:
/healthz took 2.4 s in a CI run, on a loaded machine, while no request was
doing anything slow. The worker now opens its pools when it starts,
before it serves, so a burst finds its connections made.

Made visible here with a database that takes a while to accept a
connection (a remote server, a loaded one): a proxy in front of it that
waits DELAY before it passes a new connection on."""

import os
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Background, Kore, Tap, free_port, new_key,  # noqa: E402
                     request, sql_value, wait_until)

DELAY = 0.15
CONNECTIONS = 16
t = Tap()


class SlowAccept:
    """A TCP proxy to PostgreSQL that holds each new connection for DELAY
    before it connects it through."""

    def __init__(self, target_port):
        self.target = target_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", free_port()))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        # While set, a new connection is held and never passed on: a
        # database that does not answer.
        self.hold = False
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.sock.accept()
            self.accepted += 1
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def _open(self, client):
        time.sleep(DELAY)
        if self.hold:
            self.held.append(client)
            return
        try:
            server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


db = sql_value("select current_database()")


def through(proxy, name, conn_max, connect_timeout=5):
    api = Api(name=name, conf_extra=["workers 1", f"pgsql_conn_max {conn_max}"])
    api.env["IDEM_DATABASE_URL"] = f"host=127.0.0.1 port={proxy.port} dbname={db}" \
        f" user=idem connect_timeout={connect_timeout}"
    return api


proxy = SlowAccept(int(os.environ["IDEM_TEST_PGPORT"]))
api = through(proxy, "api-cold", CONNECTIONS).start()
# The pools opened at start: 16 for requests, 1 for /healthz, 3 for the
# jobs (this one worker runs them).
at_start = proxy.accepted
t.ok(at_start >= CONNECTIONS + 1,
     f"the worker opened its pools before it served ({at_start} connections)")


def order(i):
    return api.post("/v1/orders", {"customer_id": f"c-cold-{i}", "amount": 100,
                                   "currency": "RUB"}, key=new_key("cold"), timeout=30)


# A burst as wide as the pool, on a worker that has served only /healthz.
burst = [Background(order, i) for i in range(2 * CONNECTIONS)]
time.sleep(2 * DELAY)
started = time.monotonic()
h = request(api.port, "GET", "/healthz", timeout=10)
took = time.monotonic() - started
t.ok(h.status == 200 and took <= 1.0,
     f"/healthz answers within a second during a burst on a fresh worker ({took:.2f} s)", h)
answers = [b.wait(30) for b in burst]
t.eq(sorted({a.status for a in answers}), [201], "every order of the burst is created")
t.eq(proxy.accepted, at_start, "the burst opened no connection")
t.eq(request(api.port, "GET", "/healthz").status, 200, "the worker lives")
api.stop()

# pgsql_conn_max 0 (no limit): the worker opens 16 for requests all the same.
proxy = SlowAccept(int(os.environ["IDEM_TEST_PGPORT"]))
api = through(proxy, "api-cold-unlimited", 0).start()
t.ok(proxy.accepted >= 16 + 1,
     f"with no limit, 16 request connections are opened at start ({proxy.accepted})")
api.stop()

# A database that does not answer at the start: the first connection that
# cannot be made ends the opening for every pool of the worker, so its
# start waits for one connect_timeout, not one for each pool; the rest are
# made when needed, and the worker serves once the database answers.
proxy = SlowAccept(int(os.environ["IDEM_TEST_PGPORT"]))
proxy.hold = True
api = through(proxy, "api-cold-silent", CONNECTIONS, connect_timeout=2)
Kore.start(api, lambda: "connections opened at start" in api.read_log())
time.sleep(2 * 2 + 1)
opened = [line for line in api.read_log().splitlines()
          if "connections opened at start" in line]
t.ok(len(opened) == 1 and "pool db: 0 of 16" in opened[0],
     "a database that does not answer ends the opening at its first connection",
     opened)
proxy.hold = False
wait_until(lambda: request(api.port, "GET", "/healthz", timeout=3).status == 200,
           "the worker to serve once the database answers")
t.eq(api.post("/v1/orders", {"customer_id": "c-cold-late", "amount": 100,
                             "currency": "RUB"}, key=new_key("cold")).status, 201,
     "and an order is created")
api.stop()
t.done()
