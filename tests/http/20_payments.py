"""POST /v1/payments, the lease strategy, against the fake provider: the
first charge, replays, mismatches, the key scope, a duplicate while the
first runs, declines, provider failures and timeouts (and the provider's
409 for a key it still processes after a timeout), and the start-up
check of the lease against the provider timeout."""

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, ROOT, TMP, Api, Background, Provider, Tap,  # noqa: E402
                     charges_to, concurrently, key_row, new_key, provider_calls, quote,
                     send_and_keep, sql_value, wait_until)

t = Tap()
# The provider thinks a second: the window in which a duplicate finds the
# first request still running. Knowing the API's timeout, it thinks 5 s
# for recipient "slow".
provider = Provider(IDEM_PROVIDER_LATENCY_MS=1000, IDEM_PROVIDER_TIMEOUT_MS=3000).start()
api = Api(IDEM_PROVIDER_URL=provider.url, IDEM_LEASE_SECONDS=4,
          IDEM_PROVIDER_TIMEOUT_MS=3000).start()


def payment(recipient, amount=10000, **extra):
    return dict({"amount": amount, "currency": "RUB", "recipient": recipient}, **extra)


# The first request and its replay.
key = new_key("pay")
body = payment("acc-first", purpose="order 17", sent_at="2026-11-30T10:00:00Z")
first = api.post("/v1/payments", body, key=key)
t.eq(first.status, 201, "a payment is created")
p = first.json()
t.ok(isinstance(p["payment_id"], int) and p["charge_id"].startswith("ch_") and
     p["status"] == "succeeded" and p["amount"] == 10000 and p["currency"] == "RUB",
     "201 body: payment_id, charge_id, status, amount, currency", first)
charges = provider.charges(f"shop-1:{key}")
t.eq([c["charge_id"] for c in charges], [p["charge_id"]],
     "the provider holds one charge under the derived key shop-1:<key>")
t.eq(sql_value(f"select charge_id from payments where idem_key = {quote(key)}"),
     p["charge_id"], "the payment row holds the provider's charge")

again = api.post("/v1/payments", dict(body, sent_at="2026-11-30T10:00:11Z"), key=key)
t.ok(again.status == 201 and again.replayed and again.body == first.body,
     "a retry (another sent_at) gets the first response byte for byte", again)
t.eq(charges_to("acc-first"), 1, "and makes no second charge")

r = api.post("/v1/payments", dict(body, amount=50000), key=key)
t.ok(r.status == 422 and r.json()["type"].endswith("/idempotency-key-reused"),
     "same key, other amount: 422", r)
r = api.post("/v1/payments", dict(body, purpose="order 18"), key=key)
t.eq(r.status, 422, "same key, other purpose: 422")
t.eq(charges_to("acc-first"), 1, "the mismatches charged nothing")

other = api.post("/v1/payments", body, key=key, client="shop-2")
t.ok(other.status == 201 and not other.replayed and
     other.json()["charge_id"] != p["charge_id"], "same key from shop-2: its own payment", other)
t.eq(len(provider.charges(f"shop-2:{key}")), 1, "charged under shop-2's derived key")
t.eq(charges_to("acc-first"), 2, "one charge per client")

# A duplicate while the first is at the provider: 409, nothing saved.
key = new_key("pay")
running = Background(api.post, "/v1/payments", payment("acc-dup"), key=key)
wait_until(lambda: provider.charges(f"shop-1:{key}"), "the provider to record the charge")
dup = api.post("/v1/payments", payment("acc-dup"), key=key)
t.eq(dup.status, 409, "a duplicate while the first runs: 409")
t.ok(dup.json()["type"].endswith("/request-in-progress"), "request-in-progress problem", dup)
t.ok(1 <= int(dup.headers.get("retry-after", "0")) <= 3,
     "with Retry-After until the first one's provider call gives up", dup.headers)
done = running.wait()
t.eq(done.status, 201, "the first finishes with 201")
after = api.post("/v1/payments", payment("acc-dup"), key=key)
t.ok(after.status == 201 and after.replayed and after.body == done.body,
     "the duplicate's retry afterwards gets the first's response", after)
t.eq(charges_to("acc-dup"), 1, "one charge")

# Retry-After says when a retry can next succeed: when the holder's
# provider call gives up (here after 3 s), not when its lease ends (30 s).
api30 = Api(name="api-lease-30", IDEM_PROVIDER_URL=provider.url, IDEM_LEASE_SECONDS=30,
            IDEM_PROVIDER_TIMEOUT_MS=3000).start()
key = new_key("pay")
running = Background(api30.post, "/v1/payments", payment("acc-retry-after"), key=key)
wait_until(lambda: provider.charges(f"shop-1:{key}"), "the provider to record the charge")
dup = api30.post("/v1/payments", payment("acc-retry-after"), key=key)
after = int(dup.headers.get("retry-after", "0"))
t.ok(dup.status == 409 and 1 <= after <= 3,
     "lease 30 s, provider timeout 3 s: a duplicate gets Retry-After of at most 3",
     (dup, dup.headers))
time.sleep(after)
again = api30.post("/v1/payments", payment("acc-retry-after"), key=key)
t.ok(again.status == 201 and again.replayed and again.body == running.wait().body,
     "and a retry that waits that long gets the payment", again)
api30.stop()

# Twenty at once: one charge.
key = new_key("pay")
answers = concurrently(20, api.post, "/v1/payments", payment("acc-twenty"), key=key)
statuses = [r.status for r in answers]
t.ok(statuses.count(201) >= 1 and set(statuses) <= {201, 409},
     "20 duplicates at once: 201s and 409s only", statuses)
t.eq(sum(1 for r in answers if r.status == 201 and not r.replayed), 1,
     "exactly one executed the payment")
t.eq(charges_to("acc-twenty"), 1, "exactly one charge at the provider")

# A decline is an outcome: saved and replayed.
key = new_key("pay")
declined = api.post("/v1/payments", payment("decline"), key=key)
t.eq(declined.status, 402, "a declined card: 402")
t.ok(declined.json()["type"].endswith("/problems/card-declined") and
     declined.headers["content-type"] == "application/problem+json",
     "card-declined problem", declined)
again = api.post("/v1/payments", payment("decline"), key=key)
t.ok(again.status == 402 and again.replayed and again.body == declined.body,
     "the decline is replayed, not retried at the provider", again)
t.eq(key_row(key)["status_code"], "402", "the key holds the saved 402")
t.eq(provider.charges(f"shop-1:{key}"), [], "no charge")

# A provider error: 502, nothing saved, the lease released at once.
key = new_key("pay")
failed = api.post("/v1/payments", payment("fail"), key=key)
t.ok(failed.status == 502 and failed.json()["type"].endswith("/provider-unavailable"),
     "the provider answers 500: 502 provider-unavailable", failed)
row = key_row(key)
t.ok(row["status"] == "in_progress" and row["response"] is None and not row["leased"],
     "nothing saved and the lease released", row)
again = api.post("/v1/payments", payment("fail"), key=key)
t.eq(again.status, 502, "an immediate retry goes to the provider again (not 409)")
t.eq(key_row(key)["lease_id"], 2, "the retry took the key with the next lease")

# The provider is down, then back: the retry goes through, one charge.
key = new_key("pay")
provider.stop()
down = api.post("/v1/payments", payment("acc-down"), key=key)
t.ok(down.status == 502 and down.json()["type"].endswith("/provider-unavailable"),
     "the provider unreachable: 502", down)
t.ok(not key_row(key)["leased"], "the lease released")
provider = Provider(port=provider.port, name="provider-2",
                    IDEM_PROVIDER_LATENCY_MS=1000, IDEM_PROVIDER_TIMEOUT_MS=3000).start()
up = api.post("/v1/payments", payment("acc-down"), key=key)
t.eq(up.status, 201, "the retry after the provider is back: 201")
t.eq(len(provider.charges(f"shop-1:{key}")), 1, "one charge under the derived key")

# A provider slower than the timeout: 504. The provider still works on the
# charge it recorded, so an immediate retry (the same derived key) gets its
# 409, passed on with its Retry-After; once the provider has finished, the
# retry gets the charge it made: one charge.
key = new_key("pay")
slow = api.post("/v1/payments", payment("slow", amount=777), key=key)
t.ok(slow.status == 504 and slow.json()["type"].endswith("/provider-timeout"),
     "the provider does not answer in time: 504", slow)
t.ok(not key_row(key)["leased"] and key_row(key)["response"] is None,
     "nothing saved and the lease released", key_row(key))
made = provider.charges(f"shop-1:{key}")
t.eq(len(made), 1, "the provider did make the charge it is still thinking about")
busy = api.post("/v1/payments", payment("slow", amount=777), key=key)
# The provider finishes 5 s after the charge: a retry that comes later than
# that (a loaded machine) rightly gets the charge it made instead of its
# 409; both are the service's right answers, and either way one charge.
if busy.status == 201:
    t.ok(busy.json()["charge_id"] == made[0]["charge_id"],
         "an immediate retry, once the provider had finished: 201 with that charge", busy)
    t.eq(len(provider.charges(f"shop-1:{key}")), 1,
         "one charge (no 409 to see: the provider had finished before the retry)")
    t.ok(key_row(key)["status"] == "done", "saved", key_row(key))
    retry_after = 0
else:
    t.ok(busy.status == 409 and busy.json()["type"].endswith("/request-in-progress"),
         "an immediate retry: the provider still processes the key, 409", busy)
    t.ok(1 <= int(busy.headers.get("retry-after", "0")) <= 3,
         "with Retry-After: when the provider will have finished (5 s after the charge)",
         busy.headers)
    t.ok(not key_row(key)["leased"] and key_row(key)["response"] is None,
         "nothing saved and the lease released again", key_row(key))
    retry_after = int(busy.headers["retry-after"])
time.sleep(retry_after)
retry = api.post("/v1/payments", payment("slow", amount=777), key=key)
t.ok(retry.status == 201 and retry.json()["charge_id"] == made[0]["charge_id"],
     "a retry after Retry-After gets 201 with that same charge", retry)
t.eq(len(provider.charges(f"shop-1:{key}")), 1,
     "the provider's ledger holds exactly one charge for shop-1:<key>")

# A client that hangs up while the provider thinks does not stop its
# payment: the worker finishes the flow without it (src/lease/handoff.c),
# and the retry gets the saved 201 naming the one charge
# (tests/http/68_client_leaves.py has the other moments to leave).
# It hangs up once the provider has the call, its answer never read.
key = new_key("pay")
s = send_and_keep(api.port, "/v1/payments", payment("acc-hangup"), key)
wait_until(lambda: provider_calls(f"shop-1:{key}") == 1, "the provider to have the call")
s.close()
wait_until(lambda: key_row(key) is not None and key_row(key)["status"] == "done",
           "the worker to finish the payment without its client")
retry = api.post("/v1/payments", payment("acc-hangup"), key=key)
t.ok(retry.status == 201 and retry.replayed and
     retry.json()["charge_id"] == provider.charges(f"shop-1:{key}")[0]["charge_id"],
     "the retry gets the saved 201, with the provider's charge", retry)
t.eq(charges_to("acc-hangup"), 1, "with one charge")

# Bad input takes no key and charges nothing.
key = new_key("pay")
for bad, what in [({"amount": 100, "currency": "RUB"}, "no recipient"),
                  (payment("acc-bad", amount=1.5), "fractional amount"),
                  (payment("acc-bad", currency="rub"), "lower-case currency"),
                  (payment("acc-bad", purpose=5), "numeric purpose")]:
    r = api.post("/v1/payments", bad, key=key, bad=True)
    t.ok(r.status == 400 and r.json()["type"].endswith("/invalid-request"),
         f"{what}: 400", r)
t.ok(key_row(key) is None and charges_to("acc-bad") == 0, "no key taken, no charge")
t.eq(api.post("/v1/payments", payment("acc-bad"), key=key).status, 201,
     "the same key then works")

api.stop()
provider.stop()

# Without IDEM_PROVIDER_URL, the API finds the provider at
# IDEM_PROVIDER_PORT (make run with both ports moved).
moved = Provider(name="provider-moved").start()
api = Api(name="api-moved", IDEM_PROVIDER_PORT=moved.port).start()
key = new_key()
r = api.post("/v1/payments", {"amount": 100, "currency": "RUB", "recipient": "acc-moved"},
             key=key)
t.ok(r.status == 201 and len(moved.charges(f"shop-1:{key}")) == 1,
     "the provider on IDEM_PROVIDER_PORT is the one charged", r)
api.stop()
moved.stop()

# A lease that does not outlast the provider timeout is refused at start.
env = dict(os.environ, IDEM_LEASE_SECONDS="5", IDEM_PROVIDER_TIMEOUT_MS="5000",
           IDEM_PORT="1")
conf = os.path.join(TMP, "refused.conf")
with open(os.path.join(ROOT, "kore.conf")) as f:
    text = f.read().replace("load ./app.so", f"load {ROOT}/app.so")
with open(conf, "w") as f:
    f.write(text.replace("pidfile kore.pid", f"pidfile {TMP}/refused.pid"))
out = subprocess.run(["kore", "-fnrc", conf], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=COMMAND_BOUND)
t.ok(out.returncode != 0, "kore refuses to start with lease 5 s and timeout 5000 ms")
t.ok("IDEM_LEASE_SECONDS" in out.stdout + out.stderr and
     "IDEM_PROVIDER_TIMEOUT_MS" in out.stdout + out.stderr,
     "with a message naming both settings", out.stdout + out.stderr)

t.done()
