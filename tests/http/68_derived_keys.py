"""One client key, one provider key (issue 28, item 4b): no two client keys
derive the same provider Idempotency-Key, whatever their spelling, length
or generation (src/lease/lease.c, provider_key()). Generation n of K is
<client>:K:n (the contract's form), which is also the first generation of
the client key "K:n"; and the previous release sent a key too long for
Stripe as <client>:sha256-<hex>, which is also the client key spelled
"sha256-<hex>": with the same body one charge was answered to two
payments, with another body the second key was stuck at 502 (the
provider's "same key, other parameters"). Now a long key is sent as
<client>~sha256:<hex>, which no key can spell; K passes over a generation n
while the key "K:n" exists, and a new key "K:n" is refused (422) once K
has reached generation n. Against the fake provider (keeping its 500s) and
the Stripe mock:

- "long": a 250-character key and the key spelled sha256-<its hash>: with
  the same body two payments and two charges, with different bodies both
  201 (the fake provider has no key limit and never hashes: there this
  part holds on the previous release too);
- "generation": "K:2" first, then K past a kept 500: K passes over its
  second generation to its third; two payments, two charges, each 201
  naming its own (fake provider and Stripe); K at its second generation
  first, then "K:2": refused, 422, nothing made;
- "upgrade": a charge of K's second generation sent by an instance of
  1.0.0 (shop-1:K:2 with metadata[key_generation] 2, the same form) is K's
  at Stripe.

The settle window is set to 0 (IDEM_PROVIDER_SETTLE_SECONDS) so that a kept
500 may be reconciled at once. IDEM_TEST_SCENARIO=name runs one part."""

import hashlib
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (REQUEST_BOUND, STRIPE_SECRET, Api, Provider, StripeMock, Tap,  # noqa: E402
                     derived_key, key_row, new_key, quote, sql, sql_value)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
SETTLE = {"IDEM_PROVIDER_SETTLE_SECONDS": 0}
KEEP = {"IDEM_FAKE_PROVIDER_KEEPS_5XX": 1}
provider = Provider(IDEM_PROVIDER_LATENCY_MS=0, **KEEP).start()
fake = Api(name="api-fake", IDEM_PROVIDER_URL=provider.url, **KEEP, **SETTLE).start()
mock = StripeMock().start()
stripe = Api(name="api-stripe", IDEM_PROVIDER_KIND="stripe",
             IDEM_PROVIDER_SECRET=STRIPE_SECRET, IDEM_PROVIDER_URL=mock.url,
             **SETTLE).start()


def scenario(name):
    return only is None or only == name


def tail():
    return f"r{random.randrange(10**9)}"


def chain(*tokens):
    """A source the mock answers token by token, one per use."""
    return "|".join(tokens + (tail(),))


def fake_payment(recipient="acc-1", amount=10000):
    return {"amount": amount, "currency": "RUB", "recipient": recipient}


def stripe_payment(method="tok_visa", amount=10000):
    return {"amount": amount, "currency": "RUB", "recipient": "acc-1",
            "purpose": "order 17", "payment_method": method}


def charge_id(r):
    try:
        return r.json().get("charge_id")
    except ValueError:
        return None


def fake_charges(key, generations=(1, 2)):
    """The fake provider's charges under the client key's derived keys of
    those generations."""
    keys = ", ".join(quote(derived_key(key, g)) for g in generations)
    return [r[0] for r in sql("select charge_id from provider.charges where"
                              f" idempotency_key in ({keys}) order by created_at")]


def stripe_charges(key, generations=(1,)):
    made = []
    for g in generations:
        made += [c["id"] for c in mock.charges_of(derived_key(key, g, key_max=255))]
    return made


def generation(key):
    return sql_value("select provider_generation from idempotency_keys where "
                     f"client_id = 'shop-1' and idem_key = {quote(key)}")


def two_payments(a, ra, b, rb, charges_a, charges_b, what):
    t.ok(ra.status == 201 and rb.status == 201 and charge_id(ra) and charge_id(rb) and
         charge_id(ra) != charge_id(rb) and charges_a == [charge_id(ra)] and
         charges_b == [charge_id(rb)] and key_row(a)["status_code"] == "201" and
         key_row(b)["status_code"] == "201",
         f"{what}: two payments, two charges, each 201 naming its own",
         (ra, rb, charges_a, charges_b))


def kept_500(key, generation=1):
    """The fake provider answers the key's derived key a 500 and keeps it,
    whatever the recipient: an indeterminate answer of that generation."""
    sql("insert into provider.kept_answers (kind, idempotency_key, status) values "
        f"('charge', {quote(derived_key(key, generation))}, 500)")


def fake_to_generation_2(key, body):
    """K's first generation answered a kept 500: 503 outcome-pending (a
    window of 0 s); the retry reconciles (none), moves to the next
    generation and sends it."""
    kept_500(key)
    first = fake.post("/v1/payments", body, key=key)
    assert first.status == 503, first
    return fake.post("/v1/payments", body, key=key)


if scenario("long"):
    for same in (True, False):
        what = "same body" if same else "other bodies"
        long_key = "L" * 240 + tail()
        long_key = long_key + "x" * (250 - len(long_key))
        spelled = "sha256-" + hashlib.sha256(long_key.encode()).hexdigest()

        # The Stripe mock (key_max 255): the long key is sent hashed.
        body_a = stripe_payment()
        body_b = body_a if same else stripe_payment(amount=12345)
        ra = stripe.post("/v1/payments", body_a, key=long_key)
        rb = stripe.post("/v1/payments", body_b, key=spelled)
        two_payments(long_key, ra, spelled, rb, stripe_charges(long_key),
                     stripe_charges(spelled), f"Stripe, a 250-character key and the key "
                     f"spelled sha256-<its hash>, {what}")
        t.ok(derived_key(long_key, key_max=255) != derived_key(spelled, key_max=255) and
             len(derived_key(long_key, key_max=255)) <= 255,
             "their derived keys differ and fit Stripe's 255",
             (derived_key(long_key, key_max=255), derived_key(spelled, key_max=255)))

        # The fake provider (no limit).
        long_key = long_key[:-1] + "y"
        spelled = "sha256-" + hashlib.sha256(long_key.encode()).hexdigest()
        body_a = fake_payment()
        body_b = body_a if same else fake_payment(amount=12345)
        ra = fake.post("/v1/payments", body_a, key=long_key)
        rb = fake.post("/v1/payments", body_b, key=spelled)
        two_payments(long_key, ra, spelled, rb, fake_charges(long_key),
                     fake_charges(spelled), f"the fake provider, the same two keys, {what}")

if scenario("generation"):
    for same in (True, False):
        what = "same body" if same else "other bodies"
        # The fake provider: "K:2" first, then K past a kept 500.
        base = new_key("dk")
        body_a = fake_payment()
        body_b = body_a if same else fake_payment(amount=12345)
        other = fake.post("/v1/payments", body_a, key=f"{base}:2")
        second = fake_to_generation_2(base, body_b)
        two_payments(f"{base}:2", other, base, second, fake_charges(f"{base}:2", (1,)),
                     fake_charges(base, (1, 3)),
                     f"the fake provider, K:2 then K past a kept 500, {what}")
        t.eq(generation(base), "3", "K passed over its second generation (K:2's "
             "provider key) to its third")

        # K at its second generation first, then "K:2": refused.
        base = new_key("dk")
        second = fake_to_generation_2(base, body_b)
        other = fake.post("/v1/payments", body_a, key=f"{base}:2")
        try:
            kind = other.json().get("type", "")
        except ValueError:
            kind = ""
        t.ok(second.status == 201 and other.status == 422 and
             kind.endswith("/idempotency-key-reused") and key_row(f"{base}:2") is None and
             fake_charges(f"{base}:2", (1,)) == fake_charges(base, (2,)) ==
             [charge_id(second)],
             f"the fake provider, K at generation 2 then K:2: K:2 refused (422), "
             f"nothing taken, nothing made, {what}", (second, other))

        # The Stripe mock: K's first use of the chain is a kept 500, K:2's
        # the charge; K's retry reconciles (K:2's charge says generation 1:
        # not K's), passes over generation 2 and sends its third.
        base = new_key("dk")
        source = chain("tok_500", "tok_visa", "tok_visa")
        body_a = stripe_payment(source)
        first = stripe.post("/v1/payments", body_a, key=base)
        body_b = body_a if same else stripe_payment(amount=12345)
        other = stripe.post("/v1/payments", body_b if same else stripe_payment(),
                            key=f"{base}:2")
        second = stripe.post("/v1/payments", body_a, key=base)
        t.eq(first.status, 503, "Stripe: K's first generation a kept 500 (outcome-pending)")
        two_payments(f"{base}:2", other, base, second, stripe_charges(f"{base}:2"),
                     stripe_charges(base, (1, 3)),
                     f"Stripe, K:2 and K past a kept 500, {what}")
        t.ok(generation(base) == "3" and
             [c["id"] for c in mock.charges_of(derived_key(base, 2))] == [charge_id(other)],
             "K's charge is its third generation's; the provider key of its second "
             "is K:2's alone", generation(base))

if scenario("upgrade"):
    # A charge of K's second generation that an instance of 1.0.0 sent as
    # shop-1:K:2 (metadata[key_generation] 2) during a rolling upgrade is
    # found by K's reconciliation: 201 with it, no third generation. The
    # client key "K:2" (generation 1) never is (the "generation" part).
    import http.client
    import urllib.parse
    base = new_key("dk")
    source = chain("tok_500", "tok_500", "tok_visa")
    seen = [stripe.post("/v1/payments", stripe_payment(source), key=base) for _ in range(2)]
    conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=REQUEST_BOUND)
    conn.request("POST", "/v1/charges", body=urllib.parse.urlencode({
        "amount": 10000, "currency": "rub", "source": "tok_visa",
        "metadata[idempotency_key]": f"shop-1:{base}:2", "metadata[key_generation]": "2",
        "metadata[client_id]": "shop-1", "metadata[recipient]": "acc-1"}),
        headers={"Authorization": f"Bearer {STRIPE_SECRET}",
                 "Content-Type": "application/x-www-form-urlencoded"})
    old = json.loads(conn.getresponse().read())["id"]
    conn.close()
    found = stripe.post("/v1/payments", stripe_payment(source), key=base)
    t.ok([r.status for r in seen] == [503, 503] and found.status == 201 and
         charge_id(found) == old and generation(base) == "2" and
         not stripe_charges(base, (3,)),
         "Stripe: 1.0.0's form of generation 2 (shop-1:K:2, key_generation 2) is K's: "
         "201 with its charge, nothing sent again", (seen, found))

fake.stop()
stripe.stop()
provider.stop()
mock.stop()
t.done()
