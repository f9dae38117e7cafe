"""A PostgreSQL out of connection slots (SQLSTATE 53300,
too_many_connections) is named as such by /healthz, not as "unreachable"
(issue 30, item 5: a third instance past max_connections 100 said "the
database is unreachable", and the runbook then looked for a PostgreSQL
that was down).

A PostgreSQL of its own, max_connections 10 and no slot reserved for
superusers, migrated; psql sessions hold every slot (the instance needs
7: 1 worker, 1 request connection). An instance started
then answers /healthz 503 database-unavailable "the database is out of
connection slots (max_connections)", and logs the server's own words;
once the sessions end, it connects on its own and answers 200. A role
with CONNECTION LIMIT 0 (the same SQLSTATE) is named as that limit."""

import atexit
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import harness  # noqa: E402
from harness import ROOT, Api, Kore, Tap, free_port, request, wait_until  # noqa: E402

t = Tap()
SLOTS = 10
DETAIL = "the database is out of connection slots (max_connections)"


def lib(script, *args):
    # A bound on a hang (initdb on a loaded machine), not a verdict.
    return subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib.sh"; {script}', "lib"] +
                          list(args), capture_output=True, text=True, timeout=300)


pgdir = os.path.join(harness.TMP, f"pgfull-{os.getpid()}")
port = free_port()
atexit.register(shutil.rmtree, pgdir, True)
atexit.register(lambda: lib('cluster_stop "$1"', pgdir))
made = lib(f'CLUSTER_SETTINGS="-c max_connections={SLOTS} -c superuser_reserved_connections=0 '
           '-c shared_buffers=16MB"; cluster_start "$1" "$2" && cluster_url "$2" idem "$1"',
           pgdir, str(port))
if made.returncode != 0:
    t.ok(False, f"a PostgreSQL with max_connections {SLOTS}", made.stderr)
    t.done()
url = made.stdout.strip().splitlines()[-1]
migrated = subprocess.run([os.path.join(ROOT, "scripts", "migrate"), url], capture_output=True,
                          text=True, timeout=300)
t.ok(migrated.returncode == 0, "its schema migrated", migrated.stderr)


def probe():
    """A connection's refusal, or "" when one is made."""
    r = subprocess.run(["psql", url, "-XAtq", "-c", "select 1"], capture_output=True,
                       text=True, timeout=60)
    return "" if r.returncode == 0 else r.stderr


holders = []


def end_holders():
    for p in holders:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def hold():
    """A psql session that holds a slot until it is killed: started once
    the one before it is in, so that no two race for the last slot."""
    p = subprocess.Popen(["psql", url, "-XAtq"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, bufsize=1)
    holders.append(p)
    p.stdin.write("select 'in';\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


atexit.register(end_holders)
held = [hold() for _ in range(SLOTS)]
t.eq(held, ["in"] * SLOTS, f"{SLOTS} sessions hold every slot")
full = probe()
t.ok("too many clients already" in full, "one more is refused: \"sorry, too many clients "
     "already\"", full)

api = Api(name="api-full", conf_extra=["workers 1", "pgsql_conn_max 1"])
api.env["IDEM_DATABASE_URL"] = url + " application_name=api-full"
Kore.start(api, lambda: request(api.port, "GET", "/healthz", timeout=2).status in (200, 503))

last = {}


def refused():
    r = request(api.port, "GET", "/healthz", timeout=5)
    last["r"] = r
    return r.status == 503 and r.json().get("detail") == DETAIL


try:
    wait_until(refused, "/healthz to name the full database")
except TimeoutError:
    pass    # the assertion below shows what it said instead
r = last["r"]
t.ok(r.status == 503 and r.json()["type"].endswith("/database-unavailable") and
     r.headers.get("retry-after") == "1",
     f"/healthz: 503 database-unavailable, \"{DETAIL}\", Retry-After: 1", r)
t.ok(re.search(r"cannot connect to the database \(out of connection slots \(max_connections\)\)"
               r": .*too many clients already", api.read_log()),
     "the log: the cause, and the server's own words", api.read_log()[-2000:])

end_holders()
wait_until(lambda: request(api.port, "GET", "/healthz", timeout=5).status == 200,
           "/healthz to answer 200 once slots are free")
t.ok(True, "slots free again: the instance connects on its own, /healthz 200, no restart")
api.stop()

# The same SQLSTATE from a role's CONNECTION LIMIT: named as that limit.
subprocess.run(["psql", url, "-Xq", "-v", "ON_ERROR_STOP=1", "-c",
                "create role limited login connection limit 0"], check=True,
               capture_output=True, timeout=60)
ROLE = "the database is out of connection slots (the role's or the database's connection limit)"
api = Api(name="api-limited", conf_extra=["workers 1", "pgsql_conn_max 1"])
api.env["IDEM_DATABASE_URL"] = url.replace("user=idem", "user=limited")
Kore.start(api, lambda: request(api.port, "GET", "/healthz", timeout=2).status in (200, 503))
DETAIL = ROLE
try:
    wait_until(refused, "/healthz to name the role's limit")
except TimeoutError:
    pass
t.ok(last["r"].status == 503 and last["r"].json().get("detail") == ROLE,
     f"a role with CONNECTION LIMIT 0: /healthz 503 \"{ROLE}\"", last["r"])
api.stop()
t.done()
