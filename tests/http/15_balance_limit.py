"""Limits on results: no balance passes 2^53-1, the largest integer every
JSON parser reads exactly. An accrual past it, by POST /v1/bonuses or by
the points of POST /v1/orders, is a 422 balance-limit-exceeded problem,
saved and replayed like an insufficient balance, and writes nothing else
(no ledger row, no order). Before, two accruals of 2^53-1 were accepted,
and past 2^63 every later order of the customer was a 500."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key, quote, request, sql_value  # noqa: E402

t = Tap()
api = Api().start()
MAX = 2 ** 53 - 1
CUSTOMER = "c-limit"


def bonus(points, key=None):
    return api.post("/v1/bonuses", {"customer_id": CUSTOMER, "points": points,
                                    "reason": "gift"}, key=key or new_key())


def order(amount, key):
    return api.post("/v1/orders", {"customer_id": CUSTOMER, "amount": amount,
                                   "currency": "RUB"}, key=key)


def balance():
    return api.get(f"/v1/bonuses/{CUSTOMER}").json()["balance"]


def is_limit_problem(r, balance):
    p = r.json()
    return (r.status == 422 and
            r.headers.get("content-type") == "application/problem+json" and
            p["type"].endswith("/problems/balance-limit-exceeded") and
            p["status"] == 422 and p["title"] and p["detail"] and
            p["balance"] == balance)


r = bonus(MAX)
t.ok(r.status == 201 and r.json()["balance"] == MAX, "an accrual of 2^53-1: 201", r)

key = new_key()
r = bonus(MAX, key)
t.ok(is_limit_problem(r, MAX),
     "a second accrual of 2^53-1: 422 balance-limit-exceeded with the balance", r)
again = bonus(MAX, key)
t.ok(again.status == 422 and again.replayed and again.body == r.body,
     "the 422 is saved and replayed byte for byte", again)
t.eq(sql_value(f"select count(*) from bonus_ledger where idem_key = {quote(key)}"), "0",
     "no ledger row for it")

r = bonus(1)
t.ok(is_limit_problem(r, MAX), "even one point past 2^53-1: 422", r)
t.eq(balance(), MAX, "GET /v1/bonuses: the balance is 2^53-1, exactly")

# An order whose points would pass the limit is refused whole.
key = new_key()
r = order(100, key)
t.ok(is_limit_problem(r, MAX), "an order accruing 1 point past the limit: 422", r)
t.eq(sql_value(f"select count(*) from orders where idem_key = {quote(key)}"), "0",
     "and no order row")
again = order(100, key)
t.ok(again.status == 422 and again.replayed and again.body == r.body,
     "the refused order is saved and replayed", again)
t.eq(api.get(f"/v1/orders?customer_id={CUSTOMER}").json()["orders"], [],
     "GET /v1/orders lists no order")
r = order(99, new_key())
t.ok(r.status == 201 and r.json()["bonus_points"] == 0,
     "an order accruing 0 points is still created", r)

# Below the limit again, the customer's orders work.
t.eq(bonus(-1000).status, 201, "after a redemption of 1000 points")
r = order(100000, new_key())
t.ok(r.status == 201 and r.json()["bonus_points"] == 1000,
     "an order accruing 1000 points is created", r)
t.eq(balance(), MAX, "and the balance is 2^53-1 again")

page = request(api.port, "GET", "/problems/balance-limit-exceeded")
t.ok(page.status == 200 and page.headers["content-type"].startswith("text/html") and
     b"2^53-1" in page.body, "the problem type URL serves its page", page)

api.stop()
t.done()
