"""A late worker on the release path (issue 28, item 4b): its provider call
failed (a transient answer, or its timeout), but meanwhile its lease ran
out and another attempt took the key over and finished it. On 1.0.0 its
release was fenced and it told its client "retry with the same key"
(502/504), whatever the key held; after the cleanup that advice made a
second payment. Now it answers what the key holds now: the other attempt's
saved outcome, or 410 once that has been cleaned.

The late worker (one worker, so that its pid is known) is stopped with
SIGSTOP while its call is on the wire at a stub provider that holds the
answer until the test lets it go; SIGCONT once the scene is set. The
attempt that takes the key over runs on a second instance whose provider
declines (402, saved)."""

import os
import signal
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, Api, Background, StubProvider, Tap, key_row, new_key, quote,  # noqa: E402
                     sql_value, wait_until)

t = Tap()
go = threading.Event()


def held(_n):
    # The provider's answer to the late worker: a transient 503, once the
    # test lets it go (a bound on a hang only).
    go.wait(2 * JOB_BOUND)
    return (503, {}, b"")


declining = StubProvider(default=(402, {"Content-Type": "application/json"},
                                  {"detail": "declined by the second provider"}))
env = {"IDEM_LEASE_SECONDS": 3, "IDEM_PROVIDER_TIMEOUT_MS": 2000,
       "IDEM_DB_TIMEOUT_MS": 120000}


def scene(cleaned):
    go.clear()
    stub = StubProvider(default=held)
    late_api = Api(name="api-late-rel", conf_extra=["workers 1"],
                   IDEM_PROVIDER_URL=stub.url, **env).start()
    taker_env = dict(env)
    if cleaned:
        taker_env.update(IDEM_RETENTION_SECONDS=1, IDEM_CLEANUP_INTERVAL_SECONDS=1)
    taker_api = Api(name="api-taker-rel", IDEM_PROVIDER_URL=declining.url,
                    **taker_env).start()
    (worker,) = late_api.workers()
    key = new_key("late-rel")
    body = {"amount": 4100, "currency": "RUB", "recipient": new_key("acc")}
    late = Background(late_api.post, "/v1/payments", body, key=key)
    wait_until(lambda: stub.calls_of(f"shop-1:{key}"), "the late worker's call on the wire")
    os.kill(worker, signal.SIGSTOP)
    try:
        wait_until(lambda: not key_row(key)["leased"], "its lease to run out")
        taken = taker_api.post("/v1/payments", body, key=key)
        if cleaned:
            wait_until(lambda: key_row(key) is None, "the cleanup to delete the key")
    finally:
        go.set()
        os.kill(worker, signal.SIGCONT)
    answer = late.wait()
    payments = int(sql_value(f"select count(*) from payments where idem_key = {quote(key)}"))
    taker_api.stop()
    late_api.stop()
    stub.stop()
    return taken, answer, payments


taken, answer, payments = scene(cleaned=False)
t.ok(taken.status == 402 and not taken.replayed,
     "another instance took the key over and finished it (402, saved)", taken)
t.ok(answer.status == 402 and answer.replayed and answer.body == taken.body,
     "the late worker's release is fenced: it answers the key's saved 402, not "
     "'retry'", answer)

taken, answer, payments = scene(cleaned=True)
try:
    problem = answer.json()
except ValueError:
    problem = {}
t.ok(answer.status == 410 and
     problem.get("type", "").endswith("/idempotency-key-expired") and
     "Do not retry with this key" in problem.get("detail", ""),
     "finished and cleaned: the late worker answers 410, do not retry", answer)
t.eq(payments, 0, "no payment row from the late worker")
declining.stop()
t.done()
