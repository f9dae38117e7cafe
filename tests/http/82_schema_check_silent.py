"""The start's schema check never outlives its bound (issue 31).

At start the parent checks the database's migrations in a process of its
own (src/core/schema.c). Its connection had connect_timeout and the
server's statement_timeout, and nothing on the client's side after the
query was sent: a database host that went silent then (lost power, a
link down: no answer, no reset) left the check waiting on its socket for
as long as the kernel keeps a connection, minutes, a process no stop of
the service ends. A loaded make test-loaded found one in
66_database_failover.py, still running 30 s after the test had stopped
its API.

Here a proxy passes every connection on, but the one that sends the
start's query hears nothing more, as from a silent host: the check gives
up within its 10 s, says so in the log, and closes its connection; the
instance serves meanwhile."""

import os
import socket
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, DbProxy, Tap, new_key, pg_socket, sql_value, wait_until  # noqa: E402

t = Tap()
# The start's check, told from /healthz's query by its first words.
CHECK_SQL = b"SELECT (SELECT string_agg(e, "
GAVE_UP = ("schema not checked at start: the database did not answer within "
           "10 s (/healthz will say why)")
# A bound on a hang, far above the check's 10 s.
HANG = 60


class SilentAfterCheck(DbProxy):
    """Every connection passed on; the one that sends the check's query
    hears nothing after it (its answers are read and dropped)."""

    def __init__(self):
        super().__init__(unix=pg_socket())
        self.check = None
        self.check_closed = threading.Event()

    def _pump(self, src, dst, answers=False):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not answers and self.check is None and CHECK_SQL in data:
                    self.check = src
                if answers and dst is self.check:
                    continue
                dst.sendall(data)
        except OSError:
            pass
        if not answers and src is self.check:
            self.check_closed.set()
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


proxy = SilentAfterCheck()
db = sql_value("select current_database()")
api = Api(name="schema-silent", conf_extra=["workers 1"])
api.env["IDEM_DATABASE_URL"] = (f"host=127.0.0.1 port={proxy.port} dbname={db} "
                                f"user=idem sslmode=disable gssencmode=disable")
try:
    api.start()
    wait_until(lambda: proxy.check is not None, "the start's check to send its query")
    r = api.post("/v1/orders", {"customer_id": "c-schema", "amount": 100,
                                "currency": "RUB"}, key=new_key("sc"))
    t.eq(r.status, 201, "the instance serves while its start's check waits")

    wait_until(lambda: GAVE_UP in api.read_log(), "the check to give up", timeout=HANG,
               show=lambda: [l for l in api.read_log().splitlines() if "schema" in l])
    t.ok(True, "the check gives up on an answer that never comes, and says so")
    wait_until(proxy.check_closed.is_set, "the check's connection to close", timeout=HANG)
    t.ok(True, "the check's process closed its connection (it ended)")
    t.eq(api.get("/healthz").status, 200, "/healthz still answers 200")
finally:
    api.stop()

t.done()
