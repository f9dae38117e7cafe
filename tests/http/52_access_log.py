"""The API writes one logfmt access line per request (src/core/
accesslog.c): time, method, path, status, client, key, outcome,
duration_ms, replayed, request_id (the edge's X-Request-Id); never the
token. The outcome is the metrics' one,
refunds refused before their key is taken included; a malformed key is
logged as "-", not the part of it read before the fault."""

import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (TOKENS, Api, Background, Provider, Tap, metric,  # noqa: E402
                     new_key, request, wait_until)

t = Tap()
provider = Provider(name="access-provider", IDEM_PROVIDER_LATENCY_MS=1000,
                    IDEM_PROVIDER_TIMEOUT_MS=3000).start()
api = Api(name="access", IDEM_PROVIDER_URL=provider.url,
          IDEM_PROVIDER_TIMEOUT_MS=3000).start()

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
                        "outcome", "duration_ms", "replayed", "request_id"]),
     "each line has every field")
t.eq(a["request_id"], "-", "no X-Request-Id: request_id=-")

# The edge's request id (haproxy's unique-id header), as received; a value
# that could forge a field is quoted.
for rid, logged in [("0a1b2c3d:4e5f-a", "0a1b2c3d:4e5f-a"),
                    ('x" key=forged', '"x\\" key=forged"')]:
    k = new_key("rid")
    r = api.post("/v1/orders", order, key=k, headers={"X-Request-Id": rid})
    t.eq(r.status, 201, f"an order with X-Request-Id {rid!r}")
    l = wait_until(lambda: lines_of(k), "its line")[0]
    t.eq((l["request_id"], l["key"]), (logged, k),
         f"logged as request_id={logged}, nothing forged")
t.ok(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", a["time"]),
     "time is RFC 3339 UTC", a["time"])
t.eq((a["method"], a["path"], a["status"], a["client"], a["outcome"],
      a["replayed"]), ("POST", "/v1/orders", "201", "shop-1", "created",
                       "false"), "the first: created")
t.eq((b["status"], b["outcome"], b["replayed"]), ("201", "replayed", "true"),
     "the second: replayed")
t.ok(a["duration_ms"].isdigit(), "duration in milliseconds")

quoted = new_key("q")
r = api.post("/v1/orders", {"customer_id": "c-log"}, key=f'"{quoted}"', bad=True)
t.eq(r.status, 400, "a bad body")
l = wait_until(lambda: lines_of(quoted), "its line")[0]
t.eq((l["status"], l["outcome"], l["key"]), ("400", "invalid_400", quoted),
     "is logged with the key as read (RFC 8941 quotes removed)")

odd = 'k"x=1 y'
r = api.post("/v1/orders", order, key=odd, token="nope", bad=True)
t.eq(r.status, 401, "an unknown token")
# The line is written when Kore frees the request, which may come after
# the client has read the answer: waited for, as the lines above.
try:
    wait_until(lambda: 'outcome=unauthorized_401' in api.read_log(), "its line")
except TimeoutError:
    pass
log = api.read_log()
t.ok('outcome=unauthorized_401' in log and 'client=- ' in log,
     "is logged without a client", log[-600:])
t.ok(all(tok not in log for tok in list(TOKENS.values()) + ["nope"]),
     "no token is ever logged")

def access_lines():
    return [l for l in api.read_log().splitlines() if " access " in l]


# A malformed key: refused, and logged as "-" (not "a", the part before the
# space).
head = new_key("cut")
before = len(access_lines())
r = api.post("/v1/orders", order, key=f'"{head} b"', bad=True)
t.eq(r.status, 400, "a key with a space: 400")
wait_until(lambda: len(access_lines()) > before, "its line")
t.eq(lines_of(head), [], "its first part is not logged as the key")
t.ok(re.search(r"path=/v1/orders status=400 client=shop-1 key=- "
               r"outcome=invalid_400 ", access_lines()[-1]),
     "the line says key=-", access_lines()[-1])

# Refunds refused before the key is taken: the outcome /metrics counts.
payment = api.post("/v1/payments", {"amount": 10000, "currency": "RUB",
                                    "recipient": new_key("acc")}, key=new_key("pay"))
t.eq(payment.status, 201, "a payment to refund")
pid = payment.json()["payment_id"]


def refund(amount, key, payment_id=pid):
    return api.post("/v1/refunds", {"payment_id": payment_id, "amount": amount}, key=key)


for what, status, outcome, args in [
        ("more than the payment", 422, "invalid_400", (10001,)),
        ("an unknown payment", 404, "invalid_400", (100, None, 9007199254740991))]:
    k = new_key("ref")
    counted = metric(api.port, "idem_requests_total",
                     f'route="POST /v1/refunds",outcome="{outcome}"')
    r = refund(args[0], k, *args[2:])
    t.eq(r.status, status, f"a refund of {what}: {status}")
    l = wait_until(lambda: lines_of(k), "its line")[0]
    t.eq((l["status"], l["outcome"]), (str(status), outcome),
         f"a refund of {what}: logged with outcome={outcome}")
    t.eq(metric(api.port, "idem_requests_total",
                f'route="POST /v1/refunds",outcome="{outcome}"'), counted + 1,
         f"a refund of {what}: the outcome /metrics counted")

# A second refund while one of 6000 is at the provider: 409 refund-in-progress.
k1, k2 = new_key("ref"), new_key("ref")
first = Background(refund, 6000, k1)
wait_until(lambda: provider.refunds(f"shop-1:{k1}"), "the first refund at the provider")
r = refund(6000, k2)
t.eq(r.status, 409, "a refund that does not fit beside one in flight: 409")
l = wait_until(lambda: lines_of(k2), "its line")[0]
t.eq((l["status"], l["outcome"]), ("409", "in_flight_409"),
     "logged with outcome=in_flight_409")
t.eq(first.wait().status, 201, "the refund in flight: 201")

request(api.port, "GET", "/healthz")
request(api.port, "GET", "/nowhere")
wait_until(lambda: "path=/nowhere status=404" in api.read_log(),
           "the 404's line")
t.ok(re.search(r"access time=\S+ method=GET path=/healthz status=200 client=- "
               r"key=- outcome=ok duration_ms=\d+ replayed=false request_id=-",
               api.read_log()), "every request has its line, /healthz too")

api.stop()
provider.stop()
t.done()
