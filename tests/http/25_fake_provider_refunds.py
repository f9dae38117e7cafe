"""The fake provider's POST /v1/refunds and GET /v1/refunds, spoken to
directly: one refund per key, never past what is left of the charge (not
even by refunds at once), the 409 and 422 of charges, 400 for an unknown
charge, the magic recipients whose refunds fail ("refund-fail"), are
refused ("refund-reject") or think past the API's timeout ("refund-slow")
while their charges succeed, and every call logged as a refund."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Background, Provider, PsqlSession, Tap, new_key,  # noqa: E402
                     post, provider_calls, quote, refunded, refunds_to, request,
                     sql, wait_until, waiting_backends)

LATENCY_MS = 1000
TIMEOUT_MS = 4000

t = Tap()
# It thinks a second: the window in which a duplicate finds the first
# still thinking. Told the API's timeout, "refund-slow" thinks 6 s: far
# from a charge's second, which a loaded machine only makes longer, on
# the line between them (5 s).
provider = Provider(IDEM_PROVIDER_LATENCY_MS=LATENCY_MS,
                    IDEM_PROVIDER_TIMEOUT_MS=TIMEOUT_MS).start()


def charge(recipient, amount=10000, key=None):
    return post(provider.port, "/v1/charges",
                {"amount": amount, "currency": "RUB", "recipient": recipient},
                key=key or new_key("ch"), token=False)


def refund(charge_id, amount, key, **extra):
    return post(provider.port, "/v1/refunds",
                dict({"charge_id": charge_id, "amount": amount}, **extra),
                key=key, token=False)


def timed(fn, *args, **kwargs):
    started = time.monotonic()
    r = fn(*args, **kwargs)
    return r, time.monotonic() - started


def problem(r):
    try:
        return r.json()["type"].rsplit("/", 1)[-1]
    except (ValueError, KeyError):
        return None


def logged(key):
    """The refund requests logged under a key: (recipient, status)."""
    return [(recipient, int(status)) for recipient, status in sql(
        "select coalesce(recipient, '-'), status from provider.requests"
        f" where idempotency_key = {quote(key)} and kind = 'refund'"
        " order by request_id")]


def new_charge(recipient="acc-refund", amount=10000):
    r = charge(recipient, amount)
    assert r.status == 201, r
    return r.json()["charge_id"]


# A refund, and the same key again.
ch = new_charge()
key = new_key("re")
first, took = timed(refund, ch, 6000, key)
t.eq(first.status, 201, "a refund is created")
body = first.json()
t.ok(set(body) == {"refund_id", "charge_id", "amount"} and
     body["refund_id"].startswith("re_") and body["charge_id"] == ch and
     body["amount"] == 6000,
     "201 body: refund_id re_..., the charge_id, the amount", first)
t.ok(first.headers.get("content-type") == "application/json" and not first.replayed,
     "as JSON, not a replay", first.headers)
t.ok(took >= LATENCY_MS / 1000 - 0.05, f"it thought {LATENCY_MS} ms", took)
t.eq([r["refund_id"] for r in provider.refunds(key)], [body["refund_id"]],
     "GET /v1/refunds lists the one refund under the key")
t.eq(refunded(ch), 6000, "the charge is refunded 6000")

again = refund(ch, 6000, key)
t.ok(again.status == 201 and again.replayed and again.body == first.body,
     "the same key again: the same refund, with Idempotent-Replayed: true", again)
t.eq(len(provider.refunds(key)), 1, "and no second refund")

for name, other in [("another amount", (ch, 5000)),
                    ("another charge", (new_charge(), 6000))]:
    r = refund(*other, key)
    t.ok(r.status == 422 and problem(r) == "idempotency-key-reused" and
         r.headers.get("content-type") == "application/problem+json",
         f"the same key, {name}: 422 idempotency-key-reused", r)
t.ok("refund with other parameters" in r.json()["detail"],
     "which says it was used for a refund", r.json())
t.eq(refunded(ch), 6000, "the mismatches refunded nothing")
t.eq(logged(key), [("acc-refund", 201), ("acc-refund", 201), ("acc-refund", 422),
                   ("acc-refund", 422)],
     "every request logged as a refund, with the charge's recipient and its status")
t.eq((provider_calls(key, "refund"), provider_calls(key)), (4, 0),
     "provider_calls counts them as refunds, not charges")

# Past what is left of the charge.
key2 = new_key("re")
over = refund(ch, 6000, key2)
t.ok(over.status == 400 and problem(over) == "invalid-request",
     "6000 more of a 10000 charge refunded 6000: 400", over)
t.ok("4000" in over.json().get("detail", ""), "saying 4000 is left", over.json())
t.eq((provider.refunds(key2), refunded(ch)), ([], 6000), "no refund kept")
rest = refund(ch, 4000, key2)
t.ok(rest.status == 201 and not rest.replayed and rest.json()["amount"] == 4000,
     "the same key then refunds the 4000 left: 201", rest)
t.eq(refunded(ch), 10000, "the charge is refunded in full")
r = refund(ch, 1, new_key("re"))
t.eq(r.status, 400, "then even 1 more is a 400")
r = refund(ch, 6000, key)
t.ok(r.status == 201 and r.replayed and r.body == first.body,
     "and the first key still gets its refund", r)

# Refunds at once: each locks the charge's row, so they cannot all see the
# amount still there. A lock on provider.refunds holds them back until all
# have come as far as they can (without the row lock, past reading what is
# refunded), so that they are at once whatever the machine's speed.
def at_once(n, charge_id, amount):
    hold = PsqlSession()
    hold.run("begin; lock table provider.refunds in share mode;")
    jobs = [Background(refund, charge_id, amount, new_key("re")) for _ in range(n)]
    wait_until(lambda: waiting_backends("%provider.refund(%") == n,
               f"the {n} refunds to wait for the lock")
    hold.run("commit;")
    hold.close()
    return [j.wait() for j in jobs]


ch = new_charge()
answers = at_once(4, ch, 6000)
t.eq(sorted(a.status for a in answers), [201, 400, 400, 400],
     "four refunds of 6000 of a 10000 charge at once: one 201, three 400")
t.eq(refunded(ch), 6000, "6000 refunded in all")
ch = new_charge()
answers = at_once(5, ch, 3000)
t.eq(sorted(a.status for a in answers), [201, 201, 201, 400, 400],
     "five of 3000 at once: three 201, two 400")
t.eq(refunded(ch), 9000, "9000 refunded in all, not past the 10000")

# A duplicate while the first still thinks.
ch = new_charge()
key = new_key("re")
running = Background(refund, ch, 2500, key)
wait_until(lambda: provider.refunds(key), "the provider to record the refund")
dup = refund(ch, 2500, key)
done = running.wait()
t.ok(done.status == 201 and not done.replayed, "the first gets its 201", done)
# While the first thinks (a second), the same key is a 409; a duplicate a
# slow machine sent only after that gets the refund.
if dup.status == 409:
    t.ok(problem(dup) == "request-in-progress" and dup.headers.get("retry-after") == "1",
         "the same key while the first thinks: 409 request-in-progress, Retry-After: 1 "
         "(the second it thinks)", (dup, dup.headers))
else:
    t.ok(dup.status == 201 and dup.replayed and dup.body == done.body,
         "the same key, sent once the first had thought: the same refund", dup)
after = refund(ch, 2500, key)
t.ok(after.status == 201 and after.replayed and after.body == done.body,
     "after it, the same key gets the same refund", after)
t.eq(len(provider.refunds(key)), 1, "one refund")

# An unknown charge.
key = new_key("re")
r = refund("ch_unknown", 100, key)
t.ok(r.status == 400 and problem(r) == "invalid-request" and
     r.json().get("detail") == "no charge ch_unknown",
     "a refund of an unknown charge: 400, no charge ch_unknown", r)
t.eq(provider.refunds(key), [], "keeps no refund")
t.eq(logged(key), [("-", 400)], "logged with no recipient")

# Magic recipients: their charges succeed, their refunds misbehave.
for recipient, status, kind in [("refund-fail", 500, "internal-error"),
                                ("refund-reject", 400, "invalid-request")]:
    made = charge(recipient)
    t.ok(made.status == 201 and made.json()["charge_id"].startswith("ch_"),
         f"a charge to {recipient} succeeds", made)
    key = new_key("re")
    r, took = timed(refund, made.json()["charge_id"], 100, key)
    t.ok(r.status == status and problem(r) == kind and
         f'test recipient "{recipient}"' in r.json()["detail"],
         f"its refund: {status} {kind}", r)
    t.ok(took >= LATENCY_MS / 1000 - 0.05, "after thinking, as a refused charge does", took)
    r = refund(made.json()["charge_id"], 100, key)
    t.eq(r.status, status, "and again with the same key")
    t.eq((provider.refunds(key), refunds_to(recipient)), ([], 0), "no refund kept")
    t.eq(logged(key), [(recipient, status)] * 2, "both logged with the charge's recipient")

made, took = timed(charge, "refund-slow")
t.ok(made.status == 201 and took < (LATENCY_MS + TIMEOUT_MS) / 1000,
     "a charge to refund-slow succeeds without thinking long", (made, took))
key = new_key("re")
slow = Background(timed, refund, made.json()["charge_id"], 100, key)
wait_until(lambda: provider.refunds(key), "the provider to record the slow refund")
dup = refund(made.json()["charge_id"], 100, key)
r, took = slow.wait()
want = (LATENCY_MS + TIMEOUT_MS + 1000) / 1000
# While the first thinks, a duplicate is a 409 whose Retry-After is the
# think time left, 1 to 6 s; one that a slow machine sent only after it
# gets the refund.
t.ok((dup.status == 409 and 1 <= int(dup.headers.get("retry-after", "0")) <= want) or
     (dup.status == 201 and dup.json().get("refund_id") == r.json().get("refund_id")),
     "a duplicate of the slow refund: 409, retry in the think time left (or, past it, "
     "the refund)", (dup, dup.headers))
t.ok(r.status == 201 and took >= want - 0.05,
     f"its refund thinks {want} s, past the API's timeout, then 201", (r, took))
t.eq(refunds_to("refund-slow"), 1, "one refund")

# GET /v1/refunds.
listed = request(provider.port, "GET", "/v1/refunds?idempotency_key=" + key)
rows = listed.json()["refunds"]
t.ok(listed.status == 200 and listed.headers.get("content-type") == "application/json" and
     len(rows) == 1 and rows[0]["refund_id"] == r.json()["refund_id"] and
     rows[0]["idempotency_key"] == key and rows[0]["charge_id"] == made.json()["charge_id"] and
     rows[0]["amount"] == 100 and "created_at" in rows[0],
     "GET /v1/refunds?idempotency_key=K: 200 {refunds: [the refund]}", listed)
r = request(provider.port, "GET", "/v1/refunds?idempotency_key=never-used")
t.ok(r.status == 200 and r.json() == {"refunds": []}, "an unused key: no refunds", r)
r = request(provider.port, "GET", "/v1/refunds")
t.ok(r.status == 400 and problem(r) == "invalid-request",
     "no idempotency_key: 400 invalid-request", r)
r = request(provider.port, "PUT", "/v1/refunds")
t.ok(r.status == 405 and r.headers.get("allow") == "GET, POST" and
     "/v1/refunds" in r.json()["detail"], "PUT: 405, Allow: GET, POST", r)

# A key used for a charge and for a refund: two calls of two kinds.
key = new_key("both")
made = charge("acc-both", key=key)
r = refund(made.json()["charge_id"], 100, key)
t.eq((made.status, r.status), (201, 201), "one key makes a charge and a refund")
t.eq((provider_calls(key), provider_calls(key, "refund")), (1, 1),
     "provider_calls counts the charge call as before, the refund apart")

# Bad requests: 400 problems, nothing logged.
ch = new_charge()
bad = [
    ("no body", b""),
    ("not JSON", b"{\"charge_id\": "),
    ("an array", [ch, 100]),
    ("no charge_id", {"amount": 100}),
    ("a numeric charge_id", {"charge_id": 42, "amount": 100}),
    ("an empty charge_id", {"charge_id": "", "amount": 100}),
    ("no amount", {"charge_id": ch}),
    ("amount 0", {"charge_id": ch, "amount": 0}),
    ("a negative amount", {"charge_id": ch, "amount": -100}),
    ("a float amount", {"charge_id": ch, "amount": 1.5}),
    ("a string amount", {"charge_id": ch, "amount": "100"}),
    ("an amount past 2^53-1", {"charge_id": ch, "amount": 2 ** 53}),
]
for name, body in bad:
    key = new_key("bad")
    r = post(provider.port, "/v1/refunds", body, key=key, token=False)
    t.ok(r.status == 400 and problem(r) == "invalid-request" and
         r.headers.get("content-type") == "application/problem+json" and
         "charge_id" in r.json()["detail"],
         f"{name}: 400 invalid-request, showing the body to send", r)
    t.eq(provider_calls(key, "refund"), 0, f"{name}: not logged")
r = post(provider.port, "/v1/refunds", {"charge_id": ch, "amount": 100}, token=False)
t.ok(r.status == 400 and problem(r) == "idempotency-key-missing",
     "no Idempotency-Key: 400 idempotency-key-missing", r)
t.eq(refunded(ch), 0, "none of them refunded anything")

provider.stop()
t.done()
