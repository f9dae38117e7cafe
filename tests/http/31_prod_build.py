"""The prod flavor has no demo strategies and no dev routes: built from this
tree in a scratch directory, its API answers 404 there and serves the real
routes."""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, TMP, Api, Tap, new_key  # noqa: E402

t = Tap()
build = os.path.join(TMP, "idemprod")
shutil.rmtree(build, ignore_errors=True)
os.makedirs(os.path.join(build, "conf"))
for d in ("src", "assets"):
    shutil.copytree(os.path.join(ROOT, d), os.path.join(build, d))
for f in ("kore.conf", "conf/build.conf"):
    shutil.copy(os.path.join(ROOT, f), os.path.join(build, f))
os.symlink("../kore.conf", os.path.join(build, "conf", "idemprod.conf"))
out = subprocess.run(["kodev", "build"], cwd=build, capture_output=True, text=True,
                     env=dict(os.environ, KORE_BUILD_FLAVOR="prod"))
so = os.path.join(build, "idemprod.so")
t.ok(out.returncode == 0 and os.path.exists(so), "the prod flavor builds", out.stderr[-2000:])

symbols = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True,
                         text=True).stdout
dev_symbols = ("demo_naive_operation", "demo_fresh_key_operation", "dev_canonical_json",
               "dev_problems")
t.ok(not any(s in symbols for s in dev_symbols),
     "the prod library has no demo operations or dev handlers",
     [s for s in dev_symbols if s in symbols])

api = Api(name="api-prod", app=so).start()
for path in ("/demo/naive/payments", "/demo/fresh-provider-key/payments",
             "/dev/canonical-json", "/dev/problems"):
    r = api.post(path, {"amount": 100, "currency": "RUB", "recipient": "x"}, key=new_key())
    t.ok(r.status == 404 and r.json()["type"].endswith("/problems/not-found"),
         f"prod: POST {path} is 404", r)
r = api.post("/v1/orders", {"customer_id": "c-prod", "amount": 100, "currency": "RUB"},
             key=new_key())
t.eq(r.status, 201, "prod: POST /v1/orders works")
api.stop()
shutil.rmtree(build, ignore_errors=True)
t.done()
