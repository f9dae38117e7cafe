"""The migrations in sql/ are what a production database gets: applied alone
to an empty database (twice, as a deployment may), they create the service's
schema and nothing of the dev data set: no fake provider schema, no demo
function, no dev clients. The dev data in dev/ adds exactly those."""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import DB_URL, ROOT, Tap  # noqa: E402

t = Tap()
name = f"idem_schema_{os.getpid()}"
admin = re.sub(r"dbname=\S+", "dbname=postgres", DB_URL)
url = re.sub(r"dbname=\S+", f"dbname={name}", DB_URL)


def psql(conninfo, query):
    out = subprocess.run(["psql", conninfo, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
                          "-c", query], check=True, capture_output=True, text=True).stdout
    return out.strip()


def lib(function):
    """Runs a function of scripts/lib.sh (migrate, load_dev_data) on the database."""
    return subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib.sh"; {function} "$0"', url],
                          capture_output=True, text=True)


def count(query):
    return int(psql(url, f"select count(*) from ({query}) q"))


PROVIDER_SCHEMA = "select 1 from pg_namespace where nspname = 'provider'"
DEMO_FUNCTIONS = "select 1 from pg_proc where proname like 'demo%'"
DEV_CLIENTS = "select 1 from clients where client_id in ('shop-1', 'shop-2')"

psql(admin, f"drop database if exists {name}")
psql(admin, f"create database {name}")
try:
    first, second = lib("migrate"), lib("migrate")
    t.ok(first.returncode == 0 and second.returncode == 0,
         "sql/*.sql applies to an empty database, and again", first.stderr + second.stderr)
    t.eq(count("select 1 from pg_tables where schemaname = 'public' and tablename in"
               " ('clients', 'idempotency_keys', 'orders', 'payments')"), 4,
         "the service's tables are there")
    t.eq(count("select 1 from pg_proc where proname in ('tx_execute', 'lease_reserve_v2',"
               " 'lease_complete', 'lease_recover_claim_v2', 'lease_reserve',"
               " 'lease_recover_claim')"), 6,
         "and its transactional and lease functions")
    t.eq(count(PROVIDER_SCHEMA), 0, "no provider schema (the fake provider's state)")
    t.eq(count(DEMO_FUNCTIONS), 0, "no demo function (demo_naive_save)")
    t.eq(count("select 1 from clients"), 0, "no client, dev or other")

    dev = lib("load_dev_data")
    t.ok(dev.returncode == 0 and lib("load_dev_data").returncode == 0,
         "the dev data applies on top, and again", dev.stderr)
    t.eq((count(PROVIDER_SCHEMA), count(DEMO_FUNCTIONS), count(DEV_CLIENTS)), (1, 1, 2),
         "and adds the provider schema, the demo function and the dev clients")
finally:
    psql(admin, f"drop database if exists {name}")

# A database the old code let a balance past 2^53-1 into still migrates:
# the limit's constraints check new rows (NOT VALID), not the old ones.
psql(admin, f"create database {name}")
try:
    psql(url, "create table bonus_accounts (client_id text not null, customer_id text"
              " not null, balance bigint not null default 0 check (balance >= 0),"
              " updated_at timestamptz not null default now(),"
              " primary key (client_id, customer_id));"
              " insert into bonus_accounts values ('shop-1', 'c-over', 9007199254740999)")
    upgraded = lib("migrate")
    t.ok(upgraded.returncode == 0,
         "a database holding a balance past 2^53-1 still migrates", upgraded.stderr)
    t.eq(count("select 1 from bonus_accounts where balance = 9007199254740999"), 1,
         "its old row is left for the operator to fix")
    refused = subprocess.run(["psql", url, "-X", "-q", "-c", "insert into bonus_accounts"
                              " values ('shop-1', 'c-new', 9007199254740992)"],
                             capture_output=True, text=True)
    t.ok(refused.returncode != 0 and "bonus_accounts_balance_max" in refused.stderr,
         "and a new balance past the limit is refused", refused.stderr)
finally:
    psql(admin, f"drop database if exists {name}")

# A migration that fails stops the run, names its file and fails it: the
# files after it (which may depend on it) are not applied, and make run's
# dev loop says so instead of reloading as if all went well.
psql(admin, f"create database {name}")
tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"idem_bad_sql_{os.getpid()}")
os.makedirs(tmp, exist_ok=True)
try:
    for f, text in (("1_ok.sql", "create table before_bad (a int);"),
                    ("2_bad.sql", "select idem_no_such_function();"),
                    ("3_after.sql", "create table after_bad (a int);")):
        with open(os.path.join(tmp, f), "w") as out:
            out.write(text)
    bad = subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib.sh"; apply_sql "$0" "$@"',
                          url] + [os.path.join(tmp, f) for f in
                                  ("1_ok.sql", "2_bad.sql", "3_after.sql")],
                         capture_output=True, text=True)
    t.ok(bad.returncode != 0 and "2_bad.sql failed" in bad.stderr,
         "a failing SQL file fails the run and is named", bad.stderr)
    t.eq((count("select 1 from pg_tables where tablename = 'before_bad'"),
          count("select 1 from pg_tables where tablename = 'after_bad'")), (1, 0),
         "the files before it are applied, the ones after it are not")
    t.ok("(1 row)" not in bad.stdout, "and no query result is printed", bad.stdout)
finally:
    psql(admin, f"drop database if exists {name}")
    for f in os.listdir(tmp):
        os.unlink(os.path.join(tmp, f))
    os.rmdir(tmp)

t.done()
