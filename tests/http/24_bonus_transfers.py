"""POST /v1/bonuses/transfers (transactional): points move from one customer
to another in one transaction (a transfer, two ledger rows, both balances);
a retry replays byte for byte; bad input is a 400 that takes no key; an
insufficient balance and a receiver past 2^53-1 are saved 422s; duplicates
sent at once make one transfer; and transfers sent at once in opposite
directions all go through: none is lost to a deadlock."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Tap, concurrently, fingerprint, metric, new_key, quote,  # noqa: E402
                     request, sql, sql_value)

t = Tap()
api = Api().start()
PATH = "/v1/bonuses/transfers"
MAX = 2 ** 53 - 1
RUN = new_key("t")[:10]


def customer(name):
    """A customer of this run only: the database is shared by every test."""
    return f"{RUN}-{name}"


def give(who, points, client="shop-1"):
    r = api.post("/v1/bonuses", {"customer_id": who, "points": points, "reason": "seed"},
                 key=new_key(), client=client)
    assert r.status == 201, r


def transfer(src, dst, points, key=None, reason="gift", client="shop-1", **extra):
    body = {"from_customer_id": src, "to_customer_id": dst, "points": points,
            "reason": reason}
    body.update(extra)
    return api.post(PATH, body, key=key or new_key(), client=client)


def balance(who, client="shop-1"):
    return api.get(f"/v1/bonuses/{who}", client=client).json()["balance"]


def ledger_sum(who, client="shop-1"):
    return int(sql_value(f"select coalesce(sum(points), 0) from bonus_ledger where"
                         f" client_id = {quote(client)} and customer_id = {quote(who)}"))


def rows_of(key, client="shop-1"):
    """(key rows, transfers, ledger rows) written under a key."""
    q, c = quote(key), quote(client)
    return tuple(int(v) for v in sql(
        f"select (select count(*) from idempotency_keys where client_id = {c} and"
        f" idem_key = {q}), (select count(*) from bonus_transfers where client_id = {c}"
        f" and idem_key = {q}), (select count(*) from bonus_ledger where client_id = {c}"
        f" and idem_key = {q})")[0])


def has_account(who, client="shop-1"):
    return sql_value(f"select count(*) from bonus_accounts where client_id = {quote(client)}"
                     f" and customer_id = {quote(who)}") == "1"


def deadlocks():
    """Deadlocks PostgreSQL has reported in its log so far."""
    path = os.path.join(os.environ["IDEM_TEST_PGDATA"], "server.log")
    with open(path, errors="replace") as f:
        return f.read().count("deadlock detected")


def is_problem(r, status, slug):
    try:
        p = json.loads(r.body)
    except ValueError:
        return False
    return (r.status == status and
            r.headers.get("content-type") == "application/problem+json" and
            p.get("status") == status and bool(p.get("title")) and
            bool(p.get("detail")) and str(p.get("type", "")).endswith("/problems/" + slug))


# --- created, replayed ------------------------------------------------------

A, B = customer("a"), customer("b")
give(A, 1000)
key = new_key()
first = transfer(A, B, 300, key)
tid = sql_value(f"select transfer_id from bonus_transfers where idem_key = {quote(key)}")
t.eq(first.status, 201, "a transfer: 201")
t.eq(first.body, ('{"transfer_id":%s,"from_customer_id":"%s","to_customer_id":"%s",'
                  '"points":300,"from_balance":700,"to_balance":300}' % (tid, A, B)).encode(),
     "its body, exactly: the transfer and both new balances")
t.eq(first.headers.get("content-type"), "application/json", "as JSON")
t.ok(not first.replayed, "the first answer is not a replay")
t.eq(rows_of(key), (1, 1, 2), "one key, one transfer, two ledger rows")
t.eq(sql(f"select customer_id, points, transfer_id from bonus_ledger where idem_key ="
         f" {quote(key)} order by points"), [[A, "-300", tid], [B, "300", tid]],
     "the ledger rows: -300 for the sender, +300 for the receiver, both naming the transfer")
t.eq(sql_value(f"select fingerprint from idempotency_keys where idem_key = {quote(key)}"),
     fingerprint({"from_customer_id": A, "to_customer_id": B, "points": 300,
                  "reason": "gift"}),
     "the fingerprint is of all four fields")
t.eq((balance(A), balance(B)), (700, 300), "GET /v1/bonuses/{id} shows both new balances")

again = transfer(A, B, 300, key)
t.ok(again.status == 201 and again.body == first.body,
     "a retry gets the first status and body byte for byte", again)
t.eq(again.headers.get("idempotent-replayed"), "true", "with Idempotent-Replayed: true")
r = transfer(A, B, 300, key, sent_at="2026-11-30T10:00:00Z", attempt=2)
t.ok(r.status == 201 and r.replayed and r.body == first.body,
     "fields outside the fingerprint do not change it: replayed", r)
r = api.post(PATH, '{"reason":"gift","points":300,\n "to_customer_id":"%s",'
             ' "from_customer_id":"%s"}' % (B, A), key=key)
t.ok(r.status == 201 and r.replayed and r.body == first.body,
     "the same fields in another order and spacing: replayed", r)
t.eq(rows_of(key), (1, 1, 2), "the replays wrote nothing")
t.eq((balance(A), balance(B)), (700, 300), "and moved nothing")

# --- mismatch, key scope ----------------------------------------------------

for what, kw in [("other points", dict(points=301)), ("other reason", dict(reason="gift!")),
                 ("other receiver", dict(dst=customer("c"))),
                 ("the direction reversed", dict(src=B, dst=A))]:
    args = dict(src=A, dst=B, points=300, reason="gift")
    args.update(kw)
    r = transfer(args["src"], args["dst"], args["points"], key, reason=args["reason"])
    t.ok(is_problem(r, 422, "idempotency-key-reused"), f"same key, {what}: 422", r)
t.eq(rows_of(key), (1, 1, 2), "the mismatches executed nothing")
t.eq((balance(A), balance(B)), (700, 300), "nor moved points")

r = api.post("/v1/bonuses", {"customer_id": A, "points": 300, "reason": "gift"}, key=key)
t.ok(is_problem(r, 422, "idempotency-key-reused"),
     "the transfer's key reused for POST /v1/bonuses: 422", r)

give(A, 50, client="shop-2")
r2 = transfer(A, B, 30, key, client="shop-2")
t.ok(r2.status == 201 and not r2.replayed, "the same key from shop-2 is its own transfer", r2)
t.ok(r2.json()["transfer_id"] != first.json()["transfer_id"] and
     r2.json()["from_balance"] == 20 and r2.json()["to_balance"] == 30,
     "between shop-2's customers of the same ids", r2)
t.eq(rows_of(key, "shop-2"), (1, 1, 2), "shop-2's key, transfer and ledger rows")
t.eq((balance(A), balance(B)), (700, 300), "shop-1's balances are untouched")
t.eq((balance(A, "shop-2"), balance(B, "shop-2")), (20, 30), "shop-2's moved")

# --- 400: nothing taken -----------------------------------------------------

GOOD = {"from_customer_id": A, "to_customer_id": B, "points": 1, "reason": "gift"}
bad_key = new_key()
for what, change in [("points 0", {"points": 0}), ("negative points", {"points": -5}),
                     ("fractional points", {"points": 1.5}), ("points 1.0", {"points": 1.0}),
                     ("points as a string", {"points": "1"}), ("points 2^53", {"points": 2 ** 53}),
                     ("the same customers", {"to_customer_id": A}),
                     ("an empty receiver", {"to_customer_id": ""}),
                     ("a numeric sender", {"from_customer_id": 7}),
                     ("a null reason", {"reason": None}), ("a numeric reason", {"reason": 7}),
                     ("no from_customer_id", {"from_customer_id": ...}),
                     ("no to_customer_id", {"to_customer_id": ...}),
                     ("no points", {"points": ...}), ("no reason", {"reason": ...})]:
    body = {k: v for k, v in dict(GOOD, **change).items() if v is not ...}
    before = (balance(A), balance(B))
    r = api.post(PATH, body, key=bad_key, bad=True)
    t.ok(is_problem(r, 400, "invalid-request"), f"{what}: 400 invalid-request", r)
    t.eq(rows_of(bad_key), (0, 0, 0), f"{what}: no key row, no transfer, no ledger row")
    t.eq((balance(A), balance(B)), before, f"{what}: no points moved")

r = api.post(PATH, dict(GOOD, to_customer_id=A), key=bad_key, bad=True)
t.ok("different customers" in r.json().get("detail", ""),
     "the detail says the customers must differ", r)
# The same customer spelled with an escape is the same customer.
raw = ('{"from_customer_id":"%s","to_customer_id":"%s","points":1,"reason":"gift"}'
       % (A, A.replace("-", "\\u002d", 1)))
r = api.post(PATH, raw, key=bad_key, bad=True)
t.ok(is_problem(r, 400, "invalid-request"), "the same customer written with a \\u escape: 400", r)
t.eq(rows_of(bad_key), (0, 0, 0), "and nothing taken")
r = api.post(PATH, GOOD, key=bad_key)
t.ok(r.status == 201 and not r.replayed,
     "after the 400s the same key works with a corrected body", r)
t.eq((balance(A), balance(B)), (699, 301), "and moves its one point")
t.ok(is_problem(api.post(PATH, GOOD, key=None, bad=True), 400, "idempotency-key-missing"),
     "no Idempotency-Key: 400")
t.eq(api.post(PATH, GOOD, key=new_key(), token=False, bad=True).status, 401, "no token: 401")
r = api.post(PATH, GOOD, key=new_key(), content_type="text/plain", bad=True)
t.ok(is_problem(r, 415, "unsupported-media-type"), "not JSON: 415", r)

# --- insufficient balance: saved, replayed, nothing moved --------------------

N = customer("new")
ikey = new_key()
r = transfer(A, N, 700, ikey)
t.ok(is_problem(r, 422, "insufficient-balance"), "transferring more than the balance: 422", r)
t.eq((r.json().get("balance"), r.json().get("detail")),
     (699, f"customer {A} has 699 points and cannot transfer 700"),
     "with the sender's balance")
t.eq(rows_of(ikey), (1, 0, 0), "the key is saved; no transfer, no ledger row")
t.ok(not has_account(N), "the receiver has no account made for it")
give(A, 1000)
again = transfer(A, N, 700, ikey)
t.ok(again.status == 422 and again.replayed and again.body == r.body,
     "the saved 422 is replayed byte for byte, though the balance would do now", again)
t.eq(rows_of(ikey), (1, 0, 0), "the replay moved nothing")
t.eq((balance(A), balance(N)), (1699, 0), "both balances are as before")

r = transfer(customer("nobody"), A, 1)
t.ok(is_problem(r, 422, "insufficient-balance") and r.json()["balance"] == 0,
     "a sender without an account has 0 points: 422", r)
t.ok(not has_account(customer("nobody")), "and still no account")

# --- the receiver's balance stays within 2^53-1 -----------------------------

F = customer("full")
give(F, MAX - 100)
lkey = new_key()
r = transfer(A, F, 101, lkey)
t.ok(is_problem(r, 422, "balance-limit-exceeded") and r.json()["balance"] == MAX - 100,
     "a transfer taking the receiver past 2^53-1: 422 with its balance", r)
t.eq(rows_of(lkey), (1, 0, 0), "saved, with no transfer and no ledger row")
again = transfer(A, F, 101, lkey)
t.ok(again.status == 422 and again.replayed and again.body == r.body, "and replayed", again)
r = transfer(A, F, 100)
t.ok(r.status == 201 and r.json()["to_balance"] == MAX,
     "a transfer up to 2^53-1 exactly: 201", r)
t.eq((balance(A), balance(F)), (1599, MAX), "GET /v1/bonuses/{id}: 1599 and 2^53-1")

# --- concurrency -------------------------------------------------------------

C, D = customer("c"), customer("d")
give(C, 1000)
dkey = new_key()
answers = concurrently(10, transfer, C, D, 5, dkey)
t.eq([a.status for a in answers], [201] * 10, "10 duplicates sent at once: all 201")
t.eq(len({a.body for a in answers}), 1, "all with the same body")
t.eq(sum(1 for a in answers if not a.replayed), 1, "exactly one is not a replay")
t.eq(rows_of(dkey), (1, 1, 2), "one transfer, two ledger rows")
t.eq((balance(C), balance(D)), (995, 5), "5 points moved once")

# Twenty transfers at once, distinct keys, to a receiver with no account
# yet: each waits for the one that made the account.
E = customer("e")
keys = iter([new_key() for _ in range(20)])
answers = concurrently(20, lambda: transfer(C, E, 10, next(keys)))
t.ok(all(a.status == 201 for a in answers),
     "20 transfers at once to a new receiver: all 201", [a for a in answers if a.status != 201])
t.eq((balance(C), balance(E)), (795, 200), "all 20 moved")

# Forty at once in opposite directions: with the accounts locked in the
# order they come, half of them would wait for each other.
P, Q = customer("p"), customer("q")
give(P, 1000)
give(Q, 1000)
dead = deadlocks()
jobs = iter([(P, Q, 10)] * 20 + [(Q, P, 7)] * 20)
answers = concurrently(40, lambda: transfer(*next(jobs)))
t.ok(all(a.status == 201 for a in answers),
     "40 transfers at once, 20 each way: all 201, none lost to a deadlock",
     [a for a in answers if a.status != 201])
t.eq(deadlocks(), dead, "PostgreSQL reported no deadlock")
t.eq((balance(P), balance(Q)), (1000 - 200 + 140, 1000 + 200 - 140),
     "each balance is 1000 plus what it received minus what it sent")
t.eq(balance(P) + balance(Q), 2000, "the sum of the two balances is preserved")
t.eq((ledger_sum(P), ledger_sum(Q)), (balance(P), balance(Q)),
     "each balance equals the sum of its ledger")
t.eq(int(sql_value("select count(*) from bonus_transfers where from_customer_id in"
                   f" ({quote(P)}, {quote(Q)})")), 40, "40 transfers")
t.eq(int(sql_value("select count(*) from bonus_ledger l join bonus_transfers x using"
                   f" (transfer_id) where x.from_customer_id in ({quote(P)}, {quote(Q)})")),
     80, "with two ledger rows each")

# --- the route ----------------------------------------------------------------

r = api.get(PATH)
t.ok(r.status == 405 and r.headers.get("allow") == "POST" and
     r.headers.get("content-type") == "application/problem+json",
     "GET /v1/bonuses/transfers: 405 with Allow: POST, not a balance", r)
before = api.get("/v1/bonuses/%74ransfers").json()["balance"]
give("transfers", 3)
r = api.get("/v1/bonuses/%74ransfers")
t.ok(r.status == 200 and r.json() == {"customer_id": "transfers", "balance": before + 3},
     "a customer named transfers is read percent-encoded", r)
t.ok(metric(api.port, "idem_requests_total",
            'route="POST /v1/bonuses/transfers",outcome="created"') >= 1,
     "the route has its own metrics")

api.stop()
t.done()
