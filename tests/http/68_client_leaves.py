"""The settle does not depend on the client (issue 28, item 5): a client
that closes its connection while its payment waits for the provider, or
while the provider's answer is being saved, leaves nothing in progress.
The worker finishes the flow itself (src/lease/handoff.c) at once: the key
is done with the provider's one charge and one payment row, and a retry
gets the 201 replay naming that charge. Before, the request was freed with
its flow: the provider's call was dropped, and the key stayed in_progress
until its lease ended and the recovery job claimed it
(IDEM_RECOVERY_AFTER_SECONDS later; here an hour, so that only the worker
itself can finish it within the test's bound).

- call: the provider thinks 2 s; the client closes its socket once the
  provider has the request;
- settle: the provider answers at once and lease_complete() is held on a
  lock on the payments table; the client closes while that statement is
  in flight, bound to its request; then the lock is let go;
- queued: one pooled connection, held by another key's lease_complete()
  on that lock; the client leaves while its own statement waits for the
  connection (or is about to);
- reload: a SIGHUP while such a flow waits for the provider: the worker
  reloads once the flow is finished, as for a request in flight.
IDEM_TEST_SCENARIO=name runs one part."""

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Provider, PsqlSession, Tap, key_row,  # noqa: E402
                     new_key, provider_calls, quote, send_and_keep, sql_value,
                     waiting_backends, wait_until)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
# A bound on a hang, far above the need (the flow ends in a few seconds).
BOUND = 30
# The recovery job never runs within the test: only the worker can finish.
NO_RECOVERY = {"IDEM_RECOVERY_AFTER_SECONDS": 3600,
               "IDEM_RECOVERY_INTERVAL_SECONDS": 3600,
               "IDEM_PROVIDER_TIMEOUT_MS": 10000, "IDEM_LEASE_SECONDS": 30}


def scenario(name):
    return only is None or only == name


def body(recipient):
    return {"amount": 4200, "currency": "EUR", "recipient": recipient}


def eventually(cond, bound=BOUND):
    """True once cond() is; False if it is not within the bound."""
    try:
        wait_until(cond, "the condition", timeout=bound, interval=0.05)
        return True
    except TimeoutError:
        return False


def payments_of(key):
    return int(sql_value(f"select count(*) from payments where idem_key = {quote(key)}"))


def check_finished(api, provider, key, recipient, what):
    done = eventually(lambda: key_row(key)["status"] == "done")
    t.ok(done, f"{what}: the key is done without its client, long before the "
         "recovery job's delay", key_row(key))
    charges = provider.charges(f"shop-1:{key}")
    t.ok(len(charges) == 1 and provider_calls(f"shop-1:{key}") == 1,
         f"{what}: one charge at the provider, one call", charges)
    row = key_row(key)
    t.ok(row["status_code"] == "201" and charges and
         f'"charge_id":"{charges[0]["charge_id"]}"' in (row["response"] or ""),
         f"{what}: saved as 201 with the provider's charge", row)
    t.eq(payments_of(key), 1, f"{what}: one payment row")
    retry = api.post("/v1/payments", body(recipient), key=key)
    t.ok(retry.status == 201 and retry.replayed and charges and
         retry.json()["charge_id"] == charges[0]["charge_id"],
         f"{what}: a retry gets the 201 replay naming the one charge", retry)


if scenario("call"):
    provider = Provider(port=19061, IDEM_PROVIDER_LATENCY_MS=2000).start()
    api = Api(port=19062, IDEM_PROVIDER_URL=provider.url, **NO_RECOVERY).start()
    key, recipient = new_key("leaves-call"), new_key("acc")
    s = send_and_keep(api.port, "/v1/payments", body(recipient), key)
    wait_until(lambda: provider_calls(f"shop-1:{key}") == 1,
               "the provider to have the request", timeout=BOUND)
    t.eq(key_row(key)["status"], "in_progress", "call: the provider thinks; the key "
         "is in progress")
    s.close()
    check_finished(api, provider, key, recipient, "call")
    log = api.read_log()
    t.ok(f"the client of shop-1:{key} left in 'call the provider'" in log and
         f"shop-1:{key}, whose client left, completed with status 201" in log,
         "call: the worker said it took the flow over and finished it")
    api.stop()
    provider.stop()

if scenario("settle"):
    provider = Provider(port=19063, IDEM_PROVIDER_LATENCY_MS=0).start()
    api = Api(port=19064, IDEM_PROVIDER_URL=provider.url, **NO_RECOVERY).start()
    key, recipient = new_key("leaves-settle"), new_key("acc")
    lock = PsqlSession()
    lock.run("begin; lock table payments in share mode;")
    try:
        s = send_and_keep(api.port, "/v1/payments", body(recipient), key)
        wait_until(lambda: waiting_backends("%lease_complete(%") == 1,
                   "lease_complete() to wait on the payments table", timeout=BOUND)
        s.close()
        wait_until(lambda: f"the client of shop-1:{key} left in 'settle: save the "
                   "outcome'" in api.read_log(), "the worker to take the flow over",
                   timeout=BOUND)
        t.eq(key_row(key)["status"], "in_progress",
             "settle: the client left while lease_complete() was held")
    finally:
        lock.run("commit;")
        lock.close()
    check_finished(api, provider, key, recipient, "settle")
    api.stop()
    provider.stop()

if scenario("queued"):
    # One pooled connection, held by A's lease_complete() on the lock: B's
    # own waits in the pool's queue for it when its client leaves (or, if
    # B's answer is not in yet when the client leaves, B is handed over
    # in its call and queues without a request: both are accepted).
    provider = Provider(port=19065, IDEM_PROVIDER_LATENCY_MS=1000).start()
    api = Api(port=19066, IDEM_PROVIDER_URL=provider.url,
              conf_extra=["workers 1", "pgsql_conn_max 1"], **NO_RECOVERY).start()
    key_a, key_b = new_key("leaves-qa"), new_key("leaves-qb")
    rcpt_a, rcpt_b = new_key("acc"), new_key("acc")
    lock = PsqlSession()
    lock.run("begin; lock table payments in share mode;")
    try:
        a = send_and_keep(api.port, "/v1/payments", body(rcpt_a), key_a)
        b = send_and_keep(api.port, "/v1/payments", body(rcpt_b), key_b)
        wait_until(lambda: provider_calls(f"shop-1:{key_b}") == 1 and
                   waiting_backends("%lease_complete(%") == 1,
                   "A's lease_complete() to hold the connection, B called",
                   timeout=BOUND)
        b.close()
        wait_until(lambda: f"the client of shop-1:{key_b} left" in api.read_log(),
                   "the worker to take B's flow over", timeout=BOUND)
    finally:
        lock.run("commit;")
        lock.close()
    t.note("; ".join(l.strip() for l in api.read_log().splitlines()
                     if f"the client of shop-1:{key_b} left" in l))
    check_finished(api, provider, key_b, rcpt_b, "queued")
    a.close()
    t.ok(eventually(lambda: key_row(key_a)["status"] == "done") and payments_of(key_a) == 1,
         "queued: A, whose client stayed until then, is done too")
    api.stop()
    provider.stop()

if scenario("reload"):
    # A reload (SIGHUP) while the flow of a client that left waits for the
    # provider: the worker holding it reloads only once it is finished.
    provider = Provider(port=19067, IDEM_PROVIDER_LATENCY_MS=2000).start()
    api = Api(port=19068, IDEM_PROVIDER_URL=provider.url,
              conf_extra=["workers 1"], **NO_RECOVERY).start()
    worker = api.workers()
    key, recipient = new_key("leaves-reload"), new_key("acc")
    s = send_and_keep(api.port, "/v1/payments", body(recipient), key)
    wait_until(lambda: provider_calls(f"shop-1:{key}") == 1,
               "the provider to have the request", timeout=BOUND)
    s.close()
    wait_until(lambda: f"the client of shop-1:{key} left" in api.read_log(),
               "the worker to take the flow over", timeout=BOUND)
    os.kill(api.proc.pid, signal.SIGHUP)
    wait_until(lambda: "work drained; reloading" in api.read_log(),
               "the worker to reload", timeout=BOUND)
    log = api.read_log()
    done_at = log.find(f"shop-1:{key}, whose client left, completed with status 201")
    t.ok("forced no reloaded" in log and 0 <= done_at < log.find("work drained; reloading"),
         "reload: the worker waited for the flow, then reloaded", log[-1500:])
    check_finished(api, provider, key, recipient, "reload")
    t.eq(api.workers(), worker, "reload: the same worker runs: none died")
    api.stop()
    provider.stop()

t.done()
