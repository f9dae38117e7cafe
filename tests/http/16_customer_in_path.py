"""GET /v1/bonuses/{customer_id}: the customer id is a path segment, so
only %XX is decoded; a + is a plus, as RFC 3986 has it (the "+ means
space" rule belongs to query strings and forms)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key  # noqa: E402

t = Tap()
api = Api().start()


def accrue(customer, points):
    r = api.post("/v1/bonuses", {"customer_id": customer, "points": points,
                                 "reason": "gift"}, key=new_key())
    t.eq(r.status, 201, f"customer {customer!r} gets {points} points")


# Two customers whose ids a wrong decoder would mix up.
accrue("a+b", 100)
accrue("a b", 7)

for path, customer, balance in [("/v1/bonuses/a+b", "a+b", 100),
                                ("/v1/bonuses/a%2Bb", "a+b", 100),
                                ("/v1/bonuses/a%2bb", "a+b", 100),
                                ("/v1/bonuses/a%20b", "a b", 7)]:
    r = api.get(path)
    t.ok(r.status == 200 and r.json() == {"customer_id": customer, "balance": balance},
         f"GET {path}: the balance of {customer!r}", r)

for path, what in [("/v1/bonuses/a%2", "a % without two hex digits"),
                   ("/v1/bonuses/a%zzb", "a % followed by non-hex"),
                   ("/v1/bonuses/a%00b", "an encoded NUL"),
                   ("/v1/bonuses/a%0Ab", "an encoded newline")]:
    r = api.get(path, bad=True)
    t.ok(r.status == 400 and r.json()["type"].endswith("/problems/invalid-request"),
         f"GET with {what} in the customer id: 400", r)

api.stop()
t.done()
