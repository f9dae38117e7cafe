"""A PostgreSQL out of connection slots (SQLSTATE 53300,
too_many_connections) is named as such by /healthz, not as "unreachable"
(issue 30, item 5: a third instance past max_connections 100 said "the
database is unreachable", and the runbook then looked for a PostgreSQL
that was down).

A PostgreSQL of its own, max_connections 11 with 1 slot reserved for
superusers, migrated; the instances connect as a role that is no
superuser (as docs/deploy.md makes it), each needing 7 connections (1
worker, 1 request connection).

- psql sessions of that role hold the 10 other slots: an instance started
  then answers /healthz 503 database-unavailable "the database is out of
  connection slots (max_connections)", and logs the server's words
  ("remaining connection slots are reserved ...", or "sorry, too many
  clients already" when its pools' attempts overlap: below);
- a superuser's session takes the last slot: an instance started then
  says the same, and logs "sorry, too many clients already";
- once the sessions end, it connects on its own and answers 200;
- a role with CONNECTION LIMIT 0 (the same SQLSTATE) is named as that
  limit."""

import atexit
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import harness  # noqa: E402
from harness import (COMMAND_BOUND, EXIT_BOUND, HEALTH_BOUND, ROOT, Api, Kore, Tap,  # noqa: E402
                     free_port, request, wait_until)

t = Tap()
SLOTS = 11
RESERVED = 1
FULL = "the database is out of connection slots (max_connections)"
ROLE_LIMIT = ("the database is out of connection slots (the role's or the database's "
              "connection limit)")


def lib(script, *args):
    # A bound on a hang (initdb on a loaded machine), not a verdict.
    return subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib.sh"; {script}', "lib"] +
                          list(args), capture_output=True, text=True, timeout=COMMAND_BOUND)


pgdir = os.path.join(harness.TMP, f"pgfull-{os.getpid()}")
port = free_port()
atexit.register(shutil.rmtree, pgdir, True)
atexit.register(lambda: lib('cluster_stop "$1"', pgdir))
made = lib(f'CLUSTER_SETTINGS="-c max_connections={SLOTS} '
           f'-c superuser_reserved_connections={RESERVED} -c shared_buffers=16MB"; '
           'cluster_start "$1" "$2" && cluster_url "$2" idem "$1"', pgdir, str(port))
if made.returncode != 0:
    t.ok(False, f"a PostgreSQL with max_connections {SLOTS}", made.stderr)
    t.done()
url = made.stdout.strip().splitlines()[-1]           # idem: the superuser
migrated = subprocess.run([os.path.join(ROOT, "scripts", "migrate"), url], capture_output=True,
                          text=True, timeout=COMMAND_BOUND)
t.ok(migrated.returncode == 0, "its schema migrated", migrated.stderr)
# The instances' role: no superuser, the owner's rights by membership.
subprocess.run(["psql", url, "-Xq", "-v", "ON_ERROR_STOP=1", "-c",
                "create role app login; grant idem to app; "
                "create role limited login connection limit 0"],
               check=True, capture_output=True, timeout=COMMAND_BOUND)
app_url = url.replace("user=idem", "user=app")


def probe(conninfo):
    """A connection's refusal, or "" when one is made."""
    r = subprocess.run(["psql", conninfo, "-XAtq", "-c", "select 1"], capture_output=True,
                       text=True, timeout=COMMAND_BOUND)
    return "" if r.returncode == 0 else r.stderr


holders = []


def end_holders():
    for p in holders:
        if p.poll() is None:
            p.kill()
            p.wait(EXIT_BOUND)


def hold(conninfo):
    """A psql session that holds a slot until it is killed: started once
    the one before it is in, so that no two race for the last slot."""
    p = subprocess.Popen(["psql", conninfo, "-XAtq"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    holders.append(p)
    p.stdin.write("select 'in';\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def instance(name, conninfo):
    api = Api(name=name, conf_extra=["workers 1", "pgsql_conn_max 1"])
    api.env["IDEM_DATABASE_URL"] = conninfo + f" application_name={name}"
    Kore.start(api, lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status in (200, 503))
    return api


def health_says(api, detail):
    """/healthz's last answer, once it names detail (or the bound passed:
    the caller's assertion shows what it said instead)."""
    last = {}

    def named():
        last["r"] = request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND)
        return last["r"].status == 503 and last["r"].json().get("detail") == detail
    try:
        wait_until(named, f"/healthz to say {detail!r}")
    except TimeoutError:
        pass
    return last["r"]


def logged(api, words):
    return re.search(r"cannot connect to the database \(out of connection slots "
                     r"\(max_connections\)\): .*" + re.escape(words), api.read_log())


atexit.register(end_holders)

# --- every slot but the superusers' -------------------------------------------------
held = [hold(app_url) for _ in range(SLOTS - RESERVED)]
t.eq(held, ["in"] * (SLOTS - RESERVED), f"{SLOTS - RESERVED} sessions of the instances' "
     "role hold every slot but the reserved one")
refusal = probe(app_url)
t.ok("remaining connection slots are reserved" in refusal, "one more of that role is "
     "refused: the remaining slots are reserved", refusal)
api = instance("api-full-1", app_url)
r = health_says(api, FULL)
t.ok(r.status == 503 and r.json()["type"].endswith("/database-unavailable") and
     r.headers.get("retry-after") == "1" and r.json().get("detail") == FULL,
     f"/healthz: 503 database-unavailable, \"{FULL}\", Retry-After: 1", r)
# The server's words for the last free slot depend on who asks with whom:
# an attempt alone is told the remaining slots are reserved (as the probe
# above was), but PostgreSQL takes a process slot before it checks the
# reservation, and the instance's pools connect together: while one holds
# the last free slot (until its backend has exited), the others are told
# "sorry, too many clients already". A loaded run saw only those. Both
# are this cause, and the log says so with the server's words.
t.ok(logged(api, "remaining connection slots are reserved") or
     logged(api, "too many clients already"),
     "its log: the cause, and the server's own words", api.read_log()[-2000:])
api.stop()

# --- every slot --------------------------------------------------------------------------
t.eq(hold(url), "in", "a superuser's session takes the reserved slot")
refusal = probe(app_url)
t.ok("too many clients already" in refusal, "one more is refused: \"sorry, too many clients "
     "already\"", refusal)
api = instance("api-full-2", app_url)
r = health_says(api, FULL)
t.ok(r.status == 503 and r.json().get("detail") == FULL, f"/healthz: 503 \"{FULL}\"", r)
t.ok(logged(api, "too many clients already"), "its log: the server's own words",
     api.read_log()[-2000:])

end_holders()
wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
           "/healthz to answer 200 once slots are free")
t.ok(True, "slots free again: the instance connects on its own, /healthz 200, no restart")
api.stop()

# --- a role's CONNECTION LIMIT -------------------------------------------------------------
api = instance("api-limited", url.replace("user=idem", "user=limited"))
r = health_says(api, ROLE_LIMIT)
t.ok(r.status == 503 and r.json().get("detail") == ROLE_LIMIT,
     f"a role with CONNECTION LIMIT 0: /healthz 503 \"{ROLE_LIMIT}\"", r)
api.stop()
t.done()
