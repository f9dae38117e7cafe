"""The tables grow, in a copy of the tree: fields declare limits narrower
than their kind's in their own table, and the route table has more routes
than the metrics once held (ROUTE_MAX, 16 with the dev routes). Then:

- the copy's OpenAPI document gives each declared limit (bonuses' points:
  minimum 1 and maximum 1,000,000, where the kind says 2^53-1), and its
  description says the same rule as the field's 400;
- the copy's service answers each boundary and one past it as the
  document says (tests/lib/openapi.py, boundaries(): the bad-input
  catalogue's rows), a 400 whose detail is the field's rule past it;
- it starts with 20 more routes, serves the last of them, and counts its
  requests on its own label in /metrics."""

import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import openapi  # noqa: E402
from harness import Api, Tap, copy_tree, metric, new_key, post  # noqa: E402

t = Tap()
copy = copy_tree("tables")
EXTRA = 20


def edit(path, old, new):
    p = os.path.join(copy, path)
    with open(p) as f:
        text = f.read()
    t.ok(old in text, f"{path} has the line to edit", old)
    with open(p, "w") as f:
        f.write(text.replace(old, new, 1))


# Limits declared in the tables, each narrower than its kind's.
edit("src/operations/bonuses.c", '"Points to accrue (> 0) or redeem (< 0)." },',
     '"Points to accrue.", IDEM_RANGE(1, 1000000) },')
edit("src/operations/bonuses.c", '{ "reason",		FIELD_TEXT,	1, 1, "Why." },',
     '{ "reason",		FIELD_TEXT,	1, 1, "Why.", IDEM_LENGTH(2, 40) },')
edit("src/operations/orders.c", '{ "currency",		FIELD_CURRENCY,	1, 1, "Its currency." },',
     '{ "currency",		FIELD_CURRENCY,	1, 1, "Its currency.",\n'
     '\t    .values = "EUR|RUB|USD" },')
edit("src/operations/orders.c", '{ "comment",		FIELD_TEXT,	0, 1, "Free text." },',
     '{ "comment",		FIELD_TEXT,	0, 1, "Free text.",\n'
     '\t    .pattern = "^[a-z]+( [a-z]+)*$" },')
# More routes than the old limit: 20 lists of orders on paths of their own.
edit("src/operations/routes.c", "#if defined(DEV_ROUTES)\n\t{ HTTP_METHOD_POST",
     "".join(f'\t{{ HTTP_METHOD_GET, "/v1/orders-{i}", "GET /v1/orders-{i}",\n'
             "\t    &order_list_operation },\n" for i in range(1, EXTRA + 1)) +
     "#if defined(DEV_ROUTES)\n\t{ HTTP_METHOD_POST")

build = subprocess.run(["scripts/build", "dev"], cwd=copy, capture_output=True, text=True)
t.ok(build.returncode == 0, "the copy builds", build.stdout + build.stderr)
if build.returncode != 0:
    t.done()
    sys.exit(1)

doc_path = os.path.join(copy, "docs", "openapi.json")
with open(doc_path) as f:
    doc = json.load(f)
openapi.use(doc_path)
schemas = doc["components"]["schemas"]
points = schemas["BonusesApplyRequest"]["properties"]["points"]
t.eq((points["minimum"], points["maximum"]), (1, 1000000),
     "the document gives points' declared range, not its kind's")
t.ok("not" not in points, "and no 'not 0', which the range excludes", points)
t.ok("from 1 to 1000000" in points["description"], "its description says the range",
     points["description"])
reason = schemas["BonusesApplyRequest"]["properties"]["reason"]
t.eq((reason.get("minLength"), reason.get("maxLength")), (2, 40),
     "a declared length is the document's")
currency = schemas["OrdersCreateRequest"]["properties"]["currency"]
t.eq(currency.get("enum"), ["EUR", "RUB", "USD"], "declared values are the document's enum")
comment = schemas["OrdersCreateRequest"]["properties"]["comment"]
t.eq(comment.get("allOf"), [{"pattern": "^[a-z]+( [a-z]+)*$"}],
     "a declared pattern is the document's, beside the kind's own")
t.eq(sum(1 for p in doc["paths"] if re.match(r"/v1/orders-\d+$", p)), EXTRA,
     "the document has the new routes")

api = Api(name="api-tables", app=os.path.join(copy, "app.so")).start()


def detail(path, field, literal, body):
    """The answer to body with field's JSON text replaced by literal."""
    raw = json.dumps(dict(body, **{field: "@"})).replace('"@"', literal)
    return post(api.port, path, raw, key=new_key("tables"), bad=True)


CASES = [("/v1/bonuses", "points", {"customer_id": new_key("c-t"), "reason": "why"}),
         ("/v1/bonuses", "reason", {"customer_id": new_key("c-t"), "points": 5}),
         ("/v1/orders", "currency", {"customer_id": new_key("c-t"), "amount": 100})]
for path, field, rest in CASES:
    prop = doc["components"]["schemas"][
        "BonusesApplyRequest" if path == "/v1/bonuses" else "OrdersCreateRequest"][
        "properties"][field]
    # The description's second sentence is the rule (a string's third says
    # how its length is counted).
    rule = prop["description"].split(". ")[1].rstrip(".")
    rows = openapi.boundaries(prop)
    t.ok(len(rows) >= 3, f"{path} {field}: boundaries from the document", rows)
    for what, literal, valid in rows:
        r = detail(path, field, literal, rest)
        if valid:
            t.eq(r.status, 201, f"{path} {field} {what}: served")
        else:
            t.ok(r.status == 400 and r.json()["detail"] ==
                 f"{field} must be {rule[0].lower()}{rule[1:]}",
                 f"{path} {field} {what}: a 400 that says the field's rule", r)
rows = {what: (literal, valid) for what, literal, valid in openapi.boundaries(points)}
t.eq(rows.get("1000000 (the maximum)"), ("1000000", True), "the catalogue tries the maximum")
t.eq(rows.get("1000001 (one above the maximum)"), ("1000001", False),
     "and one past it")
t.eq(rows.get("0 (one below the minimum)"), ("0", False), "and one below the minimum")

r = post(api.port, "/v1/orders", {"customer_id": "c-t", "amount": 100, "currency": "RUB",
                                  "comment": "Two Words"}, key=new_key(), bad=True)
t.ok(r.status == 400 and "matching ^[a-z]+( [a-z]+)*$" in r.json()["detail"],
     "a string that misses the declared pattern is a 400 that says the pattern", r)
r = post(api.port, "/v1/orders", {"customer_id": "c-t", "amount": 100, "currency": "RUB",
                                  "comment": "two words"}, key=new_key())
t.eq(r.status, 201, "one that matches it is served")

# The last of the routes, past the old limit: served and counted.
label = f'route="GET /v1/orders-{EXTRA}",outcome="ok"'
t.eq(metric(api.port, "idem_requests_total", label), 0, "/metrics has a row for every route")
r = api.get(f"/v1/orders-{EXTRA}?customer_id=c-t")
t.eq(r.status, 200, f"GET /v1/orders-{EXTRA} is served")
t.eq(metric(api.port, "idem_requests_total", label), 1, "and counted on its own label")
t.eq(len(api.workers()), 2, "no worker died")
api.stop()
t.done()
