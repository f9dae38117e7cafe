"""A burst of /healthz against a slow database (issue 31).

A worker has one connection for /healthz (never behind paying requests).
Each check used to send a query of its own and wait its turn for that
connection, within the check's bound of a second (400 ms of it for the
database). A load balancer's checks and a monitoring burst at once, or a
database a little slow, and the checks at the back of the queue answered
503 "no database connection came free in time" while the database was up:
make test-loaded caught 22 of 200 in 60_database_layer.py.

Checks in a worker now share queries: one that arrives while another's
query waits for the connection, not yet sent, rides on it and answers
what it answers (src/core/health.c). Here every answer of the health
connection comes 20 ms late, and one worker gets 100 checks at once:
one by one that is two seconds of queries, and all but the first few
missed their bound; shared, a few queries answer them all, each with
the same bytes a lone check gets."""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, DbProxy, Tap, concurrently, pg_socket, request, sql_value  # noqa: E402

t = Tap()
CHECKS = 100
# Each answer on the health connection is this late: a database a little
# slow, far inside a check's bound, and the queue of one query per check
# (CHECKS of them) far outside it.
LATE_S = 0.02
# A PostgreSQL Sync message: one per statement libpq sends.
SYNC = b"S\x00\x00\x00\x04"
# A bound on a hang (the check's own bound is a second).
ANSWER_BOUND = 60


class SlowHealth(DbProxy):
    """Passes every connection on; the health connection (the one that
    prepared /healthz's query) hears each answer LATE_S late while `slow`
    is set, and its statements are counted."""

    def __init__(self):
        super().__init__(unix=pg_socket())
        self.health = None
        self.slow = False
        self.statements = 0
        self.count_lock = threading.Lock()

    def _pump(self, src, dst, answers=False):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not answers:
                    if self.health is None and b"idem_standby()" in data:
                        self.health = src
                    if src is self.health:
                        with self.count_lock:
                            self.statements += data.count(SYNC)
                elif dst is self.health and self.slow:
                    time.sleep(LATE_S)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(2)
            except OSError:
                pass


proxy = SlowHealth()
db = sql_value("select current_database()")
api = Api(name="healthz-burst", conf_extra=["workers 1"])
api.env["IDEM_DATABASE_URL"] = (f"host=127.0.0.1 port={proxy.port} dbname={db} "
                                f"user=idem sslmode=disable gssencmode=disable")
try:
    api.start()
    lone = request(api.port, "GET", "/healthz")
    t.eq(lone.status, 200, "a lone check answers 200")
    t.ok(proxy.health is not None, "the proxy knows the health connection")

    proxy.slow = True
    before = proxy.statements
    burst = concurrently(CHECKS, lambda: request(api.port, "GET", "/healthz",
                                                 timeout=ANSWER_BOUND))
    queries = proxy.statements - before
    statuses = sorted({getattr(r, "status", repr(r)) for r in burst})
    t.ok(statuses == [200], f"{CHECKS} checks at once on one worker, each database "
         f"answer {int(LATE_S * 1000)} ms late: all answer 200",
         f"statuses {statuses}; {queries} queries on the health connection; "
         + "; ".join(sorted({r.body.decode(errors='replace')[:160]
                             for r in burst if getattr(r, 'status', 0) != 200})))
    t.ok(all(getattr(r, "body", None) == lone.body for r in burst),
         "each answers the bytes a lone check answers")
    # How many queries answered them: a speed, not a verdict (checks that
    # reach the worker far apart rightly fly alone).
    t.note(f"{queries} queries on the health connection for {CHECKS} checks")
    proxy.slow = False
    t.eq(request(api.port, "GET", "/healthz").body, lone.body,
         "a check after the burst answers the same")
finally:
    api.stop()

t.done()
