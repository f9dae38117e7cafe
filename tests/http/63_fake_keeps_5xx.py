"""The fake provider in its "saves its 500s" mode
(IDEM_FAKE_PROVIDER_KEEPS_5XX=1, for it and for the API): a 500 is kept
under its key and replayed to every later request with that key, as Stripe
API v1 does. The same reconciliation as against the Stripe mock, through
the fake provider's list of a key's generations (?prefix=1):

- a kept 500 is proven the provider's own (its problem and its
  Request-Id): the key waits out its settle window (here an hour, so that
  no retry can pass it by the machine's speed; the test ends it by hand, as
  time would): every retry meanwhile is a 503 outcome-pending with
  Retry-After, nothing sent;
- a payment to "fail-twice-<r>" (its first two keys fail): 503, 503, 201,
  and one charge, under the third generation of the derived key;
- the kept 500 is replayed: the second request of a generation is never sent
  as a new one (the provider's log shows the replay);
- a refund of a charge to "refund-fail-twice-<r>": 503, 503, 201, one refund;
- a key that got an indeterminate answer and was never retried is finished
  by the recovery job, generation by generation, with one charge, each
  generation after its settle window (a real one of a second here);
- a charge that exists although its answer was a kept 500 (the provider
  made it, then its answer broke) is found by the reconciliation and saved:
  no second charge, no new generation;
- without the mode a 500 is transient: the retry sends the same derived key.
IDEM_TEST_SCENARIO=name runs one part."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, Api, Provider, Tap, derived_key, key_row, new_key,  # noqa: E402
                     provider_calls, quote, sql, sql_value, wait_until)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
KEEP = {"IDEM_FAKE_PROVIDER_KEEPS_5XX": 1}
provider = Provider(IDEM_PROVIDER_LATENCY_MS=0, **KEEP).start()
# A bound on a hang, far above need: nothing here waits on it.
WINDOW = 3600
api = Api(IDEM_PROVIDER_URL=provider.url, IDEM_PROVIDER_SETTLE_SECONDS=WINDOW,
          **KEEP).start()


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


def pending(r):
    """A 503 outcome-pending with a Retry-After within the window."""
    try:
        after = int(r.headers.get("retry-after", "0"))
        kind = r.json().get("type", "")
    except ValueError:
        return False
    return (r.status == 503 and kind.endswith("/problems/outcome-pending") and
            1 <= after <= WINDOW)


def end_window(key, client="shop-1"):
    """The settle window passes, as time would make it."""
    sql(f"update idempotency_keys set settle_until = now() where client_id = "
        f"'{client}' and idem_key = '{key}' and settle_until > now()")


def through(send, key, tries=3):
    """A client that retries in the window: each answer, the window ended
    by hand after each outcome-pending (once the retry in it was seen)."""
    seen = []
    for _ in range(tries):
        r = send()
        seen.append(r)
        if pending(r):
            again = send()
            seen.append(again)
            end_window(key)
    return seen


def generation(key, client="shop-1"):
    return sql_value("select provider_generation from idempotency_keys where "
                     f"client_id = '{client}' and idem_key = '{key}'")


if scenario("payment"):
    key = new_key("keep")
    recipient = "fail-twice-" + tail()
    seen = through(lambda: api.post("/v1/payments", payment(recipient), key=key), key)
    t.ok(len(seen) == 5 and all(pending(r) for r in seen[:4]) and seen[4].status == 201,
         "fail-twice: 503 outcome-pending (and its retry in the window), twice, "
         "then 201", seen)
    seen = [seen[0], seen[2], seen[4]]
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
    t.ok(pending(r) and kept == "500", "its 500 is kept under the key", kept)
    calls = provider_calls(f"shop-1:{fkey}")
    inwin = [api.post("/v1/payments", payment("fail"), key=fkey) for _ in range(3)]
    t.ok(all(pending(x) for x in inwin) and provider_calls(f"shop-1:{fkey}") == calls
         and generation(fkey) == "1" and key_row(fkey)["status"] == "in_progress",
         "in its settle window every retry is a 503 outcome-pending; nothing sent",
         inwin)

if scenario("refund"):
    recipient = "refund-fail-twice-" + tail()
    paid = api.post("/v1/payments", payment(recipient), key=new_key("keep-pay"))
    assert paid.status == 201, paid
    key = new_key("keep-refund")
    body = {"payment_id": paid.json()["payment_id"], "amount": 4000}
    seen = through(lambda: api.post("/v1/refunds", body, key=key), key)
    t.ok(len(seen) == 5 and all(pending(r) for r in seen[:4]) and
         seen[4].status == 201 and made("refunds", key) == [derived_key(key, 3)],
         "a refund: 503, 503, 201, one refund under the third generation",
         (seen, made("refunds", key)))

if scenario("recovery"):
    rec = Api(name="api-recovery", IDEM_PROVIDER_URL=provider.url,
              IDEM_RECOVERY_AFTER_SECONDS=1, IDEM_RECOVERY_INTERVAL_SECONDS=1,
              IDEM_RECOVERY_BACKOFF_SECONDS=1, IDEM_PROVIDER_SETTLE_SECONDS=1,
              **KEEP).start()
    key = new_key("keep-rec")
    r = rec.post("/v1/payments", payment("fail-twice-" + tail()), key=key)
    t.ok(r.status == 503 and r.headers.get("retry-after") == "1",
         "the client's one attempt: 503 outcome-pending, Retry-After 1", r)
    wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it",
               timeout=JOB_BOUND)
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
    end_window(key)
    again = api.post("/v1/payments", payment(recipient), key=key)
    t.ok(pending(r) and again.status == 201 and not again.replayed and
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
