"""A duplicate that arrives while the first transaction is still open waits
inside PostgreSQL (on the key's unique index) and answers only when the first
ends: with its saved response if it committed, or by doing the work itself
if it died. The test holds the first transaction open with a psql session
that locks the business table the first must write."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Background, PsqlSession, Tap, new_key, quote,  # noqa: E402
                     sql, sql_value, wait_until)

t = Tap()
api = Api().start()


def blocked(function, event):
    """Backends of the API waiting on a lock while running function."""
    return int(sql_value(
        "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
        f" and wait_event = {quote(event)} and query like {quote('%' + function + '(%')}"))


def hold(table):
    s = PsqlSession()
    s.run(f"begin; lock table {table} in share mode;")
    return s


def first_held_then_duplicate(path, body, table, function):
    """The first request blocked behind the held table, its duplicate
    waiting on the first's key."""
    key = new_key()
    lock = hold(table)
    first = Background(api.post, path, body, key=key)
    wait_until(lambda: blocked(function, "relation") == 1,
               "the first request to block on the held table")
    dup = Background(api.post, path, body, key=key)
    wait_until(lambda: blocked(function, "transactionid") == 1,
               "the duplicate to wait on the first's key")
    return key, lock, first, dup


def duplicate_waits_then_replays(path, body, table, function):
    key, lock, first, dup = first_held_then_duplicate(path, body, table, function)
    t.ok(not first.done() and not dup.done(),
         f"{path}: while the first transaction is open neither has answered")
    lock.run("commit;")
    lock.close()
    a, b = first.wait(), dup.wait()
    t.ok(a.status == 201 and not a.replayed, f"{path}: the first creates", a)
    t.ok(b.status == 201 and b.replayed and b.body == a.body,
         f"{path}: the waiting duplicate replays the first's response", b)
    t.eq(sql_value(f"select count(*) from {table} where idem_key = {quote(key)}"), "1",
         f"{path}: one row in {table}")


def duplicate_does_the_work_when_the_first_dies(path, body, table, function):
    key, lock, first, dup = first_held_then_duplicate(path, body, table, function)

    pid = sql_value("select pid from pg_stat_activity where wait_event = 'relation'"
                    f" and query like {quote('%' + function + '(%')}")
    sql(f"select pg_terminate_backend({pid})")
    a = first.wait()
    t.eq(a.status, 503, f"{path}: the first, whose backend died, gets 503")
    t.ok(a.body.startswith(b"{") and b"database-unavailable" in a.body,
         f"{path}: as a database-unavailable problem", a)

    wait_until(lambda: blocked(function, "relation") == 1,
               "the duplicate to take the key and block on the held table")
    t.ok(not dup.done(), f"{path}: the duplicate now does the work (and waits for the table)")
    lock.run("commit;")
    lock.close()
    b = dup.wait()
    t.ok(b.status == 201 and not b.replayed, f"{path}: the duplicate creates", b)
    t.eq(sql_value(f"select count(*) from {table} where idem_key = {quote(key)}"), "1",
         f"{path}: exactly one row in {table}")

    c = api.post(path, body, key=key)
    t.ok(c.status == 201 and c.replayed and c.body == b.body,
         f"{path}: the first client's retry gets the duplicate's saved response", c)


order = {"customer_id": "c-wait", "amount": 20000, "currency": "RUB"}
bonus = {"customer_id": "c-wait", "points": 30, "reason": "gift"}

duplicate_waits_then_replays("/v1/orders", order, "orders", "tx_execute")
duplicate_waits_then_replays("/v1/bonuses", bonus, "bonus_ledger", "tx_execute")
duplicate_does_the_work_when_the_first_dies("/v1/orders", order, "orders", "tx_execute")
duplicate_does_the_work_when_the_first_dies("/v1/bonuses", bonus, "bonus_ledger", "tx_execute")

# The worker whose backend was terminated reconnects: every request works.
answers = [api.get("/v1/bonuses/c-wait") for _ in range(20)]
t.eq({r.status for r in answers}, {200}, "after the terminated backend, all requests succeed")

api.stop()
t.done()
