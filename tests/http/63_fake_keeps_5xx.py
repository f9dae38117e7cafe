"""The fake provider in its "saves its 500s" mode
(IDEM_FAKE_PROVIDER_KEEPS_5XX=1, for it and for the API): a 500 is kept
under its key and replayed to every later request with that key, as Stripe
API v1 does. The same reconciliation as against the Stripe mock, through
the fake provider's list of a key's generations (?prefix=1):

- a payment to "fail-twice-<r>" (its first two keys fail): 502, 502, 201, and
  one charge, under the third generation of the derived key;
- the kept 500 is replayed: the second request of a generation is never sent
  as a new one (the provider's log shows the replay);
- a refund of a charge to "refund-fail-twice-<r>": 502, 502, 201, one refund;
- a key that got an indeterminate answer and was never retried is finished
  by the recovery job, generation by generation, with one charge;
- a charge that exists although its answer was a kept 500 (the provider
  made it, then its answer broke) is found by the reconciliation and saved:
  no second charge, no new generation;
- without the mode a 500 is transient: the retry sends the same derived key.
IDEM_TEST_SCENARIO=name runs one part."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Provider, Tap, derived_key, key_row, new_key,  # noqa: E402
                     provider_calls, quote, sql, sql_value, wait_until)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
KEEP = {"IDEM_FAKE_PROVIDER_KEEPS_5XX": 1}
provider = Provider(IDEM_PROVIDER_LATENCY_MS=0, **KEEP).start()
api = Api(IDEM_PROVIDER_URL=provider.url, **KEEP).start()


def scenario(name):
    return only is None or only == name


def tail():
    return f"{random.randrange(10**9)}"


def payment(recipient, amount=10000):
    return {"amount": amount, "currency": "RUB", "recipient": recipient}


def made(what, key, client="shop-1"):
    """Charges or refunds at the provider under every generation of the key."""
    table = "provider.charges" if what == "charges" else "provider.refunds"
    rows = sql(f"select idempotency_key from {table} where"
               f" provider.of_generations({quote(derived_key(key, client=client))},"
               " idempotency_key)")
    return [r[0] for r in rows]


def generation(key, client="shop-1"):
    return sql_value("select provider_generation from idempotency_keys where "
                     f"client_id = '{client}' and idem_key = '{key}'")


if scenario("payment"):
    key = new_key("keep")
    recipient = "fail-twice-" + tail()
    seen = [api.post("/v1/payments", payment(recipient), key=key) for _ in range(3)]
    t.ok([r.status for r in seen] == [502, 502, 201],
         "fail-twice: 502, 502, then 201", seen)
    t.ok(made("charges", key) == [derived_key(key, 3)] and generation(key) == "3",
         "one charge, under the third generation", made("charges", key))
    t.ok(provider_calls(f"shop-1:{key}") == 1 and provider_calls(derived_key(key, 2)) == 1,
         "each failed generation was sent once: its 500 is not sent again")
    again = api.post("/v1/payments", payment(recipient), key=key)
    t.ok(again.status == 201 and again.replayed and again.body == seen[2].body,
         "and replayed", again)
    # The provider replays the kept 500 to its key.
    fkey = new_key("keep")
    r = api.post("/v1/payments", payment("fail"), key=fkey)
    kept = sql_value("select status from provider.kept_answers where"
                     f" idempotency_key = 'shop-1:{fkey}'")
    t.ok(r.status == 502 and kept == "500", "its 500 is kept under the key", kept)

if scenario("refund"):
    recipient = "refund-fail-twice-" + tail()
    paid = api.post("/v1/payments", payment(recipient), key=new_key("keep-pay"))
    assert paid.status == 201, paid
    key = new_key("keep-refund")
    body = {"payment_id": paid.json()["payment_id"], "amount": 4000}
    seen = [api.post("/v1/refunds", body, key=key) for _ in range(3)]
    t.ok([r.status for r in seen] == [502, 502, 201] and
         made("refunds", key) == [derived_key(key, 3)],
         "a refund: 502, 502, 201, one refund under the third generation",
         (seen, made("refunds", key)))

if scenario("recovery"):
    rec = Api(name="api-recovery", IDEM_PROVIDER_URL=provider.url,
              IDEM_RECOVERY_AFTER_SECONDS=1, IDEM_RECOVERY_INTERVAL_SECONDS=1,
              IDEM_RECOVERY_BACKOFF_SECONDS=1, **KEEP).start()
    key = new_key("keep-rec")
    r = rec.post("/v1/payments", payment("fail-twice-" + tail()), key=key)
    t.eq(r.status, 502, "the client's one attempt: 502")
    wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it",
               timeout=30)
    t.ok(key_row(key)["status_code"] == "201" and made("charges", key) ==
         [derived_key(key, 3)], "the recovery job reconciles, generation by generation: "
         "one charge", made("charges", key))
    rec.stop()

if scenario("found"):
    # A charge made under the key whose answer was a kept 500 (made, then
    # broken): the reconciliation finds it, saves it, sends nothing new.
    key = new_key("keep-found")
    recipient = "fail"
    r = api.post("/v1/payments", payment(recipient), key=key)
    sql(f"insert into provider.charges (idempotency_key, amount, currency, recipient)"
        f" values ('shop-1:{key}', 10000, 'RUB', '{recipient}')")
    again = api.post("/v1/payments", payment(recipient), key=key)
    t.ok(r.status == 502 and again.status == 201 and not again.replayed and
         made("charges", key) == [f"shop-1:{key}"] and generation(key) == "1" and
         provider_calls(f"shop-1:{key}") == 1,
         "the charge made under a kept 500 is found and saved; nothing sent again",
         (r, again))

if scenario("not-kept"):
    plain = Provider(name="provider-plain", IDEM_PROVIDER_LATENCY_MS=0).start()
    papi = Api(name="api-plain", IDEM_PROVIDER_URL=plain.url).start()
    key = new_key("plain")
    recipient = "fail-twice-" + tail()
    seen = [papi.post("/v1/payments", payment(recipient), key=key) for _ in range(2)]
    t.ok([r.status for r in seen] == [502, 502] and generation(key) == "1" and
         provider_calls(f"shop-1:{key}") == 2,
         "without the mode a 500 is transient: the same derived key again", seen)
    papi.stop()
    plain.stop()

api.stop()
provider.stop()
t.done()
