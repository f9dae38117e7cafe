"""Every bad input of the contract gets its status and a problem+json body,
changes nothing, and does not take the key: the same key then works with a
corrected request."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key, quote, request, sql_value  # noqa: E402

t = Tap()
api = Api().start()

GOOD = {
    "/v1/orders": {"customer_id": "c-bad", "amount": 1000, "currency": "RUB"},
    "/v1/bonuses": {"customer_id": "c-bad", "points": 10, "reason": "gift"},
}


def rows():
    return sql_value("select (select count(*) from orders) + "
                     "(select count(*) from bonus_ledger) + "
                     "(select count(*) from idempotency_keys)")


def rejected(path, status, slug, name, body=None, **kw):
    """Sends a bad request; checks the problem and that nothing changed,
    then that the same key works with the good request."""
    key = kw.pop("key", new_key())
    before = rows()
    r = api.post(path, GOOD[path] if body is None else body, key=key, bad=True, **kw)
    t.eq(r.status, status, f"{path}: {name}: {status}")
    try:
        p = json.loads(r.body)
    except ValueError:
        p = {}
    ok = (r.headers.get("content-type") == "application/problem+json" and
          p.get("status") == status and p.get("title") and p.get("detail") and
          str(p.get("type", "")).endswith("/problems/" + slug))
    t.ok(ok, f"{path}: {name}: problem+json of type {slug}", r)
    t.eq(rows(), before, f"{path}: {name}: nothing written")
    return key


def then_the_key_works(path, key, name):
    r = api.post(path, GOOD[path], key=key)
    t.ok(r.status == 201 and not r.replayed,
         f"{path}: after {name}, the same key works with a corrected request", r)


for path in ("/v1/orders", "/v1/bonuses"):
    k = rejected(path, 401, "unauthorized", "no token", token=False)
    then_the_key_works(path, k, "no token")
    k = rejected(path, 401, "unauthorized", "unknown token", token="nope")
    then_the_key_works(path, k, "unknown token")
    rejected(path, 401, "unauthorized", "not a bearer scheme",
             token=False, headers={"Authorization": "Basic ZGV2LXNob3AtMQ=="})

    rejected(path, 400, "idempotency-key-missing", "no Idempotency-Key", key=None)
    # Kore's HTTP parser itself refuses a header with an empty value or a
    # byte past 0x7E: a bare 400 before any handler runs (docs/limits.md).
    for bad, what in [("", "empty key"), ("é", "non-ASCII"), ("tab\there", "a tab")]:
        before = rows()
        r = api.post(path, GOOD[path], key=bad, bad=True)
        t.eq(r.status, 400, f"{path}: key with {what}: 400 from the HTTP layer")
        t.eq(rows(), before, f"{path}: key with {what}: nothing written")
    for bad, what in [("a" * 256, "256 characters"), ("has space", "a space"),
                      ('""', "empty quoted key"), ('"abc', "unterminated quote"),
                      ('"a\\b"', "bad escape"), ('"a"b', "text after the quote")]:
        rejected(path, 400, "idempotency-key-malformed", f"key with {what}", key=bad)

    k = rejected(path, 415, "unsupported-media-type", "text/plain body",
                 content_type="text/plain")
    then_the_key_works(path, k, "415")
    rejected(path, 415, "unsupported-media-type", "no Content-Type", content_type=None)

    # Past 64 KiB Kore itself answers, before any handler: a bare 413
    # (docs/behaviour.md, Bodies); tests/http/17_body_limit.py tests both sides of the limit.
    k, before = new_key(), rows()
    r = api.post(path, dict(GOOD[path], pad="x" * 70000), key=k, bad=True)
    t.ok(r.status == 413 and r.body == b"", f"{path}: body over 64 KiB: bare 413", r)
    t.eq(rows(), before, f"{path}: body over 64 KiB: nothing written")
    then_the_key_works(path, k, "413")

    for raw, what in [("{", "truncated JSON"), ("", "empty body"),
                      ('{"a":1,"a":2}', "duplicate member"),
                      ('{"a":"\\ud800"}', "lone surrogate"),
                      (b'{"a":"\xff"}', "invalid UTF-8"),
                      ('{"a":1} x', "trailing data"), ("[1,]", "trailing comma"),
                      ('{"a":NaN}', "NaN"), ('{"a":01}', "leading zero")]:
        k = rejected(path, 400, "invalid-json", what, body=raw)
    then_the_key_works(path, k, "malformed JSON")

    rejected(path, 400, "invalid-request", "a JSON array body", body="[]")

for field, value, what in [
        ("amount", None, "missing amount"), ("amount", 10.0, "float amount"),
        ("amount", 1e3, "amount in exponent form"), ("amount", "1000", "string amount"),
        ("amount", -5, "negative amount"), ("amount", 0, "zero amount"),
        ("amount", 2 ** 53, "amount 2^53"), ("amount", True, "boolean amount"),
        ("currency", "rub", "lower-case currency"), ("currency", "RUBL", "4-letter currency"),
        ("currency", None, "missing currency"), ("customer_id", "", "empty customer_id"),
        ("customer_id", "x" * 129, "129-byte customer_id"), ("customer_id", 42, "numeric customer_id"),
        ("customer_id", "a\nb", "customer_id with a newline"), ("comment", None, "null comment"),
        ("comment", "a\u0000b", "comment with NUL")]:
    body = dict(GOOD["/v1/orders"])
    if value is None and field != "comment":
        del body[field]
    else:
        body[field] = value
    k = rejected("/v1/orders", 400, "invalid-request", what, body=body)
then_the_key_works("/v1/orders", k, "an ill-typed field")

r = api.post("/v1/orders", dict(GOOD["/v1/orders"], amount=2 ** 53 - 1), key=new_key())
t.eq(r.status, 201, "amount 2^53-1 is accepted")

for field, value, what in [("points", 0, "zero points"), ("points", 1.5, "fractional points"),
                           ("points", -(2 ** 53), "points below -(2^53-1)"),
                           ("reason", None, "missing reason"), ("reason", 7, "numeric reason")]:
    body = dict(GOOD["/v1/bonuses"])
    if value is None:
        del body[field]
    else:
        body[field] = value
    rejected("/v1/bonuses", 400, "invalid-request", what, body=body)

# The problem type URLs resolve to pages the service serves.
r = api.post("/v1/orders", GOOD["/v1/orders"], key=new_key(), token=False, bad=True)
path = "/" + r.json()["type"].split("/", 3)[3]
page = request(api.port, "GET", path)
t.ok(page.status == 200 and page.headers["content-type"].startswith("text/html") and
     b"Missing or unknown bearer token" in page.body, "the problem type URL serves its page", page)

# Routes and methods.
r = request(api.port, "GET", "/v1/nothing")
t.ok(r.status == 404 and r.headers.get("content-type") == "application/problem+json",
     "unknown path: 404 problem", r)
r = request(api.port, "DELETE", "/v1/orders", headers={"Authorization": "Bearer dev-shop-1"})
t.ok(r.status == 405 and "POST" in r.headers.get("allow", ""), "DELETE /v1/orders: 405 with Allow", r)
r = api.get("/v1/orders", bad=True)
t.ok(r.status == 400 and r.json()["type"].endswith("/invalid-request"),
     "GET /v1/orders without customer_id: 400", r)
r = request(api.port, "GET", "/v1/orders?customer_id=x", bad=True)
t.eq(r.status, 401, "GET /v1/orders without a token: 401")
r = request(api.port, "GET", "/v1/bonuses/x", bad=True)
t.eq(r.status, 401, "GET /v1/bonuses/x without a token: 401")

api.stop()
t.done()
