"""A duplicate that arrives while the first transaction is still open waits
inside PostgreSQL and answers only when the first ends: with its saved
response if it committed, or by doing the work itself if it died.

tx_execute() writes the business rows first and the key last, with its
answer. So a duplicate waits where the first holds something: on a business
lock the first holds, or on the key's unique index entry once the first has
written it. When the first commits, the duplicate's key insert finds the key
taken: its transaction is rolled back whole (SQLSTATE 40001) and the service
runs the call again, which replays. Each case below is one of those waits:
- both requests through the API, behind a business table a psql session
  holds locked (the first waits on the table, the duplicate behind it);
- the first's transaction held open by a psql session after it wrote the key
  (the call the API makes, in an open transaction): the API's duplicate waits
  on the key's index entry itself."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Background, PsqlSession, Tap, fingerprint,  # noqa: E402
                     metric, new_key, quote, sql, sql_value, wait_until)

t = Tap()
api = Api().start()


def blocked(event=None):
    """Backends of the API waiting on a lock (of one kind, or any) while
    running tx_execute()."""
    kind = f" and wait_event = {quote(event)}" if event else ""
    return int(sql_value(
        "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
        f"{kind} and query like '%tx_execute(%' and application_name <> 'psql'"))


def hold(table):
    s = PsqlSession()
    s.run(f"begin; lock table {table} in share mode;")
    return s


def rows(table, key):
    return sql_value(f"select count(*) from {table} where idem_key = {quote(key)}")


def both_held(path, body, table):
    """The first request blocked on the held table, its duplicate behind
    it; the first's backend."""
    key = new_key()
    lock = hold(table)
    first = Background(api.post, path, body, key=key)
    wait_until(lambda: blocked("relation") == 1,
               "the first request to block on the held table")
    pid = sql_value("select pid from pg_stat_activity where wait_event = 'relation'"
                    " and query like '%tx_execute(%'")
    dup = Background(api.post, path, body, key=key)
    # On the table too, or on a row the first has already locked.
    wait_until(lambda: blocked() == 2, "the duplicate to block behind the first")
    return key, lock, first, dup, pid


def duplicate_behind_the_first_replays(path, body, table):
    key, lock, first, dup, _ = both_held(path, body, table)
    t.ok(not first.done() and not dup.done(),
         f"{path}: while the table is held neither has answered")
    lock.run("commit;")
    lock.close()
    # Both are let through at once; the one whose key insert comes first
    # creates.
    a, b = first.wait(), dup.wait()
    t.ok({(a.status, a.replayed), (b.status, b.replayed)} == {(201, False), (201, True)},
         f"{path}: one creates, the other replays", [a, b])
    t.ok(a.body == b.body, f"{path}: the same bytes to both", [a, b])
    t.eq(rows(table, key), "1", f"{path}: one row in {table}")


def duplicate_does_the_work_when_the_first_dies(path, body, table):
    key, lock, first, dup, pid = both_held(path, body, table)
    sql(f"select pg_terminate_backend({pid})")
    a = first.wait()
    t.eq(a.status, 503, f"{path}: the first, whose backend died, gets 503")
    t.ok(a.body.startswith(b"{") and b"database-unavailable" in a.body,
         f"{path}: as a database-unavailable problem", a)
    t.ok(not dup.done(), f"{path}: the duplicate still waits for the table")
    lock.run("commit;")
    lock.close()
    b = dup.wait()
    t.ok(b.status == 201 and not b.replayed, f"{path}: the duplicate creates", b)
    t.eq(rows(table, key), "1", f"{path}: exactly one row in {table}")

    c = api.post(path, body, key=key)
    t.ok(c.status == 201 and c.replayed and c.body == b.body,
         f"{path}: the first client's retry gets the duplicate's saved response", c)


def first_open_after_its_key(path, operation, body, table, end, key=None):
    """The first attempt (tx_execute() as the API calls it) done in a psql
    session whose transaction stays open after it wrote the key; the API's
    duplicate waits on the key's index entry; then the session ends the
    transaction with `end`. The session's attempt carries the body's
    fingerprint but another customer, so that the two share no row but the
    key's."""
    key = key or new_key()
    first = PsqlSession()
    other = dict(body, customer_id=body["customer_id"] + "-other")
    out = first.run(
        "begin; select status_code || ' ' || response from tx_execute("
        f"'shop-1', {quote(key)}, {quote(operation)},"
        f" {quote(fingerprint(body))}, {quote(json.dumps(other))}::jsonb);")
    status, _, saved = out[0].partition(" ")
    t.eq(status, "201", f"{path}: the first attempt, in the open transaction, created")
    dup = Background(api.post, path, body, key=key)
    wait_until(lambda: blocked("transactionid") == 1,
               "the duplicate to wait on the first's key")
    t.ok(not dup.done(), f"{path}: the duplicate waits while the first is open")
    first.run(f"{end};")
    first.close()
    return key, saved.encode(), dup.wait()


def duplicate_on_the_key_replays(path, operation, body, table):
    errors = metric(api.port, "idem_database_errors_total")
    key, saved, b = first_open_after_its_key(path, operation, body, table, "commit")
    t.eq(metric(api.port, "idem_database_errors_total"), errors,
         f"{path}: its expected rollback is not counted as a database error")
    t.ok("taken by a concurrent transaction" not in api.read_log(),
         f"{path}: nor logged as one")
    t.ok(b.status == 201 and b.replayed and b.body == saved,
         f"{path}: the duplicate that waited on the key replays the first's"
         " saved bytes", b)
    t.eq(rows(table, key), "1",
         f"{path}: one row in {table}: the duplicate's own writes were rolled back")


def duplicate_on_the_key_works_when_the_first_rolls_back(path, operation, body, table):
    key, saved, b = first_open_after_its_key(path, operation, body, table, "rollback")
    t.ok(b.status == 201 and not b.replayed,
         f"{path}: the first rolled back: the duplicate creates", b)
    t.eq(rows(table, key), "1", f"{path}: one row in {table}, the duplicate's")
    t.eq(sql_value("select response from idempotency_keys"
                   f" where client_id = 'shop-1' and idem_key = {quote(key)}"),
         b.body.decode(), f"{path}: the key holds the duplicate's answer")


def duplicate_on_a_business_unique_key_replays():
    """An operation whose table has a unique key the duplicate writes too
    (here a unique index on the orders' (client_id, idem_key), made for
    this test): the duplicate waits on that index, not the key's, and gets
    a unique violation (23505) when the first commits; the service runs the
    call again, which replays."""
    sql("create unique index orders_uniq_test on orders (client_id, idem_key)"
        " where idem_key like 'uniq-%'")
    try:
        key, saved, b = first_open_after_its_key(
            "/v1/orders", "orders.create", order, "orders", "commit",
            key=new_key("uniq"))
        t.ok(b.status == 201 and b.replayed and b.body == saved,
             "/v1/orders: a duplicate stopped by a business unique key replays", b)
        t.eq(rows("orders", key), "1", "/v1/orders: one order for its key")
    finally:
        sql("drop index orders_uniq_test")


order = {"customer_id": "c-wait", "amount": 20000, "currency": "RUB"}
bonus = {"customer_id": "c-wait", "points": 30, "reason": "gift"}

duplicate_behind_the_first_replays("/v1/orders", order, "orders")
duplicate_behind_the_first_replays("/v1/bonuses", bonus, "bonus_ledger")
duplicate_does_the_work_when_the_first_dies("/v1/orders", order, "orders")
duplicate_does_the_work_when_the_first_dies("/v1/bonuses", bonus, "bonus_ledger")
duplicate_on_the_key_replays("/v1/orders", "orders.create", order, "orders")
duplicate_on_the_key_replays("/v1/bonuses", "bonuses.apply", bonus, "bonus_ledger")
duplicate_on_the_key_works_when_the_first_rolls_back(
    "/v1/orders", "orders.create", order, "orders")
duplicate_on_a_business_unique_key_replays()
duplicate_on_the_key_works_when_the_first_rolls_back(
    "/v1/bonuses", "bonuses.apply", bonus, "bonus_ledger")

# The worker whose backend was terminated reconnects: every request works.
answers = [api.get("/v1/bonuses/c-wait") for _ in range(20)]
t.eq({r.status for r in answers}, {200}, "after the terminated backend, all requests succeed")

api.stop()
t.done()
