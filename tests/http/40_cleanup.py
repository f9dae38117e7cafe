"""Cleanup, shared by both strategies: finished keys older than the
retention are deleted by the job; a retry after that is a new operation;
in-progress keys stay."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Provider, Tap, database_errors, key_row, metric,  # noqa: E402
                     new_key, quote, request, sql, sql_value, wait_until)

t = Tap()
# Bounds on a hang only, far above what the conditions need: the job runs
# every second and deletes a batch in milliseconds.
STALL_BOUND = 60
HANG_BOUND = 120
provider = Provider().start()
# Its own log (read below): other tests' servers append to api.log.
api = Api(name="api-cleanup", IDEM_PROVIDER_URL=provider.url, IDEM_RETENTION_SECONDS=4,
          IDEM_CLEANUP_INTERVAL_SECONDS=1, IDEM_CLEANUP_BATCH=3).start()


def deleted():
    text = request(api.port, "GET", "/metrics").body.decode()
    return int(re.search(r"^idem_cleanup_deleted_keys_total (\d+)$", text, re.M).group(1))


# Read before the keys exist: with a retention of 2 s the job may delete
# them before the test has checked them all (psql is slow on a busy host).
before = deleted()
order = {"customer_id": "c-clean", "amount": 30000, "currency": "RUB"}
keys = [new_key("clean") for _ in range(7)]
first = {k: api.post("/v1/orders", order, key=k) for k in keys}
pay_key = new_key("clean-pay")
paid = api.post("/v1/payments", {"amount": 100, "currency": "RUB", "recipient": "acc-clean"},
                key=pay_key)
t.ok(all(r.status == 201 for r in first.values()) and paid.status == 201,
     "seven orders and a payment are created")
t.eq(sql_value("select count(*) from idempotency_keys where client_id = 'shop-1' and"
              f" idem_key in ({', '.join(quote(k) for k in keys)})"), "7",
     "their keys are saved")

# A stuck in-progress payment, older than the retention.
stuck = new_key("stuck")
sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint, status,"
    " lease_id, locked_until, request, created_at) values ('shop-1', "
    f"{quote(stuck)}, 'payments.create', repeat('a', 64), 'in_progress', 1,"
    " now() + interval '1 hour', '{}', now() - interval '1 day')")

def batches():
    """The size of every batch the job deleted, from its log lines."""
    return [int(n) for n in re.findall(r"cleanup: deleted (\d+) finished keys",
                                       api.read_log())]


def wait_while_deleting(cond, what):
    """Waits for cond() as long as the job keeps deleting keys: a full make
    test leaves thousands of keys older than the 4 s retention, which the
    job deletes first (oldest first, three at a time), and how long that
    takes is the machine's speed. It gives up only when the job has
    deleted nothing for STALL_BOUND seconds: a hang."""
    last, since = deleted(), time.monotonic()
    while not cond():
        count = deleted()
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since > STALL_BOUND:
            raise TimeoutError(f"the job deleted nothing for {STALL_BOUND} s"
                               f" while waiting for {what}")
        time.sleep(0.05)


try:
    wait_while_deleting(lambda: all(key_row(k) is None for k in keys + [pay_key]),
                        "the cleanup job to delete the finished keys")
except TimeoutError as e:
    t.note(str(e))
t.eq([k for k in keys + [pay_key] if key_row(k) is not None], [],
     "after the retention the job deleted every finished key")
# Earlier tests' keys are past the 4 s retention too: at least these 8.
sizes = batches()
t.ok(len(sizes) >= 3 and max(sizes) == 3 and min(sizes) >= 1,
     "in batches of at most 3 keys, as many as it took", sizes)
t.ok(deleted() - before >= 8, "idem_cleanup_deleted_keys_total counts them",
     deleted() - before)
# The job counts a batch just before it logs it.
logged, counted, logged_after = sum(batches()), deleted(), sum(batches())
t.ok(logged <= counted <= logged_after, "the counter is the sum of the batches",
     (logged, counted, logged_after))
t.ok(key_row(stuck, "shop-1") is not None, "an in-progress key is not deleted")
t.eq(int(sql_value("select count(*) from orders where customer_id = 'c-clean'")), 7,
     "the business rows stay")

again = api.post("/v1/orders", order, key=keys[0])
t.ok(again.status == 201 and not again.replayed and
     again.json()["order_id"] != first[keys[0]].json()["order_id"],
     "a retry after the retention is a new operation", again)

api.stop()

# Two instances clean at once: they share the work without conflict.
sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
    " status, status_code, response, created_at, finished_at)"
    " select 'shop-2', 'bulk-' || g, 'orders.create', repeat('a', 64), 'done', 201,"
    " '{}', now() - interval '2 days', now() - interval '2 days'"
    " from generate_series(1, 3000) g")
pair = [Api(name=f"cleaner-{i}", IDEM_PROVIDER_URL=provider.url,
            IDEM_CLEANUP_INTERVAL_SECONDS=1, IDEM_CLEANUP_BATCH=50).start()
        for i in (1, 2)]
wait_until(lambda: sql_value("select count(*) from idempotency_keys"
                             " where idem_key like 'bulk-%'") == "0",
           "two instances to delete 3000 old keys", timeout=HANG_BOUND)
# A job counts a batch just after the batch commits.
wait_until(lambda: sum(metric(a.port, "idem_cleanup_deleted_keys_total")
                       for a in pair) >= 3000, "the last batch to be counted",
           timeout=HANG_BOUND)
counts = [metric(a.port, "idem_cleanup_deleted_keys_total") for a in pair]
t.eq(sum(counts), 3000, f"two instances together deleted each key once ({counts})")
# Not the readiness poll's /healthz that waited out its own bound for the
# health pool's first connection: a 503 then is the service's right answer.
errors = [database_errors(a.read_log()) for a in pair]
t.eq(errors, [[], []], "neither instance saw a database error")
for a in pair:
    a.stop()
provider.stop()
t.done()
