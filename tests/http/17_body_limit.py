"""The body limit: a body of exactly 64 KiB is served; one byte more is
refused with a 413 by Kore itself, from the Content-Length, before the
body is read and before any handler (authentication included) runs. So
nobody, with or without a token, makes a worker buffer more than 64 KiB."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key, quote, sql_value  # noqa: E402

t = Tap()
api = Api().start()
LIMIT = 64 * 1024


def order_of_size(n, customer="c-size"):
    """A valid order of exactly n bytes (a member outside the fields pads it)."""
    text = json.dumps({"customer_id": customer, "amount": 1000, "currency": "RUB",
                       "pad": ""})
    text = text.replace('"pad": ""', '"pad": "' + "x" * (n - len(text)) + '"')
    assert len(text) == n
    return text


def orders(key):
    return int(sql_value(f"select count(*) from orders where idem_key = {quote(key)}"))


key = new_key()
r = api.post("/v1/orders", order_of_size(LIMIT), key=key)
t.eq(r.status, 201, "a body of exactly 64 KiB is served: 201")
t.eq(orders(key), 1, "and its order is written")

key = new_key()
r = api.post("/v1/orders", order_of_size(LIMIT + 1), key=key)
t.eq(r.status, 413, "a body of 64 KiB + 1 byte: 413")
t.ok(r.body == b"" and r.headers.get("connection") == "close",
     "Kore's own 413: no body, and the connection is closed (docs/behaviour.md)", r.headers)
t.eq(orders(key), 0, "nothing is written")
t.eq(sql_value(f"select count(*) from idempotency_keys where idem_key = {quote(key)}"),
     "0", "the key is not taken")
r = api.post("/v1/orders", order_of_size(LIMIT), key=key)
t.ok(r.status == 201 and not r.replayed, "the same key then works with a smaller body", r)

# Refused before authentication: the body was never read, so no token is
# looked at either.
r = api.post("/v1/orders", order_of_size(LIMIT + 1), key=new_key(), token=False, bad=True)
t.eq(r.status, 413, "64 KiB + 1 byte without a token: 413, not 401")
r = api.post("/v1/orders", order_of_size(LIMIT), key=new_key(), token=False, bad=True)
t.eq(r.status, 401, "64 KiB without a token: 401")

api.stop()
t.done()
