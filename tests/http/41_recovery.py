"""Recovery of abandoned payments: the API is killed while the provider
call is in flight and the client never retries; the recovery job takes the
payment over, gets the provider's charge with the same derived key, and
saves it, so that a later retry gets the real result. A payment released
after a provider failure is finished the same way, charging it then; while
the provider keeps failing, the job backs off that payment. A key of a lease
operation this build does not know (an instance of a rolling deploy) is left
to an instance that knows it."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, Api, Background, Provider, StubProvider, Tap, charges_to,  # noqa: E402
                     key_row, new_key, quote, request, sql, sql_value, wait_until)

t = Tap()
provider = Provider(IDEM_PROVIDER_LATENCY_MS=1500).start()
env = {"IDEM_PROVIDER_URL": provider.url, "IDEM_LEASE_SECONDS": 4,
       "IDEM_PROVIDER_TIMEOUT_MS": 3000, "IDEM_RECOVERY_AFTER_SECONDS": 1,
       "IDEM_RECOVERY_INTERVAL_SECONDS": 1, "IDEM_RECOVERY_BACKOFF_SECONDS": 1,
       "IDEM_RECOVERY_BACKOFF_MAX_SECONDS": 2}
api = Api(**env).start()


def recovered(a):
    text = request(a.port, "GET", "/metrics").body.decode()
    return int(re.search(r"^idem_payments_recovered_total (\d+)$", text, re.M).group(1))


# The API dies after the provider charged; nobody retries.
key, rcpt = new_key("rec"), new_key("acc")
lost = Background(api.post, "/v1/payments",
                  {"amount": 2500, "currency": "EUR", "recipient": rcpt}, key=key)
wait_until(lambda: charges_to(rcpt) == 1, "the provider to record the charge")
api.kill9()
t.ok(lost.cut(), "the client got no answer")
t.eq(key_row(key)["status"], "in_progress", "the payment is left in progress")

api = Api(port=api.port, name="api-after-crash", **env).start()
wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it")
charge = provider.charges(f"shop-1:{key}")[0]["charge_id"]
row = key_row(key)
t.eq(row["status_code"], "201", "recovered as 201")
t.ok(f'"charge_id":"{charge}"' in row["response"], "with the charge the provider made",
     row["response"])
t.eq(charges_to(rcpt), 1, "the provider still holds one charge")
t.eq(sql_value(f"select charge_id from payments where idem_key = {quote(key)}"), charge,
     "the payments ledger matches the provider")
# The job counts and logs a recovery just after it commits. The earlier
# tests leave no other payment for this instance to recover.
wait_until(lambda: recovered(api) >= 1, "the recovery to be counted")
t.eq(recovered(api), 1, "idem_payments_recovered_total counts it, once")
t.ok(f"recovery: shop-1:{key} completed with status 201" in api.read_log(),
     "the API logged it")

retry = api.post("/v1/payments", {"amount": 2500, "currency": "EUR", "recipient": rcpt},
                 key=key)
t.ok(retry.status == 201 and retry.replayed and retry.json()["charge_id"] == charge,
     "a late retry gets the recovered result", retry)

# The provider is down: 502, the lease released; the client gives up. When
# the provider is back, the recovery job makes the charge.
key, rcpt = new_key("rec"), new_key("acc")
provider.stop()
down = api.post("/v1/payments", {"amount": 900, "currency": "RUB", "recipient": rcpt}, key=key)
t.eq(down.status, 502, "the provider down: 502")
provider = Provider(port=provider.port, name="provider-back",
                    IDEM_PROVIDER_LATENCY_MS=1500).start()
wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it")
t.eq(charges_to(rcpt), 1, "the recovery made the one charge")
t.eq(key_row(key)["status_code"], "201", "and saved it")

api.stop()

# Ten abandoned payments, two instances recovering at once: each payment is
# recovered by one of them, and charged once.
recipients = [new_key("acc") for _ in range(10)]
for i, rcpt in enumerate(recipients):
    sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
        " status, lease_id, locked_until, request) values ('shop-2',"
        f" 'abandoned-{i}', 'payments.create', repeat('a', 64), 'in_progress', 1,"
        f" now() - interval '1 hour', '{{\"amount\":{100 + i},\"currency\":\"RUB\","
        f"\"recipient\":\"{rcpt}\"}}')")
pair = [Api(name=f"recoverer-{i}", **env).start() for i in (1, 2)]
wait_until(lambda: sql_value("select count(*) from idempotency_keys where idem_key like"
                             " 'abandoned-%' and status = 'done'") == "10",
           "two instances to recover ten payments", timeout=JOB_BOUND)
t.eq([charges_to(r) for r in recipients], [1] * 10, "each abandoned payment charged once")
wait_until(lambda: sum(recovered(a) for a in pair) >= 10, "the last recovery to be counted")
t.eq(sum(recovered(a) for a in pair), 10, "and recovered once, by one instance or the other")
for a in pair:
    a.stop()
provider.stop()

# A provider that keeps failing (503, or 409: still processing) is not
# called every round: each attempt of the job without an outcome doubles
# its wait before the next, 1, 2, 4 s, then the cap of 4 s. Once the
# provider works, the next attempt finishes the payment.
JSON = {"Content-Type": "application/json"}
failing = [(503, {}, b""), (409, {"Retry-After": "1"}, b"")]
stub = StubProvider(default=lambda n: failing[(n - 1) % 2])
api = Api(name="api-backoff", IDEM_PROVIDER_URL=stub.url, IDEM_LEASE_SECONDS=2,
          IDEM_PROVIDER_TIMEOUT_MS=1000, IDEM_RECOVERY_AFTER_SECONDS=1,
          IDEM_RECOVERY_INTERVAL_SECONDS=1, IDEM_RECOVERY_BACKOFF_SECONDS=1,
          IDEM_RECOVERY_BACKOFF_MAX_SECONDS=4).start()
key, rcpt = new_key("backoff"), new_key("acc")
derived = f"shop-1:{key}"
down = api.post("/v1/payments", {"amount": 700, "currency": "RUB", "recipient": rcpt}, key=key)
t.eq(down.status, 502, "the provider fails: 502, and the client gives up")
# The client's call, then five attempts of the job, the first at least 11 s
# ago: a window in which a job without backoff would call every second.
wait_until(lambda: len(stub.calls_of(derived)) >= 6 and
           time.monotonic() >= stub.calls_of(derived)[1][0] + 11,
           "five attempts of the job", timeout=JOB_BOUND)
times = [c[0] for c in stub.calls_of(derived)][1:]
gaps = [round(b - a, 2) for a, b in zip(times, times[1:])][:4]
t.ok(all(gap >= want - 0.2 for gap, want in zip(gaps, [1, 2, 4, 4])),
     "the job's attempts are 1, 2, 4 and 4 s apart at least, not one a round", gaps)
calls = len([c for c in times if c <= times[0] + 11])
t.ok(calls <= 5, "at most 5 provider calls in the 11 s from the job's first (not 11)",
     calls)
# Read between two attempts, while the job holds no lease on it.
row = wait_until(lambda: sql("select recovery_attempts, extract(epoch from recover_at -"
                             " locked_until)::int from idempotency_keys where idem_key ="
                             f" {quote(key)} and locked_until <= now()"), "a released row")[0]
t.ok(int(row[0]) >= 5 and row[1] == "4",
     "the key row counts the attempts, and the next waits the cap, 4 s", row)

stub.default = (201, JSON, {"charge_id": "ch_after_outage"})
wait_until(lambda: key_row(key)["status"] == "done", "the next attempt", timeout=JOB_BOUND)
row = key_row(key)
t.ok(row["status_code"] == "201" and '"charge_id":"ch_after_outage"' in row["response"],
     "once the provider works, the job finishes the payment with its charge", row)

# A lease operation the database knows and this build does not (a rolling
# deploy): the job leaves its key to an instance that knows it, neither
# holding it for a lease nor backing the knowing instance off it; it goes
# on with the keys it can run.
sql("select idem_operation('test.other-build', 'lease', 'payment_settle')")
key, mine = new_key("other-build"), new_key("mine")
sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint, status,"
    " lease_id, locked_until, request) values ('shop-1', " + quote(key) + ","
    " 'test.other-build', repeat('a', 64), 'in_progress', 1,"
    " now() - interval '20 s', '{}'), ('shop-1', " + quote(mine) + ", 'payments.create',"
    " repeat('b', 64), 'in_progress', 1, now() - interval '10 s',"
    " '{\"amount\": 300, \"currency\": \"RUB\", \"recipient\": \"acc-mine\"}')")
wait_until(lambda: key_row(mine)["status"] == "done", "the job to finish its own key",
           timeout=JOB_BOUND)
row = sql("select recovery_attempts, lease_id, locked_until < now() - interval '15 s'"
          " from idempotency_keys where idem_key = " + quote(key))[0]
t.ok(row == ["0", "1", "t"],
     "a key of an operation this build lacks is left alone (not claimed, not backed "
     "off), while the job finishes one of its own due later", row)
sql("delete from idempotency_keys where idem_key = " + quote(key))
sql("delete from idem_operations where operation = 'test.other-build'")
api.stop()
stub.stop()
t.done()
