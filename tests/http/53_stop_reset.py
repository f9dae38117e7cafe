"""make db, make stop, make reset on the embedded cluster: stop keeps the
data, reset deletes it. Runs on a copy of the tree with a cluster of its
own (IDEM_EMBEDDED_PGPORT), so that it touches neither the repository's
.pgdata nor anyone's port."""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, TMP, Tap, free_port  # noqa: E402

t = Tap()

copy = os.path.join(TMP, "stopreset")
for d in ("scripts", "sql", "dev"):
    shutil.copytree(os.path.join(ROOT, d), os.path.join(copy, d))
shutil.copy2(os.path.join(ROOT, "Makefile"), copy)
port = free_port()
env = dict(os.environ, IDEM_EMBEDDED_PGPORT=str(port))
env.pop("IDEM_DATABASE_URL", None)
pgdata = os.path.join(copy, ".pgdata")
url = (f"host=127.0.0.1 port={port} dbname=idem user=idem sslmode=disable "
       "gssencmode=disable connect_timeout=3")


def make(target):
    return subprocess.run(["make", "-s", "-C", copy, target], env=env,
                          capture_output=True, text=True, timeout=300)


def psql(query):
    return subprocess.run(["psql", url, "-XAtq", "-c", query],
                          capture_output=True, text=True, timeout=30)


try:
    r = make("db")
    t.ok(r.returncode == 0 and "database ready" in r.stdout, "make db", r.stderr)
    t.eq(psql("select count(*) from clients").stdout.strip(), "2",
         "the cluster answers, with the dev clients")
    psql("create table stop_reset_mark (x int)")

    r = make("stop")
    t.ok(r.returncode == 0 and "stopped" in r.stdout, "make stop", r.stdout + r.stderr)
    t.ok(psql("select 1").returncode != 0, "the cluster no longer answers")
    t.ok(os.path.isdir(pgdata), "its data stays")
    r = make("stop")
    t.ok(r.returncode == 0 and "not running" in r.stdout, "make stop again is harmless")

    make("db")
    t.eq(psql("select count(*) from stop_reset_mark").stdout.strip(), "0",
         "make db starts it again as it was")

    r = make("reset")
    t.ok(r.returncode == 0 and "deleted" in r.stdout, "make reset", r.stdout + r.stderr)
    t.ok(psql("select 1").returncode != 0 and not os.path.exists(pgdata),
         "the cluster is stopped and its data gone")
    r = make("reset")
    t.ok(r.returncode == 0, "make reset again is harmless", r.stderr)

    make("db")
    t.ok(psql("select 1 from stop_reset_mark").returncode != 0 and
         psql("select count(*) from clients").stdout.strip() == "2",
         "after a reset make db starts from the migrations and the dev data")
finally:
    subprocess.run(["bash", "-c", f'. "{copy}/scripts/lib.sh"; '
                    f'cluster_stop "{pgdata}"'], env=env)
    shutil.rmtree(copy, ignore_errors=True)

t.done()
