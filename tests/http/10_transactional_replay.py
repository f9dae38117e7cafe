"""Transactional strategy, one request at a time: replay, fingerprint,
mismatch, key scope per client, reads. For POST /v1/orders and
POST /v1/bonuses."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, fingerprint, new_key, quote, sql, sql_value  # noqa: E402

t = Tap()
api = Api().start()


def count_orders(key, client="shop-1"):
    return int(sql_value(f"select count(*) from orders where idem_key = "
                         f"{quote(key)} and client_id = {quote(client)}"))


def retry_gets_identical_bytes_and_the_header(path, body, rows):
    key = new_key()
    first = api.post(path, body, key=key)
    again = api.post(path, body, key=key)
    t.eq(first.status, 201, f"{path}: first request is created")
    t.ok(not first.replayed, f"{path}: first answer is not marked replayed")
    t.eq(again.status, 201, f"{path}: retry gets the first status")
    t.eq(again.body, first.body, f"{path}: retry gets the first body byte for byte")
    t.eq(again.headers.get("idempotent-replayed"), "true",
         f"{path}: retry carries Idempotent-Replayed: true")
    t.eq(rows(key), 1, f"{path}: one business row for the key")
    return key, first


# Orders.
order = {"customer_id": "c-replay", "amount": 150000, "currency": "RUB",
         "comment": "первый заказ ✓"}
key, first = retry_gets_identical_bytes_and_the_header(
    "/v1/orders", order, count_orders)
t.eq(first.json()["bonus_points"], 1500, "an order accrues floor(amount/100) points")
t.eq(first.headers.get("content-type"), "application/json", "created answer is JSON")

stored = sql_value(f"select fingerprint from idempotency_keys where idem_key = {quote(key)}")
t.eq(stored, fingerprint(order),
     "stored fingerprint is SHA-256 of Python's canonical JSON of the fields")

# A client timestamp and an attempt counter are not part of the operation.
extra = dict(order, sent_at="2026-11-30T10:00:00Z", attempt=2)
r = api.post("/v1/orders", extra, key=key)
t.ok(r.status == 201 and r.replayed and r.body == first.body,
     "fields outside the fingerprint do not change it: retry replays", r)

# Key order and whitespace in the JSON do not matter either.
reordered = '{ "currency":"RUB",\n "comment":"первый заказ ✓", "amount":150000, "customer_id":"c-replay"}'
r = api.post("/v1/orders", reordered, key=key)
t.ok(r.status == 201 and r.replayed, "same fields in another order replay", r)

# The RFC 8941 string form names the same key.
r = api.post("/v1/orders", order, key=f'"{key}"')
t.ok(r.status == 201 and r.replayed and r.body == first.body,
     'the quoted key "k" is the key k', r)

# Another amount under the same key: 422, nothing executed.
r = api.post("/v1/orders", dict(order, amount=150001), key=key)
t.eq(r.status, 422, "same key, other amount: 422")
t.eq(r.headers.get("content-type"), "application/problem+json", "422 is problem+json")
t.ok(r.json()["type"].endswith("/problems/idempotency-key-reused"), "422 type", r)
t.eq(count_orders(key), 1, "mismatch executed nothing")
r = api.post("/v1/orders", {k: v for k, v in order.items() if k != "comment"}, key=key)
t.eq(r.status, 422, "same key without the optional comment: 422 (comment is in the fingerprint)")

# The same key from the other client is another operation.
r2 = api.post("/v1/orders", order, key=key, client="shop-2")
t.eq(r2.status, 201, "same key from shop-2: created")
t.ok(not r2.replayed, "shop-2 does not get shop-1's replay")
t.ok(r2.json()["order_id"] != first.json()["order_id"], "shop-2 gets its own order")
t.eq(count_orders(key, "shop-2"), 1, "shop-2 has its own order row")

# Reads see only the calling client's data.
mine = api.get("/v1/orders?customer_id=c-replay").json()["orders"]
theirs = api.get("/v1/orders?customer_id=c-replay", client="shop-2").json()["orders"]
t.eq([o["order_id"] for o in mine], [first.json()["order_id"]], "shop-1 lists its order only")
t.eq([o["order_id"] for o in theirs], [r2.json()["order_id"]], "shop-2 lists its order only")
t.eq(mine[0]["comment"], "первый заказ ✓", "order list keeps UTF-8 text")
t.eq(api.get("/v1/bonuses/c-replay").json(), {"customer_id": "c-replay", "balance": 1500},
     "balance of shop-1's customer")
t.eq(api.get("/v1/bonuses/c-replay", client="shop-2").json()["balance"], 1500,
     "shop-2's customer of the same id has its own balance")
t.eq(api.get("/v1/bonuses/nobody").json(), {"customer_id": "nobody", "balance": 0},
     "unknown customer has balance 0")
t.eq(api.get("/v1/bonuses/c%2Dreplay").json()["balance"], 1500,
     "customer id in the path is URL-decoded")

# An order under 100 minor units accrues nothing and writes no ledger row.
small_key = new_key()
r = api.post("/v1/orders", {"customer_id": "c-small", "amount": 99, "currency": "USD"},
             key=small_key)
t.ok(r.status == 201 and r.json()["bonus_points"] == 0, "amount 99 accrues 0 points", r)
t.eq(sql_value(f"select count(*) from bonus_ledger where idem_key = {quote(small_key)}"),
     "0", "no ledger row for 0 points")


# Bonuses.
def count_entries(key):
    return int(sql_value(f"select count(*) from bonus_ledger where idem_key = {quote(key)}"
                         " and order_id is null"))


bkey, bfirst = retry_gets_identical_bytes_and_the_header(
    "/v1/bonuses", {"customer_id": "c-replay", "points": -500, "reason": "redeem"},
    count_entries)
t.eq(bfirst.json(), {"entry_id": bfirst.json()["entry_id"], "customer_id": "c-replay",
                     "points": -500, "balance": 1000}, "redeem answers the new balance")
r = api.post("/v1/bonuses", {"customer_id": "c-replay", "points": -500, "reason": "redeem",
                             "sent_at": "2026-11-30T10:00:00Z", "attempt": 3}, key=bkey)
t.ok(r.status == 201 and r.replayed and r.body == bfirst.body,
     "/v1/bonuses: fields outside the fingerprint do not change it", r)
r = api.post("/v1/bonuses", {"customer_id": "c-replay", "points": -501, "reason": "redeem"},
             key=bkey)
t.eq(r.status, 422, "/v1/bonuses: same key, other points: 422")
t.eq(count_entries(bkey), 1, "/v1/bonuses: the mismatch wrote nothing")

# An insufficient balance is an outcome: saved, replayed, no ledger row.
ikey = new_key()
body = {"customer_id": "c-replay", "points": -5000, "reason": "redeem"}
r = api.post("/v1/bonuses", body, key=ikey)
t.eq(r.status, 422, "redeeming more than the balance: 422")
problem = r.json()
t.ok(problem["type"].endswith("/problems/insufficient-balance") and
     problem["status"] == 422 and problem["balance"] == 1000,
     "insufficient-balance problem with the balance", r)
t.eq(count_entries(ikey), 0, "no ledger row for the refused redemption")
api.post("/v1/bonuses", {"customer_id": "c-replay", "points": 10000, "reason": "gift"},
         key=new_key())
again = api.post("/v1/bonuses", body, key=ikey)
t.ok(again.status == 422 and again.replayed and again.body == r.body,
     "the saved 422 is replayed even after the balance grew", again)
t.eq(count_entries(ikey), 0, "the replay wrote no ledger row")
t.eq(api.get("/v1/bonuses/c-replay").json()["balance"], 11000, "balance is 1000 + 10000")

r = api.post("/v1/bonuses", {"customer_id": "c-replay", "points": -500, "reason": "redeem"},
             key=key)
t.eq(r.status, 422, "a key used for an order, reused for a bonus: 422")
t.ok(r.json()["type"].endswith("/problems/idempotency-key-reused"), "it is a key reuse", r)

api.stop()
t.done()
