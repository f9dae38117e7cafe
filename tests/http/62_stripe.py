"""The lease strategy against a provider written by others: the Stripe
adapter (IDEM_PROVIDER_KIND=stripe, src/lease/provider.c) and
stripe-stateful-mock 0.0.16 from npm, which keeps every answer under its
Idempotency-Key but 401 and 429 (a 500 included) and replays it. Its test
tokens drive the cases. In every case the charges are counted at the mock
by metadata[idempotency_key]: exactly one per client key, over all of its
generations.

- a charge: 201 with Stripe's ch_ id, form-encoded with the currency in lower
  case, the metadata the contract lists; replayed byte for byte;
- declines (card_error) saved with their decline code and replayed;
  amount_too_large (invalid_request_error) saved as payment-rejected;
- tok_429 then tok_visa: a 503 with Retry-After, then one charge;
- tok_500, tok_500, tok_visa: indeterminate answers reconciled, the key at its
  third generation, one charge (two generations with none);
- a payment without payment_method: 400 before the key is taken;
- concurrent duplicates: one charge;
- the worker killed (SIGKILL) while its call is on the wire: the recovery
  job finishes the key with the same derived key, one charge;
- a wrong secret (401): not saved, logged; the retry once the secret is
  right gets the one charge;
- the service refuses to start with the stripe kind and no secret;
- a refund through POST /v1/refunds: Stripe's re_ id, one refund;
- IDEM_TEST_SCENARIO=name runs one part (the names below)."""

import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, COMMAND_BOUND, JOB_BOUND, ROOT, STRIPE_SECRET,  # noqa: E402
                     Api, Background, DbProxy, StripeMock, Tap, concurrently, derived_key, key_row,
                     new_key, request, sql, sql_value, wait_until)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
mock = StripeMock().start()
STRIPE = {"IDEM_PROVIDER_KIND": "stripe", "IDEM_PROVIDER_SECRET": STRIPE_SECRET,
          "IDEM_PROVIDER_URL": mock.url}


def scenario(name):
    return only is None or only == name


def chain(*tokens):
    """A source the mock answers token by token, one per use; the random
    tail keeps it apart from every other test's."""
    return "|".join(tokens + (f"r{random.randrange(10**9)}",))


def payment(method="tok_visa", amount=10000, **extra):
    body = {"amount": amount, "currency": "RUB", "recipient": "acc-1",
            "purpose": "order 17", "payment_method": method}
    body.update(extra)
    return body


def charges(key, generations=1, client="shop-1", status="succeeded"):
    """The charges at the mock under the key's derived keys of generations
    1 to n."""
    made = []
    for g in range(1, generations + 1):
        derived = derived_key(key, g, client, key_max=255)
        made += mock.charges_of(derived, status=status)
    return made


def problem_type(r):
    try:
        return r.json()["type"].rsplit("/", 1)[-1]
    except (ValueError, KeyError):
        return None


def generation(key, client="shop-1"):
    return sql_value("select provider_generation from idempotency_keys where "
                     f"client_id = '{client}' and idem_key = '{key}'")


# The settle window after a kept 500: an hour, so that no retry passes it by
# the machine's speed; a test ends it by hand, as time would (end_window).
WINDOW = 3600
api = Api(IDEM_PROVIDER_SETTLE_SECONDS=WINDOW, **STRIPE).start()


def end_window(key, client="shop-1"):
    sql(f"update idempotency_keys set settle_until = now() where client_id = "
        f"'{client}' and idem_key = '{key}' and settle_until > now()")


def settled(send, key, tries):
    """tries attempts of a client, the settle window ended after each."""
    seen = []
    for _ in range(tries):
        seen.append(send())
        end_window(key)
    return seen

if scenario("charge"):
    key = new_key("st")
    r = api.post("/v1/payments", payment(), key=key)
    again = api.post("/v1/payments", payment(), key=key)
    made = charges(key)
    t.ok(r.status == 201 and r.json()["charge_id"].startswith("ch_") and
         r.json()["status"] == "succeeded", "tok_visa: a 201 with Stripe's charge id", r)
    t.ok(again.status == 201 and again.replayed and again.body == r.body,
         "the retry is replayed byte for byte", again)
    t.ok(len(made) == 1 and made[0]["id"] == r.json()["charge_id"],
         "one charge at the mock under metadata[idempotency_key] shop-1:<key>", made)
    c = made[0] if made else {}
    t.ok(c.get("currency") == "rub" and c.get("amount") == 10000 and
         c.get("description") == "order 17" and
         c.get("metadata") == {"idempotency_key": f"shop-1:{key}", "key_generation": "1",
                               "client_id": "shop-1", "recipient": "acc-1"},
         "the charge as the contract sends it: currency in lower case, description, "
         "metadata", c)

if scenario("declines"):
    for token, code in (("tok_chargeDeclined", "generic_decline"),
                        ("tok_chargeDeclinedInsufficientFunds", "insufficient_funds")):
        key = new_key("st")
        r = api.post("/v1/payments", payment(token), key=key)
        again = api.post("/v1/payments", payment(token), key=key)
        t.ok(r.status == 402 and problem_type(r) == "card-declined" and
             f"decline code: {code}" in r.json().get("detail", ""),
             f"{token}: 402 card-declined carrying the decline code {code}", r)
        t.ok(again.status == 402 and again.replayed and again.body == r.body and
             key_row(key)["status"] == "done" and not charges(key),
             f"{token}: saved and replayed, no charge that succeeded", again)
    key = new_key("st")
    r = api.post("/v1/payments", payment(amount=100000000), key=key)
    again = api.post("/v1/payments", payment(amount=100000000), key=key)
    t.ok(r.status == 422 and problem_type(r) == "payment-rejected" and again.replayed and
         again.body == r.body and key_row(key)["status"] == "done",
         "amount_too_large (invalid_request_error): a saved 422 payment-rejected", (r, again))

if scenario("rate-limited"):
    key = new_key("st")
    source = chain("tok_429", "tok_visa")
    first = api.post("/v1/payments", payment(source), key=key)
    row = key_row(key)
    second = api.post("/v1/payments", payment(source), key=key)
    t.ok(first.status == 503 and problem_type(first) == "provider-rate-limited" and
         first.headers.get("retry-after", "").isdigit() and
         row["status"] == "in_progress" and not row["leased"],
         "tok_429: a 503 with Retry-After, nothing saved, the lease released", (first, row))
    t.ok(second.status == 201 and len(charges(key)) == 1 and generation(key) == "1",
         "the retry with the same derived key: one charge", second)

if scenario("reconciled"):
    key = new_key("st")
    source = chain("tok_500", "tok_500", "tok_visa")
    seen = settled(lambda: api.post("/v1/payments", payment(source), key=key), key, 3)
    t.ok([r.status for r in seen] == [503, 503, 201],
         "tok_500, tok_500, tok_visa: 503, 503, then 201", seen)
    t.ok(all(problem_type(r) == "outcome-pending" and
             r.headers.get("retry-after") == str(WINDOW) and
             "may still be made" in r.json().get("detail", "") for r in seen[:2]),
         "an indeterminate answer says the outcome is not known yet, Retry-After "
         "the settle window", seen[:2])
    t.ok(len(charges(key, 3)) == 1 and not charges(key) and
         not mock.charges_of(derived_key(key, 2)) and
         len(mock.charges_of(derived_key(key, 3))) == 1 and generation(key) == "3",
         "one charge, under the third generation; the first two made none",
         charges(key, 3, status=None))
    again = api.post("/v1/payments", payment(source), key=key)
    t.ok(again.status == 201 and again.replayed and again.body == seen[2].body,
         "and it is replayed", again)
    log = api.read_log()
    t.ok(f"reconciled shop-1:{key}: no payment under generations 1 to 1 (after its "
         "settle window); the next is 2" in log and f"reconciled shop-1:{key}: no "
         "payment under generations 1 to 2 (after its settle window); the next is 3"
         in log, "each reconciliation is logged")

if scenario("reconciled-long-list"):
    # A page of the mock's charges past 64 KiB (the cap of a payment's answer):
    # the reconciliation reads lists with a cap of their own (found by the
    # chaos soak, where every reconciliation failed once the mock held
    # about 30 charges).
    for _ in range(40):
        assert api.post("/v1/payments", payment(), key=new_key("st-fill")).status == 201
    size = len(request(mock.port, "GET", "/v1/charges?limit=100",
                       headers={"Authorization": f"Bearer {STRIPE_SECRET}"}).body)
    key = new_key("st")
    source = chain("tok_500", "tok_visa")
    seen = settled(lambda: api.post("/v1/payments", payment(source), key=key), key, 2)
    t.ok(size > 65536 and [r.status for r in seen] == [503, 201] and
         len(charges(key, 2)) == 1 and generation(key) == "2",
         f"a list page of {size} bytes: reconciled, one charge under generation 2",
         (size, seen))

if scenario("colliding-keys"):
    # The client's key K:2 and K's second generation derive one provider
    # key, shop-1:K:2: the previous release answered K:2's charge to K, or
    # left K stuck at a 502 idempotency_error. Now K passes over that
    # generation while the key K:2 exists: two payments, two charges.
    base = new_key("st")
    other = api.post("/v1/payments", payment(), key=f"{base}:2")
    source = chain("tok_500", "tok_visa")
    first = api.post("/v1/payments", payment(source), key=base)
    end_window(base)
    second = api.post("/v1/payments", payment(source), key=base)
    t.ok(other.status == 201 and first.status == 503 and second.status == 201 and
         generation(base) == "3" and
         other.json()["charge_id"] != second.json()["charge_id"] and
         [c["id"] for c in mock.charges_of(f"shop-1:{base}:2")] ==
         [other.json()["charge_id"]] and
         [c["id"] for c in mock.charges_of(derived_key(base, 3))] ==
         [second.json()["charge_id"]],
         "K:2 charged; K passes over its second generation (K:2's provider key) "
         "to its third: its own charge", (other, first, second))

if scenario("long-key"):
    # Stripe takes keys of 255 characters at most: a longer derived key is
    # sent as the client's key's SHA-256, in every generation, in a form no
    # client key can spell (shop-1~sha256:<hash>).
    import hashlib
    key = "L" * 255
    r = api.post("/v1/payments", payment(), key=key)
    made = [c for c in mock._all("charges")
            if (c.get("metadata") or {}).get("idempotency_key", "").startswith("shop-1~sha256:")]
    derived = made[0]["metadata"]["idempotency_key"] if made else ""
    t.ok(r.status == 201 and len(made) == 1 and
         derived == "shop-1~sha256:" + hashlib.sha256(key.encode()).hexdigest() and
         derived == derived_key(key, key_max=255) and
         len(derived) <= 255, "a 255-character key: one charge under shop-1~sha256:<its hash>",
         (r, derived))

if scenario("no-payment-method"):
    key = new_key("st")
    body = payment()
    del body["payment_method"]
    r = api.post("/v1/payments", body, key=key, bad=True)
    t.ok(r.status == 400 and problem_type(r) == "invalid-request" and
         "payment_method" in r.json().get("detail", "") and key_row(key) is None,
         "without payment_method: 400 naming it, and the key is not taken", r)
    r = api.post("/v1/payments", payment("tok visa"), key=key, bad=True)
    t.ok(r.status == 400 and key_row(key) is None,
         "a payment_method with a space: 400, not taken", r)

if scenario("concurrent"):
    key = new_key("st")
    source = chain("tok_visa")
    seen = concurrently(6, api.post, "/v1/payments", payment(source), key=key)
    final = api.post("/v1/payments", payment(source), key=key)
    t.ok(all(r.status in (201, 409) for r in seen) and final.status == 201 and
         len(charges(key)) == 1,
         "six at once: 201 or 409 each, then one charge", [r.status for r in seen])

if scenario("killed"):
    # The call sits in a proxy for 3 s: the worker is killed while it is on
    # the wire, the mock then charges. The recovery job of the next
    # instance takes the key over and gets that charge with the same key.
    proxy = DbProxy(delay=3.0, target=mock.port, http=True)
    slow = Api(name="api-slow", **dict(STRIPE, IDEM_PROVIDER_URL=f"http://127.0.0.1:{proxy.port}",
                                        IDEM_LEASE_SECONDS=4, IDEM_PROVIDER_TIMEOUT_MS=3500)).start()
    key = new_key("st")
    call = Background(slow.post, "/v1/payments", payment(), key=key)
    # The payment's own request, whole (not any first bytes through the
    # proxy: a recovery job's call of keys older tests left would do).
    wait_until(lambda: proxy.requested(key), "the call to be on the wire")
    slow.kill9()
    call.cut()
    wait_until(lambda: len(charges(key)) == 1, "the mock to get the charge",
               timeout=ANSWER_BOUND)
    recoverer = Api(name="api-recoverer", IDEM_RECOVERY_AFTER_SECONDS=1,
                    IDEM_RECOVERY_INTERVAL_SECONDS=1, IDEM_LEASE_SECONDS=4,
                    IDEM_PROVIDER_TIMEOUT_MS=3500, **STRIPE).start()
    wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it",
               timeout=JOB_BOUND)
    r = api.post("/v1/payments", payment(), key=key)
    t.ok(r.status == 201 and r.replayed and
         r.json()["charge_id"] == charges(key)[0]["id"] and len(charges(key)) == 1,
         "SIGKILL mid-call: the recovery job saves the one charge, the retry gets it", r)
    recoverer.stop()

if scenario("strategies"):
    # The strategies compared against a provider written by others: the API
    # is killed while the charge is on the wire (a proxy holds it 2 s, then
    # the mock charges), and the client retries. The lease strategy's retry
    # gets that charge with the same derived key; the fresh provider key's
    # and the naive check-then-write's charge again.
    proxy = DbProxy(delay=2.0, target=mock.port, http=True)
    slow_env = dict(STRIPE, IDEM_PROVIDER_URL=f"http://127.0.0.1:{proxy.port}",
                    IDEM_LEASE_SECONDS=4, IDEM_PROVIDER_TIMEOUT_MS=3500)
    paths = {"lease": "/v1/payments", "fresh provider key": "/demo/fresh-provider-key/payments",
             "naive": "/demo/naive/payments"}
    for strategy, want in (("lease", 1), ("fresh provider key", 2), ("naive", 2)):
        slow = Api(name=f"api-{new_key('strategy')}", **slow_env).start()
        key, rcpt = new_key("st"), new_key("acc")
        body = dict(payment(), recipient=rcpt)
        call = Background(slow.post, paths[strategy], body, key=key)
        # This payment's request, whole, by its recipient: not the first
        # bytes of any connection through the proxy (the new instance's
        # recovery job calls the mock for keys older tests left, and a
        # kill before the payment's request was out charged nothing).
        wait_until(lambda: proxy.requested(rcpt), "the call to be on the wire")
        slow.kill9()
        call.cut()

        def at_mock():
            return [c for c in mock._all("charges")
                    if (c.get("metadata") or {}).get("recipient") == rcpt and
                    c.get("status") == "succeeded"]
        wait_until(lambda: len(at_mock()) == 1, "the mock to charge", timeout=ANSWER_BOUND)
        if strategy != "naive":
            wait_until(lambda: not key_row(key)["leased"], "the dead worker's lease to end",
                       timeout=JOB_BOUND)
        retry = api.post(paths[strategy], body, key=key)
        t.ok(retry.status == 201 and len(at_mock()) == want,
             f"API killed after Stripe charged, then a retry / {strategy}: 201, "
             f"{want} charge{'s' if want > 1 else ''} at the mock", (retry, len(at_mock())))

if scenario("wrong-secret"):
    wrong = Api(name="api-wrong", **dict(STRIPE, IDEM_PROVIDER_SECRET="rk_live_wrong")).start()
    key = new_key("st")
    r = wrong.post("/v1/payments", payment(), key=key)
    row = key_row(key)
    t.ok(r.status == 502 and problem_type(r) == "provider-unavailable" and
         "configuration" in r.json().get("detail", "") and "rk_live" not in r.body.decode() and
         row["status"] == "in_progress" and not row["leased"],
         "a wrong secret (401): 502 with a fixed detail, nothing saved, released", (r, row))
    t.ok(any("Invalid API Key" in line and "status 401" in line
             for line in wrong.read_log().splitlines()),
         "the provider's words are logged")
    wrong.stop()
    r = api.post("/v1/payments", payment(), key=key)
    t.ok(r.status == 201 and len(charges(key)) == 1,
         "once the secret is right the retry gets the one charge", r)

if scenario("refund"):
    key = new_key("st")
    paid = api.post("/v1/payments", payment(), key=key)
    rkey = new_key("st-refund")
    body = {"payment_id": paid.json()["payment_id"], "amount": 4000}
    r = api.post("/v1/refunds", body, key=rkey)
    again = api.post("/v1/refunds", body, key=rkey)
    made = mock.refunds_of(f"shop-1:{rkey}")
    t.ok(r.status == 201 and r.json()["provider_refund_id"].startswith("re_") and
         again.replayed and again.body == r.body and len(made) == 1 and
         made[0]["charge"] == paid.json()["charge_id"] and made[0]["amount"] == 4000,
         "a refund: Stripe's re_ id, one refund of the charge at the mock", (r, made))

if scenario("no-secret"):
    bad = Api(name="api-nosecret", IDEM_PROVIDER_KIND="stripe", IDEM_PROVIDER_SECRET="")
    proc = subprocess.run(["kore", "-fnrc", bad.conf], cwd=ROOT,
                          env=bad.env, capture_output=True, text=True, timeout=COMMAND_BOUND)
    t.ok(proc.returncode != 0 and "IDEM_PROVIDER_SECRET" in proc.stdout + proc.stderr,
         "the stripe kind without a secret refuses to start, naming the setting",
         (proc.returncode, proc.stdout[-300:], proc.stderr[-300:]))

api.stop()
mock.stop()
t.done()
