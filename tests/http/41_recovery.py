"""Recovery of abandoned payments: the API is killed while the provider
call is in flight and the client never retries; the recovery job takes the
payment over, gets the provider's charge with the same derived key, and
saves it, so that a later retry gets the real result. A payment released
after a provider failure is finished the same way, charging it then."""

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Background, Provider, Tap, charges_to, key_row,  # noqa: E402
                     new_key, quote, request, sql, sql_value, wait_until)

t = Tap()
provider = Provider(IDEM_PROVIDER_LATENCY_MS=1500).start()
env = {"IDEM_PROVIDER_URL": provider.url, "IDEM_LEASE_SECONDS": 4,
       "IDEM_PROVIDER_TIMEOUT_MS": 3000, "IDEM_RECOVERY_AFTER_SECONDS": 1,
       "IDEM_RECOVERY_INTERVAL_SECONDS": 1}
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
# The job counts and logs a recovery just after it commits.
t.ok(wait_until(lambda: recovered(api) >= 1, "the recovery to be counted"),
     "idem_payments_recovered_total counts it")
t.ok("recovery: payment shop-1:" + key in api.read_log(), "the API logged it")

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
           "two instances to recover ten payments", timeout=60)
t.eq([charges_to(r) for r in recipients], [1] * 10, "each abandoned payment charged once")
wait_until(lambda: sum(recovered(a) for a in pair) >= 10, "the last recovery to be counted")
t.eq(sum(recovered(a) for a in pair), 10, "and recovered once, by one instance or the other")
for a in pair:
    a.stop()
provider.stop()
t.done()
