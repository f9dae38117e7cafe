"""docs/adding-an-operation.md, followed on a copy of the tree: its worked
example's files are written as the guide gives them (each block marked
file=<path>) and its route lines put where it says (the block marked
routes=<path>: the declaration above the table, the route at its end,
before the demo routes). Then:

- exactly the guide's four files differ from the tree: nothing else is
  edited by hand;
- the copy builds, and its OpenAPI document has the new route, its fields,
  its answer and the saved problem its SQL reaches;
- the copy's own make test, on a cluster of its own, passes the new
  operation's test, the bad-input catalogue (which now crosses the new
  route with every bad input) and the document's test."""

import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, ROOT, Tap, copy_tree, free_port)  # noqa: E402

t = Tap()
GUIDE = os.path.join(ROOT, "docs", "adding-an-operation.md")
ROUTE = "POST /v1/bonuses/redemptions"

copy = copy_tree("guide")
# The Stripe mock the copy's make test wants, not downloaded again.
mock = os.path.join(ROOT, "tools", "stripe-mock", "node_modules")
if os.path.isdir(mock):
    os.symlink(mock, os.path.join(copy, "tools", "stripe-mock", "node_modules"))


def snapshot():
    out = {}
    for top, dirs, names in os.walk(copy):
        dirs[:] = [d for d in dirs if d != "node_modules"]
        for n in names:
            p = os.path.join(top, n)
            if not os.path.islink(p):
                with open(p, "rb") as f:
                    out[os.path.relpath(p, copy)] = f.read()
    return out


before = snapshot()

with open(GUIDE) as f:
    guide = f.read()
blocks = re.findall(r"^```\w+ (file|routes)=(\S+)\n(.*?)^```$", guide, re.M | re.S)
t.eq(sorted(kind for kind, _, _ in blocks), ["file", "file", "file", "routes"],
     "the guide gives three files and the route's lines")

for kind, path, text in blocks:
    target = os.path.join(copy, path)
    if kind == "file":
        t.ok(not os.path.exists(target), f"{path} is a new file")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w") as f:
            f.write(text)
        continue
    with open(target) as f:
        routes = f.read()
    lines = text.splitlines(keepends=True)
    decl = "".join(l for l in lines if l.startswith("extern "))
    route = "".join(l for l in lines if not l.startswith("extern "))
    table = "const struct idem_route\tidem_routes[] = {\n"
    demo = "#if defined(DEV_ROUTES)\n\t{ HTTP_METHOD_POST"
    t.ok(table in routes and demo in routes and decl and route,
         "routes.c has the table and the demo routes the guide names")
    routes = routes.replace(table, decl + "\n" + table, 1)
    routes = routes.replace(demo, route + demo, 1)
    with open(target, "w") as f:
        f.write(routes)

after = snapshot()
changed = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
t.eq(changed, sorted(["sql/040_bonus_redemptions.sql", "src/operations/bonus_redemptions.c",
                      "src/operations/routes.c", "tests/http/65_bonus_redemptions.py"]),
     "the guide edits four files and nothing else")

build = subprocess.run(["scripts/build", "dev"], cwd=copy, capture_output=True, text=True)
t.ok(build.returncode == 0, "the copy builds", build.stdout + build.stderr)

with open(os.path.join(copy, "docs", "openapi.json")) as f:
    doc = json.load(f)
op = doc["paths"].get("/v1/bonuses/redemptions", {}).get("post", {})
schemas = doc["components"]["schemas"]
t.eq(sorted(schemas.get("BonusesRedeemRequest", {}).get("properties", {})),
     ["customer_id", "points", "reward"], "its document: the request from the field table")
t.eq(sorted(schemas.get("BonusesRedeem", {}).get("required", [])),
     ["balance", "customer_id", "points", "redemption_id", "reward"],
     "the answer from the answer table")
t.ok("insufficient-balance" in op.get("responses", {}).get("422", {}).get("description", ""),
     "and the 422 its SQL answers", op.get("responses", {}).get("422"))

env = dict(os.environ, IDEM_TEST_PGPORT=str(free_port()), IDEM_TEST_NO_BROWSER="1",
           PROVE_ARGS="-v", IDEM_TESTS="tests/http/65_bonus_redemptions.py "
           "tests/http/27_bad_input_catalogue.py tests/http/50_openapi.py")
for v in ("IDEM_TEST_PGDATA", "IDEM_DATABASE_URL", "IDEM_TEST_DB_URL"):
    env.pop(v, None)
# A bound on a hang for the copy's build and its make test of three files.
SUITE_BOUND = 1800
# A bound, not a verdict: the copy's make test stops its own cluster when
# it is told to stop.
proc = subprocess.Popen(["scripts/test"], cwd=copy, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
try:
    out, _ = proc.communicate(timeout=SUITE_BOUND)
except subprocess.TimeoutExpired:
    proc.terminate()
    out, _ = proc.communicate(timeout=COMMAND_BOUND)
    out += f"\n(stopped after {SUITE_BOUND} s)"
t.ok(proc.returncode == 0 and "Result: PASS" in out,
     "the copy's make test passes the new operation's test, the catalogue and the "
     "document's", out[-3000:])
t.ok(re.search(r"^ok \d+ - a redemption is created", out, re.M),
     "the worked example's own test ran")
rows = re.findall(rf"^ok \d+ - row \d+: .*?: {ROUTE}: ", out, re.M)
t.ok(len(rows) >= 300, f"the catalogue sent the new route {len(rows)} bad inputs")
t.done()
