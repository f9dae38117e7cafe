"""GET /openapi.json serves docs/openapi.json, the OpenAPI 3.1 document of
every route of the route table; GET /docs serves the page that renders
it. The checker every test runs on the API's responses (tests/lib/
openapi.py) refuses what the document does not describe."""

import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, Api, Tap, new_key, request  # noqa: E402
import openapi  # noqa: E402

t = Tap()
api = Api().start()

with open(os.path.join(ROOT, "docs", "openapi.json"), "rb") as f:
    committed = f.read()
doc = json.loads(committed)

r = request(api.port, "GET", "/openapi.json")
t.eq((r.status, r.headers.get("content-type")), (200, "application/json"),
     "GET /openapi.json: 200 application/json, without a token")
t.ok(r.body == committed, "it is docs/openapi.json, byte for byte")
t.eq(doc["openapi"], "3.1.0", "an OpenAPI 3.1 document")

again = request(api.port, "GET", "/openapi.json",
                headers={"If-None-Match": r.headers.get("etag", "")})
t.eq(again.status, 304, "with its ETag it is not sent again")

with open(os.path.join(ROOT, "src", "operations", "routes.c")) as f:
    table = re.sub(r"#if defined\(DEV_ROUTES\).*?#endif", "", f.read(),
                   flags=re.S)
labels = re.findall(r'HTTP_METHOD_\w+,\s*"[^"]*",\s*"([A-Z]+ [^"]+)"', table)
documented = {f"{m.upper()} {p}" for p, item in doc["paths"].items()
              for m in item}
extra = {"GET /healthz", "GET /metrics", "GET /openapi.json", "GET /docs"}
t.ok(len(labels) >= 8, f"routes.c lists {len(labels)} routes")
t.eq(sorted((set(labels) | extra) - documented), [],
     "every route of routes.c and the operations' routes are documented")
t.eq(sorted(documented - set(labels) - extra), [],
     "and nothing else")

slugs = [p["slug"] for p in
         json.loads(request(api.port, "GET", "/dev/problems").body)]
t.eq(sorted(doc["components"]["schemas"]["ProblemType"]["enum"]),
     sorted(slugs), "every problem type of the service is enumerated")

for label in sorted(documented):
    method, path = label.split(" ", 1)
    op = doc["paths"][path][method.lower()]
    if path.startswith("/v1/"):
        t.ok(any(s >= "400" for s in op["responses"]) and
             all("description" in v for v in op["responses"].values()),
             f"{label}: its error responses are documented")
    if method == "POST":
        params = [p.get("$ref", "") for p in op.get("parameters", [])]
        props = doc["components"]["schemas"][
            op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            .split("/")[-1]]["properties"]
        t.ok("#/components/parameters/IdempotencyKey" in params and
             all("maxLength" in s or "maximum" in s or "pattern" in s
                 for s in props.values() if "type" in s),
             f"{label}: Idempotency-Key and the body's field limits")
        t.ok("Idempotent-Replayed" in op["responses"]["201"].get("headers", {}),
             f"{label}: 201 says it may be a replay")

d = request(api.port, "GET", "/docs")
t.ok(d.status == 200 and d.headers.get("content-type", "").startswith("text/html"),
     "GET /docs: an HTML page", d)
t.ok(b"fetch(\"/openapi.json\")" in d.body and
     not re.search(rb"(src|href)=\"(https?:)?//", d.body),
     "it reads /openapi.json and loads nothing from another origin")
t.ok("default-src 'self'" in d.headers.get("content-security-policy", ""),
     "and its Content-Security-Policy keeps it to this origin")

for path in ("/openapi.json", "/docs"):
    p = request(api.port, "POST", path, b"{}", {"Content-Type": "application/json"})
    t.ok(p.status == 405 and p.headers.get("allow") == "GET" and
         p.headers.get("content-type") == "application/problem+json",
         f"POST {path}: a 405 problem", p)

# The checker is not vacuous: what the document does not say fails.
ok = api.post("/v1/orders", {"customer_id": "c-oas", "amount": 1000,
                             "currency": "RUB"}, key=new_key())
t.eq(ok.status, 201, "an order, checked against the document")
hdrs = {"content-type": "application/json"}
t.eq(openapi.check("POST", "/v1/orders", 201, hdrs, ok.body), None,
     "the checker accepts it")
body = dict(ok.json(), surprise=1)
t.ok(openapi.check("POST", "/v1/orders", 201, hdrs, json.dumps(body)) is not None,
     "a member the document does not list is refused")
body = dict(ok.json(), amount="1000")
t.ok(openapi.check("POST", "/v1/orders", 201, hdrs, json.dumps(body)) is not None,
     "an ill-typed member is refused")
t.ok(openapi.check("POST", "/v1/orders", 418, hdrs, ok.body) is not None,
     "an undocumented status is refused")
t.ok(openapi.check("POST", "/v1/payments", 409,
                   {"content-type": "application/problem+json"},
                   json.dumps({"type": "http://x/problems/request-in-progress",
                               "title": "A request with this Idempotency-Key "
                               "is still in progress", "status": 409,
                               "detail": "x"})) is not None,
     "a 409 without Retry-After is refused")
t.eq(openapi.check("GET", "/dev/problems", 200, hdrs, b"[]"), None,
     "paths the document does not describe are not checked")

api.stop()
t.done()
