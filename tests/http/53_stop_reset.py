"""make db, make stop, make reset on the embedded cluster: stop keeps the
data, reset deletes it; with IDEM_DATABASE_URL set both leave the cluster
alone, and a reset whose stop failed keeps the data. Runs on a copy of the tree with a cluster of its
own (IDEM_EMBEDDED_PGPORT), so that it touches neither the repository's
.pgdata nor anyone's port."""

import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, ROOT, TMP, Tap, alive, free_port, wait_until)  # noqa: E402

t = Tap()

copy = os.path.join(TMP, "stopreset")
for d in ("scripts", "sql", "dev"):
    shutil.copytree(os.path.join(ROOT, d), os.path.join(copy, d))
shutil.copy2(os.path.join(ROOT, "Makefile"), copy)
# The release, which make migrate records beside each migration.
os.makedirs(os.path.join(copy, "src", "core"))
shutil.copy2(os.path.join(ROOT, "src", "core", "release.h"), os.path.join(copy, "src", "core"))
port = free_port()
env = dict(os.environ, IDEM_EMBEDDED_PGPORT=str(port))
env.pop("IDEM_DATABASE_URL", None)
pgdata = os.path.join(copy, ".pgdata")
url = (f"host=127.0.0.1 port={port} dbname=idem user=idem sslmode=disable "
       "gssencmode=disable connect_timeout=3")


def make(target, **extra):
    return subprocess.run(["make", "-s", "-C", copy, target], env=dict(env, **extra),
                          capture_output=True, text=True, timeout=COMMAND_BOUND)


def postmaster():
    with open(os.path.join(pgdata, "postmaster.pid")) as f:
        return int(f.readline())


def psql(query):
    return subprocess.run(["psql", url, "-XAtq", "-c", query],
                          capture_output=True, text=True, timeout=COMMAND_BOUND)


try:
    r = make("db")
    t.ok(r.returncode == 0 and "database ready" in r.stdout, "make db", r.stderr)
    t.eq(psql("select count(*) from clients").stdout.strip(), "2",
         "the cluster answers, with the dev clients")
    psql("create table stop_reset_mark (x int)")

    # Another database in IDEM_DATABASE_URL: the embedded cluster is not
    # make db's, nor make run's, so not make stop's or make reset's either.
    for target in ("stop", "reset"):
        r = make(target, IDEM_DATABASE_URL="host=127.0.0.1 port=1 dbname=elsewhere")
        t.ok(r.returncode == 0 and "left alone" in r.stdout,
             f"make {target} with IDEM_DATABASE_URL set says it leaves the cluster alone",
             r.stdout + r.stderr)
        t.eq(psql("select count(*) from stop_reset_mark").stdout.strip(), "0",
             f"and make {target} left it running, with its data")

    # A reset whose stop fails (a postmaster that does not answer, here a
    # stopped one) deletes nothing under the running server.
    pid = postmaster()
    os.kill(pid, signal.SIGSTOP)
    try:
        r = make("reset", PGCTLTIMEOUT="3")
    finally:
        os.kill(pid, signal.SIGCONT)
    t.ok(r.returncode != 0 and "did not stop" in r.stderr,
         "make reset says when the cluster did not stop", r.stdout + r.stderr)
    t.ok(os.path.isfile(os.path.join(pgdata, "PG_VERSION")), "and keeps its data")
    # Woken, the postmaster gets the stop it was sent.
    wait_until(lambda: not alive(pid), "the woken postmaster to stop",
               timeout=COMMAND_BOUND)
    make("db")
    t.eq(psql("select count(*) from stop_reset_mark").stdout.strip(), "0",
         "which make db serves again")

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
