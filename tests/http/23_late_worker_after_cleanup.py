"""A late worker whose key was taken over, finished and deleted by the
cleanup (a retention of 1 s) before it could write: its completion finds no
key at all. The worker must not die of that answer, and the late client
gets a problem, not a success: the key's outcome is gone, so a retry with
it would be a new payment.

The late worker is held in the database (a psql session locks the payments
table its completion writes first) while its lease runs out; the retry
that takes the key over runs on a second API instance whose provider
declines, so that its completion writes no payment row and is not held.
Then the cleanup deletes the finished key, and the lock is let go."""

import http.client
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Background, Provider, PsqlSession, StubProvider, Tap,  # noqa: E402
                     key_row, new_key, quote, request, sql_value, wait_until)

t = Tap()
provider = Provider(IDEM_PROVIDER_LATENCY_MS=200).start()
declining = StubProvider(default=(402, {"Content-Type": "application/json"},
                                  {"detail": "declined by the second provider"}))
# The late worker's completion waits on the lock for as long as the scene
# takes (its lease, the take-over, the cleanup): far past the default bound
# of IDEM_DB_TIMEOUT_MS on a loaded machine, which would answer it a 503
# before the key is gone.
env = {"IDEM_LEASE_SECONDS": 3, "IDEM_PROVIDER_TIMEOUT_MS": 2000,
       "IDEM_RETENTION_SECONDS": 1, "IDEM_CLEANUP_INTERVAL_SECONDS": 1,
       "IDEM_DB_TIMEOUT_MS": 120000}
late_api = Api(name="api-late", IDEM_PROVIDER_URL=provider.url, **env).start()
taker_api = Api(name="api-taker", IDEM_PROVIDER_URL=declining.url, **env).start()
workers = late_api.workers()

key = new_key("gone")
body = {"amount": 4100, "currency": "RUB", "recipient": new_key("acc")}
lock = PsqlSession()
lock.run("begin; lock table payments in share mode;")
late = Background(late_api.post, "/v1/payments", body, key=key)
wait_until(lambda: int(sql_value("select count(*) from pg_stat_activity where wait_event ="
                                 " 'relation' and query like '%lease_complete(%'")) == 1,
           "the first worker to block on its completion")
wait_until(lambda: not key_row(key)["leased"], "its lease to run out")

taken = taker_api.post("/v1/payments", body, key=key)
t.ok(taken.status == 402 and not taken.replayed,
     "a retry on another instance takes the key over and finishes it (402)", taken)
wait_until(lambda: key_row(key) is None, "the cleanup to delete the finished key")
t.ok(key_row(key) is None, "the cleanup deleted the finished key (retention 1 s)")

lock.run("commit;")
lock.close()
try:
    answer = late.wait()
    problem = answer.json() if answer.status >= 400 else {}
except (OSError, ValueError, http.client.HTTPException) as e:
    answer, problem = e, {}
t.ok(getattr(answer, "status", None) == 410 and
     problem.get("type", "").endswith("/idempotency-key-expired"),
     "the late worker answers 410 idempotency-key-expired, not a success", answer)
t.ok("Do not retry with this key" in problem.get("detail", ""),
     "and tells the client not to retry with the key", problem)
page = request(late_api.port, "GET", "/" + problem.get("type", "http://x/none").split("/", 3)[3])
t.ok(page.status == 200 and page.headers["content-type"].startswith("text/html") and
     b"no longer kept" in page.body, "its type URL serves the idempotency-key-expired page",
     page)
t.eq(int(sql_value(f"select count(*) from payments where idem_key = {quote(key)}")), 0,
     "its late result wrote no payment")
t.eq(late_api.workers(), workers, "no worker died: the worker pids are unchanged")
t.ok("its late result was not written" in late_api.read_log(), "the late result is logged")
after = late_api.post("/v1/payments", dict(body, recipient=new_key("acc")), key=new_key("gone"))
t.ok(after.status == 201 and request(late_api.port, "GET", "/healthz").status == 200,
     "and the API serves on", after)

late_api.stop()
taker_api.stop()
declining.stop()
provider.stop()
t.done()
