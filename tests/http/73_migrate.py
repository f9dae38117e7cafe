"""make migrate, the production path of the schema (scripts/migrate), and
the service's view of it: each migration of sql/ applied once, in order,
recorded with its checksum; a changed applied file refused and named;
--dry-run lists and changes nothing; two migrators at once apply each
file once; a database an earlier release made (sql/ applied by its
migrate, no version table, or an empty one) adopted in one transaction,
its files recorded and not run again, refused when it lacks what they
make; make db refuses
to load the dev data into a database other than the embedded one. The
service says its release on every answer and in /healthz, and names a
database whose schema is behind (503) or ahead (200) of it, at start in
its log and on every /healthz."""

import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, DB_URL, HEALTH_BOUND, REQUEST_BOUND, ROOT, TMP,  # noqa: E402
                     Api, Kore, PsqlSession, Tap, new_key, request, wait_until)

t = Tap()
# A bound on a hang for a make migrate (every migration, a loaded machine,
# the sanitizers' build beside it): well under a minute.
MIGRATE_BOUND = 120
admin = re.sub(r"dbname=\S+", "dbname=postgres", DB_URL)
base = f"idem_migrate_{os.getpid()}"
SQL = sorted(f for f in os.listdir(os.path.join(ROOT, "sql")) if f.endswith(".sql"))
with open(os.path.join(ROOT, "src", "core", "release.h")) as f:
    RELEASE = re.search(r'IDEM_RELEASE\s+"([^"]+)"', f.read()).group(1)


def psql(conninfo, query, check=True):
    return subprocess.run(["psql", conninfo, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", query],
                          check=check, capture_output=True, text=True).stdout.strip()


def database(suffix):
    name = f"{base}_{suffix}"
    psql(admin, f"drop database if exists {name}")
    psql(admin, f"create database {name}")
    created.append(name)
    return re.sub(r"dbname=\S+", f"dbname={name}", DB_URL)


def migrate(url, *args, sql_dir=None, env=None):
    e = dict(os.environ, IDEM_DATABASE_URL=url)
    e.pop("IDEM_MIGRATE_LIST", None)
    e.update(env or {})
    if sql_dir:
        e["IDEM_MIGRATIONS_DIR"] = sql_dir
    r = subprocess.run(["make", "-s", "migrate"] + ([f"ARGS={' '.join(args)}"] if args else []),
                       cwd=ROOT, env=e, capture_output=True, text=True)
    r.out = r.stdout + r.stderr
    return r


def recorded(url):
    out = psql(url, "select name || ' ' || checksum from schema_migrations order by name")
    return dict(l.split(" ") for l in out.splitlines())


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def sql_copy(name, drop=(), add=()):
    d = os.path.join(TMP, f"migrate-{name}")
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "sql"), d)
    for f in drop:
        os.unlink(os.path.join(d, f))
    for f, text in add:
        with open(os.path.join(d, f), "w") as out:
            out.write(text)
    return d


def table_exists(url, table):
    return psql(url, f"select to_regclass('{table}') is not null") == "t"


created = []
try:
    # --- a fresh database ---------------------------------------------------
    url = database("fresh")
    listed = migrate(url, "--dry-run")
    t.ok(listed.returncode == 0 and
         [l for l in listed.stdout.splitlines() if l.startswith("would apply ")] ==
         [f"would apply {f}" for f in SQL],
         "--dry-run lists every migration of sql/, in order", listed.out)
    t.ok(not table_exists(url, "schema_migrations") and not table_exists(url, "clients"),
         "and changes nothing")
    listed = migrate(url, env={"IDEM_MIGRATE_LIST": "1"})
    t.ok(listed.returncode == 0 and listed.stdout.count("would apply ") == len(SQL) and
         not table_exists(url, "clients"), "IDEM_MIGRATE_LIST=1 make migrate lists too",
         listed.out)

    first = migrate(url)
    t.ok(first.returncode == 0 and
         [l for l in first.stdout.splitlines() if l.startswith("applied ")] ==
         [f"applied {f}" for f in SQL], "make migrate applies each, in order", first.out)
    t.eq(recorded(url), {f: sha(os.path.join(ROOT, "sql", f)) for f in SQL},
         "each recorded with the SHA-256 of its bytes")
    t.eq(psql(url, "select count(*) from clients") + " " +
         psql(url, "select count(*) from pg_namespace where nspname = 'provider'"), "0 0",
         "never the dev data: no client, no fake provider schema")
    stamp = psql(url, "select max(applied_at) from schema_migrations")
    second = migrate(url)
    t.ok(second.returncode == 0 and "applied " not in second.stdout and
         psql(url, "select max(applied_at) from schema_migrations") == stamp,
         "run again, it applies nothing", second.out)
    t.ok("nothing to apply" in migrate(url, "--dry-run").stdout,
         "and --dry-run says there is nothing to apply")

    # --- a database it cannot reach: named, never its password ---------------
    for bad_url in ("host=127.0.0.1 port=1 dbname=x user=x password=idem-secret-pw "
                    "connect_timeout=3",
                    "postgresql://x:idem-secret-pw@127.0.0.1:1/x?connect_timeout=3"):
        r = migrate(bad_url)
        t.ok(r.returncode != 0 and "cannot query the database" in r.stderr and
             "*****" in r.stderr and "idem-secret-pw" not in r.out,
             "a database it cannot reach is named with its password masked", r.out)

    # --- a changed file, and a new one beside it ---------------------------
    changed = sql_copy("changed", add=[("900_new.sql", "create table migrate_new (a int);\n")])
    with open(os.path.join(changed, SQL[1]), "a") as f:
        f.write("\n-- an edit after the release\n")
    listed = migrate(url, "--dry-run", sql_dir=changed)
    t.ok(listed.returncode == 2 and f"would refuse: {SQL[1]} changed" in listed.stderr and
         "would apply nothing" in listed.stdout and "would apply 9" not in listed.stdout and
         "nothing to apply" not in listed.stdout,
         "--dry-run says it would refuse the changed file and apply nothing, not even "
         "the new one (make's status 2)", listed.out)
    # A changed file alone: not "nothing to apply", as if all were well.
    alone = sql_copy("changed-alone")
    with open(os.path.join(alone, SQL[1]), "a") as f:
        f.write("\n-- an edit after the release\n")
    direct = subprocess.run([os.path.join(ROOT, "scripts", "migrate"), "--dry-run"],
                            env=dict(os.environ, IDEM_DATABASE_URL=url,
                                     IDEM_MIGRATIONS_DIR=alone),
                            capture_output=True, text=True)
    t.ok(direct.returncode == 1 and f"would refuse: {SQL[1]} changed" in direct.stderr and
         "would apply nothing" in direct.stdout and "nothing to apply" not in direct.stdout,
         "scripts/migrate --dry-run of a changed file alone: would refuse, exit status 1",
         direct.stdout + direct.stderr)
    refused = migrate(url, sql_dir=changed)
    t.ok(refused.returncode == 2 and f"refused: {SQL[1]} changed" in refused.stderr,
         "make migrate refuses a changed applied file, naming it (make's status 2)",
         refused.out)
    t.ok(not table_exists(url, "migrate_new") and
         recorded(url)[SQL[1]] == sha(os.path.join(ROOT, "sql", SQL[1])),
         "and applies nothing: not the new file either, the old checksum kept")

    # A failing file: named, not recorded, the ones after it not applied.
    bad = sql_copy("bad", add=[("900_bad.sql", "select idem_no_such_function();\n"),
                               ("901_after.sql", "create table migrate_after (a int);\n")])
    r = migrate(url, sql_dir=bad)
    t.ok(r.returncode != 0 and "900_bad.sql failed" in r.stderr and
         "900_bad.sql" not in recorded(url) and not table_exists(url, "migrate_after"),
         "a failing migration is named, not recorded, and stops the run", r.out)

    # A file with a COMMIT of its own would commit its first half unrecorded.
    halves = sql_copy("commit", add=[
        ("900_halves.sql", "create table migrate_half (a int);\ncommit;\n"
                           "create table migrate_other_half (a int);\n"),
        ("901_body.sql", "-- commit;\ncreate function migrate_body() returns void\n"
                         "language plpgsql as $$ begin perform 'commit;'; end $$;\n")])
    listed = migrate(url, "--dry-run", sql_dir=halves)
    t.ok(listed.returncode != 0 and "would refuse: 900_halves.sql" in listed.stderr and
         "line 2: commit" in listed.stderr and "would apply nothing" in listed.stdout,
         "--dry-run: a migration with a top-level COMMIT would be refused, its line named",
         listed.out)
    r = migrate(url, sql_dir=halves)
    t.ok(r.returncode != 0 and "refused: 900_halves.sql" in r.stderr and
         "901_body.sql" not in r.stderr and not table_exists(url, "migrate_half") and
         "900_halves.sql" not in recorded(url),
         "make migrate refuses it before applying anything (a BEGIN ... END in a function's "
         "body, a commit in a comment are not refused)", r.out)

    # --- a database an earlier release made ---------------------------------
    # 1.0.0 (RELEASES) applied every file of its sql/ on every run, with
    # no version table (its scripts/lib.sh migrate: psql -1 -f each).
    v100 = open(os.path.join(ROOT, "RELEASES")).read()
    commit = re.search(r"^1\.0\.0\s+([0-9a-f]{7,40})", v100, re.M).group(1)
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{commit}:sql"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    names = [f for f in names if f.endswith(".sql")]

    def old_database(suffix, files=names):
        """A database 1.0.0's make db made (of its files, those given)."""
        u = database(suffix)
        for f in files:
            text = subprocess.run(["git", "show", f"{commit}:sql/{f}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
            subprocess.run(["psql", u, "-Xq1", "-v", "ON_ERROR_STOP=1", "-o", "/dev/null",
                            "-f", "-"], input=text, check=True, capture_output=True, text=True)
        return u

    # A file run again replaces its functions: their catalog rows change
    # (xmin). These are replaced by no migration after 1.0.0.
    RUN_AGAIN = ("select string_agg(p.proname || '=' || p.xmin::text, ' ' order by p.proname)"
                 "  from pg_proc p where p.proname in ('idem_operation', 'tx_run',"
                 " 'lease_complete', 'order_create', 'bonus_transfer', 'payment_settle',"
                 " 'refund_settle') and pg_function_is_visible(p.oid)")

    old = old_database("old")
    psql(old, "insert into clients values ('old-shop', repeat('a', 64))")
    listed = migrate(old, "--dry-run")
    t.eq([l for l in listed.stdout.splitlines() if l.startswith("would ")],
         [f"would record (1.0.0's) {f}" if f in names else f"would apply {f}" for f in SQL],
         "--dry-run on a database 1.0.0 made: it would record 1.0.0's files, apply the rest")
    t.ok(not table_exists(old, "schema_migrations"), "and changes nothing")
    before = psql(old, RUN_AGAIN)
    adopted = migrate(old)
    t.ok(adopted.returncode == 0 and "an earlier release made; adopting it" in adopted.out,
         "make migrate adopts a database 1.0.0 made, and says so", adopted.out)
    t.eq([l for l in adopted.stdout.splitlines() if l.startswith(("recorded ", "applied "))],
         [f"recorded {f} (1.0.0's, already applied)" if f in names else f"applied {f}"
          for f in SQL], "it records 1.0.0's files and applies only the others")
    t.eq(psql(old, RUN_AGAIN), before, "1.0.0's files were not run again (their functions' "
         "catalog rows unchanged)")
    t.eq(recorded(old), {f: sha(os.path.join(ROOT, "sql", f)) for f in SQL},
         "every migration recorded with its checksum")
    t.eq(psql(old, "select count(*) from schema_migrations where release = '1.0.0'"),
         str(len(names)), "1.0.0's recorded as 1.0.0's")
    t.eq(psql(old, "select client_id from clients"), "old-shop", "its rows kept")
    t.ok("applied " not in migrate(old).stdout, "and the next run applies nothing")

    # A run stopped after it made the version table and before it wrote a
    # row (an earlier migrate did that in two transactions): still adopted.
    empty = old_database("old_empty")
    psql(empty, "create table schema_migrations (name text primary key, checksum text not null,"
         " release text not null, applied_at timestamptz not null default now())")
    before = psql(empty, RUN_AGAIN)
    r = migrate(empty)
    t.ok(r.returncode == 0 and "adopting it" in r.out and psql(empty, RUN_AGAIN) == before and
         recorded(empty) == {f: sha(os.path.join(ROOT, "sql", f)) for f in SQL},
         "a 1.0.0 database with an empty version table is adopted, nothing run again", r.out)

    # A database that ran only some of 1.0.0's files: refused, the missing
    # objects named, nothing recorded (not even the version table).
    part = old_database("old_part", [f for f in names if f < "010"])
    listed = migrate(part, "--dry-run")
    t.ok(listed.returncode != 0 and "would refuse to adopt" in listed.stderr and
         "010_orders_bonuses.sql: relation orders" in listed.stderr and
         "would apply nothing" in listed.stdout and "would record" not in listed.stdout,
         "--dry-run on a database that ran part of 1.0.0: would refuse, naming what is "
         "missing", listed.out)
    r = migrate(part)
    t.ok(r.returncode != 0 and "refused to adopt" in r.stderr and
         "010_orders_bonuses.sql: relation orders" in r.stderr and
         "020_payments.sql: relation payments" in r.stderr,
         "make migrate refuses to adopt it, naming each missing object by its file", r.out)
    t.ok(not table_exists(part, "schema_migrations") and not table_exists(part, "orders"),
         "and records nothing, applies nothing: no version table, no orders")

    # --- migrators at once ----------------------------------------------------
    class Session(PsqlSession):
        def __init__(self, conninfo):
            self.proc = subprocess.Popen(
                ["psql", conninfo, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, bufsize=1)

    def at_once(u, what):
        """Two make migrate released together: the lock held until both
        wait on it."""
        s = Session(u)
        s.run("begin; select pg_advisory_xact_lock(7220431198601);")
        e = dict(os.environ, IDEM_DATABASE_URL=u)
        e.pop("IDEM_MIGRATE_LIST", None)
        runs = [subprocess.Popen(["make", "-s", "migrate"], cwd=ROOT, env=e, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                for _ in range(2)]
        wait_until(lambda: psql(u, "select count(*) from pg_locks where locktype = 'advisory'"
                                   " and not granted") == "2", f"both migrators of {what} "
                   "to wait on the lock", timeout=MIGRATE_BOUND)
        s.run("commit;")
        s.close()
        return [(p.wait(timeout=MIGRATE_BOUND), p.stdout.read()) for p in runs]

    u = database("race")
    runs = at_once(u, "a fresh database")
    out = "".join(o for _, o in runs)
    t.ok([c for c, _ in runs] == [0, 0] and
         all(out.count(f"applied {f}\n") == 1 for f in SQL) and
         recorded(u) == {f: sha(os.path.join(ROOT, "sql", f)) for f in SQL},
         "two make migrate at once on a fresh database: both succeed, each file applied "
         "once", out)
    u = old_database("race_old")
    before = psql(u, RUN_AGAIN)
    runs = at_once(u, "a 1.0.0 database")
    out = "".join(o for _, o in runs)
    t.ok([c for c, _ in runs] == [0, 0] and psql(u, RUN_AGAIN) == before and
         all(out.count(f"recorded {f} ") == 1 for f in names) and
         all(out.count(f"applied {f}\n") == 1 for f in SQL if f not in names) and
         recorded(u) == {f: sha(os.path.join(ROOT, "sql", f)) for f in SQL},
         "two at once on a 1.0.0 database: adopted once, nothing of 1.0.0 run again, "
         "the rest applied once", out)

    # --- the previous release's calls while the migrations commit ---------
    # A call of 1.0.0 waits on the lock of a migration's alter table, inside
    # one of 1.0.0's functions; when the migration commits, its next
    # statement runs the new definitions. None may fail: no function 1.0.0
    # calls is dropped or changes its result type (040 once did: "cache
    # lookup failed for function" or 42804, a 500 in make test-upgrade).
    u = old_database("held")
    psql(u, "insert into clients values ('old-shop', repeat('a', 64))")
    fp = "'" + "a" * 64 + "'"
    payment = """'{"amount": 100, "currency": "RUB", "recipient": "acc-1"}'::jsonb"""
    psql(u, f"select outcome from lease_reserve('old-shop', 'k-held', 'payments.create', {fp},"
         f" {payment}, 30, 10000)")
    calls = {
        "lease_reserve() of a new key": f"select outcome from lease_reserve('old-shop', "
        f"'k-new', 'payments.create', {fp}, {payment}, 30, 10000)",
        "lease_reserve() of a key in flight": f"select outcome from lease_reserve('old-shop', "
        f"'k-held', 'payments.create', {fp}, {payment}, 30, 10000)",
        "lease_recover_claim()": "select count(*) from lease_recover_claim(300, 30, 10000)",
    }
    held = Session(u)
    held.run("begin;")
    for f in SQL:
        if f not in names:
            held.run(open(os.path.join(ROOT, "sql", f)).read())
    answers = {}

    def call(what, q):
        r = subprocess.run(["psql", u, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", q],
                           capture_output=True, text=True)
        answers[what] = (r.returncode, r.stdout.strip(), r.stderr.strip())
    threads = [threading.Thread(target=call, args=c) for c in calls.items()]
    for th in threads:
        th.start()
    wait_until(lambda: psql(u, "select count(*) from pg_stat_activity where datname ="
                               " current_database() and wait_event_type = 'Lock'")
               == str(len(calls)), "1.0.0's calls to wait on the migrations' locks")
    held.run("commit;")
    held.close()
    for th in threads:
        th.join(ANSWER_BOUND)
    t.eq({w: a for w, a in answers.items() if a[0] != 0}, {},
         "1.0.0's calls waiting on this release's migrations all answer when they commit")
    t.eq([answers.get(w, (None, None))[1] for w in calls], ["reserved", "in_flight", "0"],
         "each as 1.0.0 answers it: reserved, in flight, nothing to claim")

    # --- make db against a database that is not the embedded one ------------
    other = database("other")
    e = dict(os.environ, IDEM_DATABASE_URL=other)
    e.pop("IDEM_LOAD_DEV_DATA", None)
    r = subprocess.run(["make", "-s", "db"], cwd=ROOT, env=e, capture_output=True, text=True)
    t.ok(r.returncode != 0 and "refused" in r.stderr and "IDEM_LOAD_DEV_DATA=1" in r.stderr,
         "make db refuses to load the dev data into another database, and says how",
         r.stdout + r.stderr)
    t.ok(not table_exists(other, "clients") and not table_exists(other, "schema_migrations"),
         "and changes nothing")
    e["IDEM_LOAD_DEV_DATA"] = "1"
    r = subprocess.run(["make", "-s", "db"], cwd=ROOT, env=e, capture_output=True, text=True)
    t.ok(r.returncode == 0 and
         psql(other, "select count(*) from clients where client_id like 'shop-%'") == "2",
         "with IDEM_LOAD_DEV_DATA=1 it loads them", r.stdout + r.stderr)

    # --- the service: its release, and a schema behind or ahead -------------
    behind = database("behind")
    r = migrate(behind, sql_dir=sql_copy("behind", drop=[SQL[-1]]))
    t.ok(r.returncode == 0, "a database migrated without the last migration", r.out)
    api = Api(name="api-migrate")
    api.env["IDEM_DATABASE_URL"] = behind
    Kore.start(api, lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 503)
    h = request(api.port, "GET", "/healthz")
    t.ok(h.status == 503 and h.json().get("type", "").endswith("/database-misconfigured") and
         "schema behind" in h.json()["detail"] and SQL[-1] in h.json()["detail"],
         "a database behind: /healthz 503 database-misconfigured names what it lacks", h)
    t.eq(h.headers.get("idem-version"), RELEASE, "the 503 carries Idem-Version")
    wait_until(lambda: "schema behind" in api.read_log(), "the start's log to name it")
    log = api.read_log()
    t.ok(f"idem {RELEASE}" in log and "schema behind" in log and SQL[-1] in log,
         "the log says the release at start and names the schema behind", log[-1500:])

    r = migrate(behind)
    t.ok(r.returncode == 0 and f"applied {SQL[-1]}" in r.stdout, "make migrate catches up",
         r.out)
    wait_until(lambda: request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200,
               "/healthz to answer 200 once migrated")
    h = request(api.port, "GET", "/healthz")
    t.eq(h.json(), {"status": "ok", "database": "up", "version": RELEASE,
                    "schema": "current"}, "then /healthz: 200, its release, schema current")

    # A newer release migrated first (a rolling upgrade): this one serves on.
    newer = sql_copy("newer", add=[("999_newer_release.sql", "select 1;\n")])
    r = migrate(behind, sql_dir=newer)
    t.ok(r.returncode == 0, "a newer release's migration applied", r.out)
    h = request(api.port, "GET", "/healthz")
    t.eq((h.status, h.json().get("schema")), (200, "ahead: 999_newer_release.sql"),
         "a database ahead: /healthz 200, naming the migration it does not know")
    psql(behind, "insert into clients values ('shop-1', '"
         + hashlib.sha256(b"dev-shop-1").hexdigest() + "')")
    o = api.post("/v1/orders", {"customer_id": "c-migrate", "amount": 100, "currency": "RUB"},
                 key=new_key("migrate"))
    t.ok(o.status == 201 and o.headers.get("idem-version") == RELEASE,
         "an order is served beside it, with Idem-Version", o)
    r = migrate(behind)
    t.ok(r.returncode == 0 and "999_newer_release.sql" in r.stderr and
         "does not" in r.stderr, "this release's make migrate names it and leaves it", r.out)
    api.stop()
    api = Api(name="api-migrate-ahead")
    api.env["IDEM_DATABASE_URL"] = behind
    api.start()
    wait_until(lambda: "schema ahead" in api.read_log(), "the start's log to name it")
    t.ok("999_newer_release.sql" in api.read_log(), "its start's log names a schema ahead")

    # A URL's own options (its search_path) hold for the start's check too.
    api.stop()
    pathed = database("search_path")
    psql(pathed, "create schema idem_elsewhere")
    pathed += " options='-c search_path=idem_elsewhere'"
    r = migrate(pathed)
    t.ok(r.returncode == 0 and table_exists(pathed, "idem_elsewhere.schema_migrations"),
         "a database migrated into the schema its URL's search_path names", r.out)
    api = Api(name="api-migrate-path")
    api.env["IDEM_DATABASE_URL"] = pathed
    api.start()
    wait_until(lambda: re.search(r"schema (current|behind|ahead|not)", api.read_log()),
               "the start's check to log")
    log = api.read_log()
    t.ok("schema current" in log and "schema not migrated" not in log,
         "the start's check connects with the URL's options: schema current",
         log[-1500:])

    # Every answer carries the release: Kore's own bare ones too.
    with socket.create_connection(("127.0.0.1", api.port), timeout=REQUEST_BOUND) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad: \x01\r\n\r\n")
        raw = b""
        while b"\r\n\r\n" not in raw:
            chunk = s.recv(4096)
            if not chunk:
                break
            raw += chunk
    head = raw.split(b"\r\n\r\n")[0].decode(errors="replace").lower()
    t.ok(head.startswith("http/1.1 400") and f"idem-version: {RELEASE}" in head,
         "a bare answer of Kore's carries Idem-Version", head)
    for path in ("/openapi.json", "/metrics", "/v1/no-such-route"):
        r = request(api.port, "GET", path)
        t.eq(r.headers.get("idem-version"), RELEASE, f"GET {path} carries Idem-Version")
    api.stop()
finally:
    for name in created:
        psql(admin, f"drop database if exists {name}", check=False)

t.done()
