"""A gateway's 5xx is not the provider's (issue 28, item 1). Between the
service and its provider sits an ordinary gateway (an egress proxy, a load
balancer): it answers the first request of a key with its own HTML 502
at once, while the request itself goes on to the provider and makes the
charge later (the test holds it, then sends it on: Gateway in the
harness). On 1.0.0 the service took any 5xx as "kept by the provider",
listed the charges at once, found none, moved the key to generation 2 and
charged again: two charges per key. Now only a 5xx the provider proves its
own (Stripe: an api_error body and a Request-Id; the fake provider: its
internal-error problem and a Request-Id) is kept; any other is transient,
and the retry sends the SAME derived key, which the provider's own
idempotency joins to the held request: one charge, and the 201 names it.

- Stripe (stripe-stateful-mock) behind the gateway: 502, the retry 201,
  the held request then reaches the mock: one charge, the 201's;
- the fake provider in its keeping mode behind the gateway: the same;
- a proven 5xx still passes the gateway as kept: 503 outcome-pending;
- a stub provider shows what proves it: an api_error 500 with a
  Request-Id is outcome-pending; the same without the Request-Id, and an
  HTML 502, are transient 502s, sent again under the same key.
IDEM_TEST_SCENARIO=name runs one part."""

import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (STRIPE_SECRET, Api, Gateway, Provider, StripeMock, StubProvider,  # noqa: E402
                     Tap, new_key, sql, sql_value)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
# Far above need: no verdict here waits on it (the window is ended, or
# never reached, by the test).
WINDOW = 3600


def scenario(name):
    return only is None or only == name


def kind(r):
    try:
        return r.json()["type"].rsplit("/", 1)[-1]
    except (ValueError, KeyError, TypeError):
        return None


def stripe_payment(method="tok_visa"):
    return {"amount": 10000, "currency": "RUB", "recipient": "acc-1",
            "purpose": "order 17", "payment_method": method}


def generation(key):
    return sql_value("select provider_generation from idempotency_keys where "
                     f"client_id = 'shop-1' and idem_key = '{key}'")


def charge_id(r):
    try:
        return r.json()["charge_id"]
    except (ValueError, KeyError, TypeError):
        return None


if scenario("stripe"):
    mock = StripeMock().start()
    gw = Gateway(mock.port)
    api = Api(name="api-gw-stripe", IDEM_PROVIDER_KIND="stripe",
              IDEM_PROVIDER_SECRET=STRIPE_SECRET, IDEM_PROVIDER_URL=gw.url,
              IDEM_PROVIDER_SETTLE_SECONDS=WINDOW).start()
    for i in range(3):
        key = new_key("gw-stripe")
        first = api.post("/v1/payments", stripe_payment(), key=key)
        retry = api.post("/v1/payments", stripe_payment(), key=key)
        # Only this key's: another test's key that a recovery job takes
        # up meanwhile goes through the gateway too.
        released = [r for r in gw.release() if r[0].startswith(f"shop-1:{key}")]
        made = [c["id"] for g in ("", ":2", ":3")
                for c in mock.charges_of(f"shop-1:{key}{g}")]
        t.ok(first.status == 502 and kind(first) == "provider-unavailable",
             f"key {i + 1}: the gateway's HTML 502 is transient: 502", first)
        t.ok(retry.status == 201 and
             [k for k, _ in released] == [f"shop-1:{key}"],
             f"key {i + 1}: the retry sent the same derived key: 201", (retry, released))
        t.ok(made == [charge_id(retry)] and generation(key) == "1",
             f"key {i + 1}: one charge at Stripe, the 201's, under generation 1 "
             "(the held request joined it)", made)
    # A proven 5xx through the gateway (Stripe's tok_500: api_error and its
    # Request-Id, passed on): kept, outcome-pending.
    plain = Gateway(mock.port, hold_first=False)
    api2 = Api(name="api-gw-stripe-2", IDEM_PROVIDER_KIND="stripe",
               IDEM_PROVIDER_SECRET=STRIPE_SECRET, IDEM_PROVIDER_URL=plain.url,
               IDEM_PROVIDER_SETTLE_SECONDS=WINDOW).start()
    key = new_key("gw-kept")
    r = api2.post("/v1/payments", stripe_payment(f"tok_500|r{random.randrange(10**9)}"),
                  key=key)
    t.ok(r.status == 503 and kind(r) == "outcome-pending" and
         r.headers.get("retry-after") == str(WINDOW) and
         sql_value("select settle_until > now() from idempotency_keys where "
                   f"idem_key = '{key}'") == "t",
         "Stripe's own 500 through the gateway: 503 outcome-pending, Retry-After "
         "the window", r)
    api2.stop()
    api.stop()
    plain.stop()
    gw.stop()
    mock.stop()

if scenario("fake"):
    KEEP = {"IDEM_FAKE_PROVIDER_KEEPS_5XX": 1}
    provider = Provider(name="provider-gw", IDEM_PROVIDER_LATENCY_MS=0, **KEEP).start()
    gw = Gateway(provider.port)
    api = Api(name="api-gw-fake", IDEM_PROVIDER_URL=gw.url,
              IDEM_PROVIDER_SETTLE_SECONDS=WINDOW, **KEEP).start()
    body = {"amount": 10000, "currency": "RUB", "recipient": "acc-gw"}
    key = new_key("gw-fake")
    first = api.post("/v1/payments", body, key=key)
    retry = api.post("/v1/payments", body, key=key)
    gw.release()
    rows = sql("select charge_id from provider.charges where idempotency_key = "
               f"'shop-1:{key}' or idempotency_key like 'shop-1:{key}:%'")
    t.ok(first.status == 502 and retry.status == 201 and
         [r[0] for r in rows] == [charge_id(retry)],
         "the fake provider behind the gateway: 502, 201, one charge, the 201's",
         (first, retry, rows))
    key = new_key("gw-fake-kept")
    r = api.post("/v1/payments", dict(body, recipient="fail"), key=key)
    r2 = api.post("/v1/payments", dict(body, recipient="fail"), key=key)
    gw.release()
    t.ok(r.status == 502 and r2.status == 503 and kind(r2) == "outcome-pending",
         "a kept 500 that reaches the service (the key's second request, passed "
         "on) is proven by its Request-Id: outcome-pending", (r, r2))
    api.stop()
    gw.stop()
    provider.stop()

if scenario("proof"):
    error = {"error": {"type": "api_error", "message": "An unknown error occurred"}}
    cases = [("an api_error 500 with a Request-Id", (500, {"Request-Id": "req_x1"}, error),
              503, "outcome-pending"),
             ("an api_error 500 without a Request-Id", (500, {}, error), 502,
              "provider-unavailable"),
             ("an HTML 502 with a Request-Id", (502, {"Request-Id": "req_x2",
                                                     "Content-Type": "text/html"},
                                               b"<html>502 Bad Gateway</html>"), 502,
              "provider-unavailable"),
             ("an empty 503", (503, {}, b""), 502, "provider-unavailable")]
    for what, answer, status, problem in cases:
        stub = StubProvider(default=answer)
        api = Api(name="api-proof", IDEM_PROVIDER_KIND="stripe",
                  IDEM_PROVIDER_SECRET=STRIPE_SECRET, IDEM_PROVIDER_URL=stub.url,
                  IDEM_PROVIDER_SETTLE_SECONDS=WINDOW).start()
        key = new_key("proof")
        r = api.post("/v1/payments", stripe_payment(), key=key)
        again = api.post("/v1/payments", stripe_payment(), key=key)
        # This key's calls (a recovery job may send another test's keys).
        keys = [c[1] for c in stub.calls if c[1] and c[1].startswith(f"shop-1:{key}")]
        if status == 503:
            t.ok(r.status == 503 and kind(r) == "outcome-pending" and
                 kind(again) == "outcome-pending" and keys == [f"shop-1:{key}"],
                 f"{what}: kept, 503 outcome-pending; the retry is not sent", (r, keys))
        else:
            t.ok(r.status == status and kind(r) == problem and again.status == status and
                 keys == [f"shop-1:{key}"] * 2 and
                 generation(key) == "1",
                 f"{what}: transient, {status}; the retry sends the same derived key",
                 (r, keys))
        api.stop()
        stub.stop()

t.done()
