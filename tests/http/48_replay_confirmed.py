"""A replay is an answer of success too: it is given only once the saved
outcome it replays is confirmed by the synchronous standby.

A commit whose wait for the standby is cancelled (statement_timeout, a
cancel, a shutdown) is visible on the primary at once, though the standby
may not have it: the first request is answered 503 (outcome unknown). A
retry that read that row and replayed it as a 201 at once would promise
what a failover can still lose; so a replay's transaction waits for the
standby like a write does, and is a retryable 503 when it is not
confirmed.

The standby here is one that never answers: synchronous_standby_names
names a standby that does not exist. A commit waits for it until it is
cancelled (a statement_timeout does not apply to the commit of a single
statement's transaction: the client's own deadline gives up, see
src/core/db.c)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Provider, Tap, new_key, quote, sql,  # noqa: E402
                     sql_value, wait_until)

t = Tap()


def standby(name):
    sql(f"alter system set synchronous_standby_names = {quote(name)}")
    sql("select pg_reload_conf()")
    wait_until(lambda: (sql_value("show synchronous_standby_names") or "") == name,
               "the setting to be reloaded")


def retryable(r):
    return r.status == 503 and r.headers.get("retry-after") == "1" and \
        b"database-unavailable" in r.body


order = {"customer_id": "c-confirmed", "amount": 1000, "currency": "RUB"}
provider = Provider(name="provider-confirmed").start()
api = Api(name="api-confirmed", IDEM_DB_TIMEOUT_MS=1000,
          IDEM_PROVIDER_URL=provider.url).start()
try:
    # A payment that succeeded before the standby went missing.
    paid_key = new_key("paid")
    paid = api.post("/v1/payments", {"amount": 500, "currency": "RUB",
                                     "recipient": "acc-confirmed"}, key=paid_key)
    t.eq(paid.status, 201, "a payment succeeds")
    done_key = new_key("done")
    t.eq(api.post("/v1/orders", order, key=done_key).status, 201,
         "an order succeeds")

    standby("missing_standby")

    key = new_key("unconfirmed")
    first = api.post("/v1/orders", order, key=key)
    t.ok(retryable(first), "an order whose commit the standby does not "
         "confirm: a retryable 503", first)
    # Its backend still waits for the standby (the API gave up on it);
    # a cancel ends the wait with "committed locally", as a failover's
    # shutdown of the old primary does.
    sql("select pg_cancel_backend(pid) from pg_stat_activity"
        " where wait_event = 'SyncRep'")
    wait_until(lambda: sql_value("select status from idempotency_keys where"
                                 f" idem_key = {quote(key)}") == "done",
               "the cancelled commit to be visible")
    t.eq(sql_value("select status_code from idempotency_keys where"
                   f" idem_key = {quote(key)}"), "201",
         "its row is committed locally with a 201, not confirmed by any standby")
    again = api.post("/v1/orders", order, key=key)
    t.ok(retryable(again), "its retry is not answered 201 from that row while "
         "the standby has not confirmed it: 503", again)
    r = api.post("/v1/orders", order, key=done_key)
    t.ok(retryable(r), "a replay of an order, while no standby confirms: 503", r)
    r = api.post("/v1/payments", {"amount": 500, "currency": "RUB",
                                  "recipient": "acc-confirmed"}, key=paid_key)
    t.ok(retryable(r), "a replay of a payment, while no standby confirms: 503", r)
finally:
    standby("")

r = api.post("/v1/orders", order, key=key)
t.ok(r.status == 201 and r.replayed, "once confirmed, the retry replays the "
     "order the first attempt committed", r)
t.eq(sql_value(f"select count(*) from orders where idem_key = {quote(key)}"), "1",
     "one order for the key")
r = api.post("/v1/payments", {"amount": 500, "currency": "RUB",
                              "recipient": "acc-confirmed"}, key=paid_key)
t.ok(r.status == 201 and r.replayed and r.body == paid.body,
     "and the payment's replay is its first answer", r)
api.stop()
provider.stop()
t.done()
