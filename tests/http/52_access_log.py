"""The API writes one logfmt access line per request (src/core/
accesslog.c): time, method, path, status, client, key, outcome,
duration_ms, replayed; never the token."""

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import TOKENS, Api, Tap, new_key, request, wait_until  # noqa: E402

t = Tap()
api = Api(name="access").start()

FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')


def lines_of(key):
    out = []
    for line in api.read_log().splitlines():
        if " access " not in line:
            continue
        fields = {k: v for k, v in FIELD.findall(line.split(" access ", 1)[1])}
        if fields.get("key") == key:
            out.append(fields)
    return out


key = new_key("log")
order = {"customer_id": "c-log", "amount": 1000, "currency": "RUB"}
first = api.post("/v1/orders", order, key=key)
again = api.post("/v1/orders", order, key=key)
t.eq((first.status, again.status, again.replayed), (201, 201, True),
     "an order and its replay")

got = wait_until(lambda: len(lines_of(key)) == 2 and lines_of(key),
                 "two access lines of the key")
a, b = got
t.eq(sorted(a), sorted(["time", "method", "path", "status", "client", "key",
                        "outcome", "duration_ms", "replayed"]),
     "each line has every field")
t.ok(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", a["time"]),
     "time is RFC 3339 UTC", a["time"])
t.eq((a["method"], a["path"], a["status"], a["client"], a["outcome"],
      a["replayed"]), ("POST", "/v1/orders", "201", "shop-1", "created",
                       "false"), "the first: created")
t.eq((b["status"], b["outcome"], b["replayed"]), ("201", "replayed", "true"),
     "the second: replayed")
t.ok(a["duration_ms"].isdigit(), "duration in milliseconds")

quoted = new_key("q")
r = api.post("/v1/orders", {"customer_id": "c-log"}, key=f'"{quoted}"')
t.eq(r.status, 400, "a bad body")
l = wait_until(lambda: lines_of(quoted), "its line")[0]
t.eq((l["status"], l["outcome"], l["key"]), ("400", "invalid_400", quoted),
     "is logged with the key as read (RFC 8941 quotes removed)")

odd = 'k"x=1 y'
r = api.post("/v1/orders", order, key=odd, token="nope")
t.eq(r.status, 401, "an unknown token")
log = api.read_log()
t.ok('outcome=unauthorized_401' in log and 'client=- ' in log,
     "is logged without a client", log[-600:])
t.ok(all(tok not in log for tok in list(TOKENS.values()) + ["nope"]),
     "no token is ever logged")

request(api.port, "GET", "/healthz")
request(api.port, "GET", "/nowhere")
wait_until(lambda: "path=/nowhere status=404" in api.read_log(),
           "the 404's line")
t.ok(re.search(r"access time=\S+ method=GET path=/healthz status=200 client=- "
               r"key=- outcome=ok duration_ms=\d+ replayed=false",
               api.read_log()), "every request has its line, /healthz too")

api.stop()
t.done()
