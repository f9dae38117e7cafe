"""POST /v1/refunds, the lease strategy's second operation, and
GET /v1/payments/{payment_id}: a refund of a succeeded payment through the
fake provider's POST /v1/refunds with the derived key; replays and
mismatches; refusals before the key is taken (another client's payment,
more than is left, more than fits beside refunds in flight); two
concurrent refunds that together exceed the payment; concurrent
duplicates; the provider's refusal (saved, the hold freed) and failure
(the hold kept); and a refund whose API was killed with SIGKILL mid-call,
finished once by the recovery job, and once by the client's retry."""

import os
import sys
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, Api, Background, Provider, PsqlSession, Tap, concurrently,  # noqa: E402
                     key_row, new_key, provider_calls, quote, request, sql, sql_value,
                     wait_until, waiting_backends)

t = Tap()
provider = Provider(IDEM_PROVIDER_LATENCY_MS=1000, IDEM_PROVIDER_TIMEOUT_MS=3000).start()
env = {"IDEM_PROVIDER_URL": provider.url, "IDEM_LEASE_SECONDS": 4,
       "IDEM_PROVIDER_TIMEOUT_MS": 3000}
api = Api(**env).start()


def refunds_at_provider(key, client="shop-1"):
    """The refunds the provider made under the key derived from key."""
    r = request(provider.port, "GET", "/v1/refunds?idempotency_key=" +
                urllib.parse.quote(f"{client}:{key}", safe=""))
    return r.json()["refunds"]


def pay(recipient, amount=10000):
    r = api.post("/v1/payments", {"amount": amount, "currency": "RUB",
                                  "recipient": recipient}, key=new_key("pay"))
    assert r.status == 201, r
    return r.json()


def refund(payment, amount, key, **kw):
    return api.post("/v1/refunds", {"payment_id": payment["payment_id"], "amount": amount,
                                    **kw.pop("extra", {})}, key=key, **kw)


def problem(r):
    return r.json()["type"].rsplit("/", 1)[-1] if r.body else None


def refund_rows(payment):
    return sql("select status, amount from refunds where payment_id ="
               f" {payment['payment_id']} order by refund_id")


# A refund and its replay.
a = pay(new_key("acc"))
key = new_key("ref")
first = refund(a, 4000, key, extra={"reason": "damaged"})
t.eq(first.status, 201, "a refund of a succeeded payment is created")
body = first.json()
t.ok(isinstance(body["refund_id"], int) and body["payment_id"] == a["payment_id"] and
     body["provider_refund_id"].startswith("re_") and body["amount"] == 4000 and
     body["status"] == "succeeded" and len(body) == 5,
     "201 body: refund_id, payment_id, provider_refund_id, amount, status", first)
made = refunds_at_provider(key)
t.ok(len(made) == 1 and made[0]["refund_id"] == body["provider_refund_id"] and
     made[0]["charge_id"] == a["charge_id"] and made[0]["amount"] == 4000,
     "the provider made one refund of the payment's charge under shop-1:<key>", made)
again = refund(a, 4000, key, extra={"reason": "damaged"})
t.ok(again.status == 201 and again.replayed and again.body == first.body,
     "a retry gets the first response byte for byte", again)
r = refund(a, 3000, key, extra={"reason": "damaged"})
t.ok(r.status == 422 and problem(r) == "idempotency-key-reused",
     "same key, other amount: 422", r)
r = refund(a, 4000, key, extra={"reason": "other"})
t.ok(r.status == 422 and problem(r) == "idempotency-key-reused",
     "same key, other reason: 422", r)
t.eq(provider_calls(f"shop-1:{key}", "refund"), 1, "the retries called the provider no more")

# The payment read.
r = api.get(f"/v1/payments/{a['payment_id']}")
t.eq(r.status, 200, "GET /v1/payments/{id}: 200")
t.eq(r.json(), {"payment_id": a["payment_id"], "charge_id": a["charge_id"],
                "status": "succeeded", "amount": 10000, "currency": "RUB",
                "refunded": 4000, "refunds": [{"refund_id": body["refund_id"],
                                               "amount": 4000, "status": "succeeded"}]},
     "the payment with its refund")
r = api.get(f"/v1/payments/{a['payment_id']}", client="shop-2")
t.ok(r.status == 404 and problem(r) == "payment-not-found",
     "another client's payment is not found", r)
r = api.get("/v1/payments/9007199254740991")
t.ok(r.status == 404 and problem(r) == "payment-not-found", "an unknown payment: 404", r)
for bad in ("abc", "0", "-1", "017", "9007199254740992", "1.5", "%31"):
    r = api.get(f"/v1/payments/{bad}", bad=True)
    t.ok(r.status == 400 and problem(r) == "invalid-request",
         f"GET /v1/payments/{bad}: 400", r)

# Refusals before the key is taken: nothing held, nothing at the provider.
for client, amount, payment, status, kind, what in (
        ("shop-2", 100, a, 404, "payment-not-found", "another client's payment"),
        ("shop-1", 100, {"payment_id": 9007199254740991}, 404, "payment-not-found",
         "an unknown payment"),
        ("shop-1", 6001, a, 422, "refund-exceeds-payment", "more than is left (6000)")):
    k = new_key("ref")
    r = api.post("/v1/refunds", {"payment_id": payment["payment_id"], "amount": amount},
                 key=k, client=client)
    t.ok(r.status == status and problem(r) == kind and not r.replayed,
         f"{what}: {status} {kind}", r)
    t.ok(key_row(k, client) is None and provider_calls(f"{client}:{k}", "refund") == 0,
         f"{what}: no key row, no provider call")
t.eq(refund_rows(a), [["succeeded", "4000"]], "and nothing held")
r = api.post("/v1/refunds", {"payment_id": a["payment_id"], "amount": 6001}, key=key + "x")
t.eq(r.json().get("refunded"), 4000, "refund-exceeds-payment says what is refunded")
rest = refund(a, 6000, key + "x")
t.ok(rest.status == 201 and not rest.replayed,
     "the same key, corrected to what is left, is a new refund", rest)
t.eq(api.get(f"/v1/payments/{a['payment_id']}").json()["refunded"], 10000,
     "the payment is refunded in full")
for bad, what in (({"amount": 100}, "no payment_id"),
                  ({"payment_id": "1", "amount": 100}, "a string payment_id"),
                  ({"payment_id": 0, "amount": 100}, "payment_id 0"),
                  ({"payment_id": a["payment_id"], "amount": 0}, "amount 0"),
                  ({"payment_id": a["payment_id"], "amount": 1.5}, "a float amount"),
                  ({"payment_id": a["payment_id"], "amount": 1, "reason": 7},
                   "a number as reason")):
    k = new_key("ref")
    r = api.post("/v1/refunds", bad, key=k, bad=True)
    t.ok(r.status == 400 and problem(r) == "invalid-request" and key_row(k) is None,
         f"{what}: 400, no key row", r)

# Two refunds of 6000 of one 10000 payment at once: the second is admitted
# only after the first's hold is committed, and does not fit beside it.
b = pay(new_key("acc"))
k1, k2 = new_key("ref"), new_key("ref")
runs = [Background(refund, b, 6000, k) for k in (k1, k2)]
answers = [x.wait() for x in runs]
statuses = sorted(x.status for x in answers)
t.eq(statuses, [201, 409], "two concurrent refunds of 6000 of 10000: one 201, one 409")
won = next(x for x in answers if x.status == 201)
lost = next(x for x in answers if x.status == 409)
lost_key = (k1, k2)[answers.index(lost)]
t.ok(problem(lost) == "refund-in-progress" and lost.json()["pending"] == 6000,
     "the 409: refund-in-progress, with what is pending", lost)
t.ok(1 <= int(lost.headers.get("retry-after", "0")) <= 3,
     "Retry-After: until the first refund's provider call gives up (3 s), at most",
     lost.headers)
t.ok(key_row(lost_key) is None and provider_calls(f"shop-1:{lost_key}", "refund") == 0,
     "the refused one took no key and called no provider")
r = refund(b, 6000, lost_key)
t.ok(r.status == 422 and problem(r) == "refund-exceeds-payment",
     "its retry once the first has succeeded: 422 refund-exceeds-payment", r)
t.eq(int(sql_value("select count(*) from provider.refunds where charge_id ="
                   f" {quote(b['charge_id'])}")), 1, "one refund at the provider")
t.eq(refund_rows(b), [["succeeded", "6000"]], "one refund in the ledger")
t.ok(won.json()["amount"] == 6000, "the winner refunded 6000", won)

# The same race, forced: a psql session holds the refunds table, so that
# both refunds reach their admit before either can insert its hold. Only
# the lock of the payment's row keeps the second from reading the payment
# as it was before the first's hold.
b2 = pay(new_key("acc"))
k1, k2 = new_key("ref"), new_key("ref")
lock = PsqlSession()
lock.run("begin; lock table refunds in share mode;")
runs = [Background(refund, b2, 6000, k) for k in (k1, k2)]
wait_until(lambda: waiting_backends("%lease_reserve_v2(%") == 2,
           "both refunds to wait in their admit")
lock.run("commit;")
lock.close()
answers = [x.wait() for x in runs]
t.eq(sorted(x.status for x in answers), [201, 409],
     "forced together, two refunds of 6000 of 10000: still one 201 and one 409")
t.eq(int(sql_value("select count(*) from provider.refunds where charge_id ="
                   f" {quote(b2['charge_id'])}")), 1, "and one refund at the provider")

# Concurrent duplicates of one refund: one executes, the others get 409.
c = pay(new_key("acc"))
key = new_key("ref")
dups = concurrently(5, refund, c, 2500, key)
t.eq(sorted(x.status for x in dups), [201, 409, 409, 409, 409],
     "5 concurrent duplicates: one 201, four 409")
t.ok(all(problem(x) == "request-in-progress" for x in dups if x.status == 409),
     "the 409s are request-in-progress")
r = refund(c, 2500, key)
t.ok(r.status == 201 and r.replayed and r.body == next(x.body for x in dups
                                                        if x.status == 201),
     "a later retry replays the one refund", r)
t.eq(len(refunds_at_provider(key)), 1, "one refund at the provider")
t.eq(refund_rows(c), [["succeeded", "2500"]], "one refund in the ledger")

# The provider refuses for good: a saved 422, and the hold is freed.
d = pay("refund-reject")
key = new_key("ref")
r = refund(d, 1000, key)
t.ok(r.status == 422 and problem(r) == "refund-rejected",
     "the provider refuses: 422 refund-rejected", r)
replay = refund(d, 1000, key)
t.ok(replay.status == 422 and replay.replayed and replay.body == r.body,
     "saved and replayed", replay)
t.eq(provider_calls(f"shop-1:{key}", "refund"), 1, "and never sent again")
t.eq(refund_rows(d), [["rejected", "1000"]], "the refund is rejected")
read = api.get(f"/v1/payments/{d['payment_id']}").json()
t.ok(read["refunded"] == 0 and read["refunds"][0]["status"] == "rejected",
     "the read shows it rejected, nothing refunded", read)
r = refund(d, 10000, new_key("ref"))
t.ok(r.status == 422 and problem(r) == "refund-rejected",
     "the whole amount is free again: the next refund reaches the provider", r)

# The provider fails: 502, nothing saved, and the hold stays while the
# refund is unfinished.
e = pay("refund-fail")
key = new_key("ref")
r = refund(e, 6000, key)
t.ok(r.status == 502 and problem(r) == "provider-unavailable", "the provider fails: 502", r)
t.ok(key_row(key)["status"] == "in_progress" and not key_row(key)["leased"],
     "the key stays in progress, its lease released")
t.eq(refund_rows(e), [["pending", "6000"]], "the hold stays")
r = refund(e, 6000, new_key("ref"))
t.ok(r.status == 409 and problem(r) == "refund-in-progress",
     "a second 6000 meanwhile: 409 refund-in-progress", r)
t.eq(api.get(f"/v1/payments/{e['payment_id']}").json()["refunds"],
     [{"refund_id": int(sql_value("select refund_id from refunds where idem_key ="
                                  f" {quote(key)}")), "amount": 6000,
       "status": "pending"}], "the read shows it pending")

# SIGKILL while the provider makes the refund; nobody retries: the
# recovery job finishes it with the same derived key.
f = pay(new_key("acc"))
key = new_key("ref")
lost = Background(refund, f, 3000, key)
wait_until(lambda: refunds_at_provider(key), "the provider to record the refund")
api.kill9()
t.ok(lost.cut(), "the client got no answer")
t.eq(key_row(key)["status"], "in_progress", "the refund is left in progress")
t.eq(refund_rows(f), [["pending", "3000"]], "with its amount held")
recovering = Api(port=api.port, name="api-recovery", IDEM_RECOVERY_AFTER_SECONDS=1,
                 IDEM_RECOVERY_INTERVAL_SECONDS=1, IDEM_RECOVERY_BACKOFF_SECONDS=60,
                 **env).start()
wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it",
           timeout=JOB_BOUND)
made = refunds_at_provider(key)
t.eq(len(made), 1, "the provider still holds one refund")
t.ok(f'"provider_refund_id":"{made[0]["refund_id"]}"' in key_row(key)["response"],
     "the saved response names it", key_row(key)["response"])
t.eq(refund_rows(f), [["succeeded", "3000"]], "the ledger matches the provider")
wait_until(lambda: f"recovery: shop-1:{key} completed with status 201"
           in recovering.read_log(), "the recovery to be logged")
r = recovering.post("/v1/refunds", {"payment_id": f["payment_id"], "amount": 3000}, key=key)
t.ok(r.status == 201 and r.replayed and
     r.json()["provider_refund_id"] == made[0]["refund_id"],
     "a late retry gets the recovered refund", r)
recovering.kill9()

# SIGKILL again; this time the client retries after the lease: it takes
# the refund over, and the provider answers with the refund it made.
api = Api(port=api.port, name="api-2", **env).start()
g = pay(new_key("acc"))
key = new_key("ref")
lost = Background(api.post, "/v1/refunds", {"payment_id": g["payment_id"],
                                            "amount": 10000}, key=key)
wait_until(lambda: refunds_at_provider(key), "the provider to record the refund")
api.kill9()
t.ok(lost.cut(), "the client got no answer")
api = Api(port=api.port, name="api-3", **env).start()
r = refund(g, 10000, key)
t.ok(r.status == 409 and problem(r) == "request-in-progress",
     "a retry while the dead worker's lease holds: 409", r)
wait_until(lambda: not key_row(key)["leased"], "the lease to end")
r = refund(g, 10000, key)
made = refunds_at_provider(key)
t.ok(r.status == 201 and not r.replayed and
     r.json()["provider_refund_id"] == made[0]["refund_id"],
     "the retry after the lease takes it over: 201 with the provider's refund", r)
t.eq(len(made), 1, "one refund at the provider")
t.eq(refund_rows(g), [["succeeded", "10000"]], "one refund in the ledger")

api.stop()
provider.stop()
t.done()
