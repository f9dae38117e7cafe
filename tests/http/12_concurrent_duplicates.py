"""Transactional strategy under concurrency: 20 identical requests sent at
once create exactly one order (one ledger row) and all get the same 201;
concurrent redemptions with different keys never overdraw a balance."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, concurrently, new_key, quote, sql_value  # noqa: E402

t = Tap()
api = Api().start()
N = 20


def twenty_duplicates_make_one(path, body, table, name):
    key = new_key()
    answers = concurrently(N, api.post, path, body, key=key)
    t.eq([r.status for r in answers], [201] * N, f"{name}: {N} duplicates all get 201")
    t.eq(len({r.body for r in answers}), 1, f"{name}: all {N} bodies are identical")
    t.eq(sum(1 for r in answers if not r.replayed), 1,
         f"{name}: exactly one answer is not a replay")
    t.eq(sql_value(f"select count(*) from {table} where idem_key = {quote(key)}"), "1",
         f"{name}: exactly one row in {table}")


twenty_duplicates_make_one(
    "/v1/orders", {"customer_id": "c-conc", "amount": 5000, "currency": "EUR"},
    "orders", "POST /v1/orders")
twenty_duplicates_make_one(
    "/v1/bonuses", {"customer_id": "c-conc", "points": 7, "reason": "gift"},
    "bonus_ledger", "POST /v1/bonuses")
t.eq(api.get("/v1/bonuses/c-conc").json()["balance"], 57,
     "balance counts the order's 50 points and the gift's 7 once each")

# Twenty different redemptions of 100 against a balance of 1000.
api.post("/v1/bonuses", {"customer_id": "c-drain", "points": 1000, "reason": "gift"},
         key=new_key())
keys = iter([new_key() for _ in range(N)])
answers = concurrently(N, lambda: api.post(
    "/v1/bonuses", {"customer_id": "c-drain", "points": -100, "reason": "redeem"},
    key=next(keys)))
statuses = sorted(r.status for r in answers)
t.eq(statuses, [201] * 10 + [422] * 10,
     "20 concurrent redemptions of 100 from 1000: 10 succeed, 10 are refused")
t.eq(api.get("/v1/bonuses/c-drain").json()["balance"], 0, "the balance ends at 0, not below")

api.stop()
t.done()
