"""The roles of a production database, as docs/operations.md (A real
PostgreSQL) makes them: a role with LOGIN and nothing more (no superuser,
no CREATEDB, no CREATEROLE) owns the database, and make migrate runs as it;
an instance runs as a runtime role of its own once the owner has given it
the documented grants (the tables' rows and the sequences, no DDL, nothing
it owns): /healthz, an order and its replay, a payment and a refund through
the provider, and a table a later migration adds. Without the grants the
runtime role's /healthz is a 503 and its log says permission denied."""

import hashlib
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (DB_URL, HEALTH_BOUND, ROOT, Api, Kore, Provider, Tap, new_key,  # noqa: E402
                     request)

t = Tap()
tag = f"{os.getpid()}"
OWNER, APP, DB = f"idem_owner_{tag}", f"idem_app_{tag}", f"idem_roles_{tag}"
admin = re.sub(r"dbname=\S+", "dbname=postgres", DB_URL)


def url(role):
    return re.sub(r"user=\S+", f"user={role}", re.sub(r"dbname=\S+", f"dbname={DB}", DB_URL))


def psql(conninfo, *queries):
    args = ["psql", conninfo, "-XAtq", "-v", "ON_ERROR_STOP=1"]
    for q in queries:
        args += ["-c", q]
    return subprocess.run(args, capture_output=True, text=True)


# The grants of docs/operations.md, run by the owner.
GRANTS = [
    f"grant usage on schema public to {APP}",
    f"grant select, insert, update, delete on all tables in schema public to {APP}",
    f"grant usage, select on all sequences in schema public to {APP}",
    f"alter default privileges in schema public"
    f" grant select, insert, update, delete on tables to {APP}",
    f"alter default privileges in schema public grant usage, select on sequences to {APP}",
]

provider = Provider(name="provider-roles").start()
apis = []
try:
    r = psql(admin, f"create role {OWNER} login", f"create database {DB} owner {OWNER}",
             f"create role {APP} login")
    assert r.returncode == 0, r.stderr
    t.eq(psql(admin, "select rolsuper or rolcreatedb or rolcreaterole or rolbypassrls"
                     f" from pg_roles where rolname = '{OWNER}'").stdout.strip(), "f",
         "the owner has no attribute but LOGIN")
    m = subprocess.run(["make", "-s", "migrate"], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, IDEM_DATABASE_URL=url(OWNER)))
    t.ok(m.returncode == 0 and "done: the database has" in m.stdout,
         "make migrate runs as that owner: no superuser needed", m.stdout + m.stderr)
    token = f"tok-roles-{tag}"
    r = psql(url(OWNER), "insert into clients (client_id, token_sha256) values"
             f" ('shop-roles', '{hashlib.sha256(token.encode()).hexdigest()}')")
    assert r.returncode == 0, r.stderr

    def api_as(role, name, health):
        """An API as role, once its /healthz answers health."""
        api = Api(name=name, IDEM_PROVIDER_URL=provider.url)
        api.env["IDEM_DATABASE_URL"] = url(role)
        apis.append(api)
        return Kore.start(api, lambda: request(api.port, "GET", "/healthz",
                                               timeout=HEALTH_BOUND).status == health)

    # Without the grants: not served.
    bare = api_as(APP, "api-roles-bare", 503)
    t.ok("permission denied" in bare.read_log(),
         "the runtime role without the grants: /healthz 503, permission denied in the log")
    bare.stop()

    r = psql(url(OWNER), *GRANTS)
    t.ok(r.returncode == 0, "the owner gives the runtime role the documented grants", r.stderr)
    api = api_as(APP, "api-roles", 200)
    t.ok(True, "the runtime role with the grants: /healthz 200")
    body = {"customer_id": "c-roles", "amount": 1500, "currency": "RUB"}
    key = new_key("roles-order")
    first = api.post("/v1/orders", body, key=key, token=token)
    again = api.post("/v1/orders", body, key=key, token=token)
    t.ok(first.status == 201 and again.status == 201 and again.replayed and
         again.body == first.body, "an order, and its replay", f"{first} {again}")
    pay = api.post("/v1/payments", {"amount": 700, "currency": "RUB", "recipient": "acc-roles"},
                   key=new_key("roles-pay"), token=token)
    t.eq(pay.status, 201, "a payment through the provider")
    ref = api.post("/v1/refunds", {"payment_id": pay.json().get("payment_id"), "amount": 300},
                   key=new_key("roles-ref"), token=token) if pay.status == 201 else pay
    t.eq(ref.status, 201, "a refund of it")
    t.ok("permission denied" not in api.read_log(), "no permission denied in its log",
         api.read_log()[-2000:])

    # A table a later migration adds (made by the owner, as make migrate
    # makes it) is the runtime role's too: the default privileges.
    r = psql(url(OWNER), "create table roles_later (id bigint generated always as identity,"
             " a int)")
    assert r.returncode == 0, r.stderr
    r = psql(url(APP), "insert into roles_later (a) values (1)", "select count(*) from roles_later")
    t.ok(r.returncode == 0 and r.stdout.strip() == "1",
         "a table a later migration adds: the runtime role reads and writes it", r.stderr)
    # A replay under a synchronous standby writes a WAL message
    # (idem_confirm()): a plain role may.
    r = psql(url(APP), "select pg_logical_emit_message(true, 'idem', 'replay') is not null")
    t.ok(r.returncode == 0 and r.stdout.strip() == "t",
         "the runtime role may write the replay's WAL message (idem_confirm())", r.stderr)
    # And the runtime role changes no schema.
    r = psql(url(APP), "create table roles_app_made (a int)")
    t.ok(r.returncode != 0 and "permission denied" in r.stderr,
         "the runtime role cannot change the schema", r.stderr)
finally:
    for a in apis:
        a.stop()
    provider.stop()
    psql(admin, f"drop database if exists {DB}")
    psql(admin, f"drop role if exists {APP}", f"drop role if exists {OWNER}")

t.done()
