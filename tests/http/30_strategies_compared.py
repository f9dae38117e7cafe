"""The strategies compared, scenario by scenario, as the design's table
has them: each scenario is run against every strategy it applies to,
counting charges at the fake provider and orders in the database, and the
table is printed at the end (and copied into docs/behaviour.md).

  naive               POST /demo/naive/payments (check, charge, then write)
  lease               POST /v1/payments
  fresh provider key  POST /demo/fresh-provider-key/payments
  transactional       POST /v1/orders
  refund (lease)      POST /v1/refunds, of a payment made for the purpose

Processes are killed with SIGKILL by their own pids; the tests wait on
conditions (the provider has recorded the charge, the lease has expired,
a backend is blocked on a lock), not on fixed sleeps."""

import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Background, DbProxy, PsqlSession, Provider, Tap,  # noqa: E402
                     charges_to, concurrently, key_row, new_key, quote, request, sql,
                     sql_value, wait_until)

t = Tap()
LEASE, TIMEOUT_MS = 5, 4000
# The provider thinks 1.5 s after recording a charge (a retry meanwhile
# gets its 409).
LATENCY_MS = 1500
# Scenario 5's provider timeout and lease: bounds on a hang, far above what
# its steps take on a loaded machine (its lease is then ended by hand).
HELD_TIMEOUT_MS, HELD_LEASE = 60000, 120
provider = Provider(IDEM_PROVIDER_LATENCY_MS=LATENCY_MS).start()
env = {"IDEM_PROVIDER_URL": provider.url, "IDEM_LEASE_SECONDS": LEASE,
       "IDEM_PROVIDER_TIMEOUT_MS": TIMEOUT_MS}
api = Api(**env).start()
table = []

PATHS = {"naive": "/demo/naive/payments", "lease": "/v1/payments",
         "fresh provider key": "/demo/fresh-provider-key/payments",
         "transactional": "/v1/orders", "refund (lease)": "/v1/refunds"}
NOUNS = {"transactional": "order", "refund (lease)": "refund"}
paid = {}


def body(strategy, recipient, amount=10000, client="shop-1"):
    if strategy == "transactional":
        return {"customer_id": recipient, "amount": amount, "currency": "RUB"}
    if strategy == "refund (lease)":
        return {"payment_id": payment_of(recipient, client), "amount": amount}
    return {"amount": amount, "currency": "RUB", "recipient": recipient}


def payment_of(recipient, client):
    """A payment of 100000 to the recipient, made once per client, that
    the refund scenarios refund."""
    if (client, recipient) not in paid:
        r = api.post("/v1/payments", {"amount": 100000, "currency": "RUB",
                                      "recipient": recipient}, key=new_key("pay"),
                     client=client)
        assert r.status == 201, r
        paid[(client, recipient)] = r.json()["payment_id"]
    return paid[(client, recipient)]


def effects(strategy, recipient):
    """Charges or refunds at the provider, or orders in the database."""
    if strategy == "transactional":
        return int(sql_value("select count(*) from orders where customer_id = "
                             f"{quote(recipient)}"))
    if strategy == "refund (lease)":
        return int(sql_value("select count(*) from provider.refunds r join"
                             " provider.charges c using (charge_id) where"
                             f" c.recipient = {quote(recipient)}"))
    return charges_to(recipient)


def unit(strategy, count=2):
    noun = NOUNS.get(strategy, "charge")
    return noun if count == 1 else noun + "s"


def seen(responses):
    return ", ".join(f"{r.status}{' (replay)' if r.replayed else ''}" for r in responses)


def record(scenario, strategy, responses, count, expect_count, expect_statuses, extra=""):
    label = f"{scenario} / {strategy}"
    t.eq(sorted(r.status for r in responses), sorted(expect_statuses), f"{label}: statuses")
    t.eq(count, expect_count, f"{label}: {expect_count} {unit(strategy, expect_count)}")
    table.append((scenario, strategy, seen(responses) + extra,
                  f"{count} {unit(strategy, count)}"))


def post(strategy, recipient, key, amount=10000, client="shop-1"):
    return api.post(PATHS[strategy], body(strategy, recipient, amount, client), key=key,
                    client=client)


def restart_api():
    global api
    api = Api(port=api.port, name=f"api-{new_key('r')}", **env).start()


# 1. Two concurrent requests with one key.
scenario = "two concurrent requests, one key"
for strategy, statuses, count in [("naive", [201, 500], 2), ("lease", [201, 409], 1),
                                  ("fresh provider key", [201, 409], 1),
                                  ("transactional", [201, 201], 1),
                                  ("refund (lease)", [201, 409], 1)]:
    rcpt, key = new_key("acc"), new_key()
    body(strategy, rcpt)  # a refund's payment is made before the race
    answers = concurrently(2, post, strategy, rcpt, key)
    record(scenario, strategy, answers, effects(strategy, rcpt), count, statuses)

# 2. A retry after the first finished, 3. with another amount, 4. from another client.
for strategy in PATHS:
    rcpt, key = new_key("acc"), new_key()
    first = post(strategy, rcpt, key)
    again = post(strategy, rcpt, key)
    t.ok(again.body == first.body and again.replayed,
         f"retry after completion / {strategy}: the saved response", again)
    record("retry after completion", strategy, [first, again], effects(strategy, rcpt), 1,
           [201, 201])

    other = post(strategy, rcpt, key, amount=50000)
    if strategy == "naive":
        # The check-then-write never compares the request: a payment of 500
        # is answered with the receipt of the payment of 100.
        t.ok(other.status == 201 and other.body == first.body,
             "other amount / naive: answered with the first payment's receipt", other)
        record("same key, other amount", strategy, [other], effects(strategy, rcpt), 1,
               [201], " the 100.00 receipt for a 500.00 payment")
    else:
        record("same key, other amount", strategy, [other], effects(strategy, rcpt), 1,
               [422])

    theirs = post(strategy, rcpt, key, client="shop-2")
    t.ok(not theirs.replayed and theirs.body != first.body,
         f"same key, other client / {strategy}: its own operation", theirs)
    record("same key, other client", strategy, [theirs], effects(strategy, rcpt), 2, [201])

# 5. The API dies after the provider charged; the client retries.
# The provider answers at once, and a proxy keeps its answer from the API
# until the API is dead: the provider has acted and the API never hears,
# however slow the machine. The provider timeout and the lease are far
# above what the steps take (so the immediate retry meets the dead
# worker's lease), and the lease is then ended by hand, as its expiry
# would end it.
scenario = "API killed after the provider acted, then retries"
# (It thinks no time: a retry that comes at once gets its charge, not its
# 409 of a request still thinking.)
held = Provider(name="provider-held", IDEM_PROVIDER_LATENCY_MS=0).start()
proxy = DbProxy(target=held.port, http=True)
env_held = dict(env, IDEM_PROVIDER_URL=f"http://127.0.0.1:{proxy.port}",
                IDEM_PROVIDER_TIMEOUT_MS=HELD_TIMEOUT_MS, IDEM_LEASE_SECONDS=HELD_LEASE)
api.stop()
api = Api(port=api.port, name=f"api-{new_key('held')}", **env_held).start()
for strategy, expect in [("lease", 1), ("fresh provider key", 2), ("naive", 2),
                         ("refund (lease)", 1)]:
    rcpt, key = new_key("acc"), new_key()
    body(strategy, rcpt)
    proxy.hold_answers = True
    lost = Background(post, strategy, rcpt, key)
    wait_until(lambda: effects(strategy, rcpt) == 1,
               f"the provider to make the {unit(strategy, 1)}")
    api.kill9()
    proxy.hold_answers = False
    t.ok(lost.cut(), f"{scenario} / {strategy}: the client got no answer")
    api = Api(port=api.port, name=f"api-{new_key('held')}", **env_held).start()
    answers = []
    if strategy != "naive":
        early = post(strategy, rcpt, key)
        t.eq(early.status, 409, f"{scenario} / {strategy}: an immediate retry is 409")
        t.ok(early.headers.get("retry-after"), "with Retry-After", early.headers)
        answers.append(early)
        sql("update idempotency_keys set locked_until = now() where client_id = 'shop-1'"
            f" and idem_key = {quote(key)}")
        wait_until(lambda: not key_row(key)["leased"], "the dead worker's lease to end")
    late = post(strategy, rcpt, key)
    answers.append(late)
    if strategy == "refund (lease)":
        made = sql_value("select refund_id from provider.refunds where idempotency_key ="
                         f" {quote('shop-1:' + key)}")
        t.ok(late.status == 201 and late.json().get("provider_refund_id") == made,
             f"{scenario} / refund: the retry gets the SAME refund, by the derived key",
             (late, made))
    if strategy == "lease":
        charge = held.charges(f"shop-1:{key}")[0]["charge_id"]
        t.ok(late.status == 201 and late.json().get("charge_id") == charge,
             f"{scenario} / lease: the retry gets the SAME charge, by the derived key",
             (late, charge))
    # The naive strategy wrote nothing before the kill: its retry charges
    # again and answers 201.
    record(scenario, strategy, answers, effects(strategy, rcpt), expect,
           [201] if strategy == "naive" else [409, 201])
api.stop()
held.stop()
api = Api(port=api.port, name=f"api-{new_key('r')}", **env).start()

# The transactional strategy: the API dies while the order's transaction
# is open (held by a lock); the retry waits, then replays or does the work.
rcpt, key = new_key("cust"), new_key()
lock = PsqlSession()
lock.run("begin; lock table orders in share mode;")
lost = Background(post, "transactional", rcpt, key)
dead = wait_until(lambda: sql_value("select string_agg(pid::text, ',') from pg_stat_activity"
                                    " where wait_event = 'relation' and query like"
                                    " '%tx_execute(%'"),
                  "the order to block on the held table")
api.kill9()
t.ok(lost.cut(), f"{scenario} / transactional: the client got no answer")
restart_api()
retry = Background(post, "transactional", rcpt, key)
# The retry's own backend (not the dead request's) waits on a lock: on the
# held table too (the key is written after the business rows), or on a row
# the dead request's transaction has locked. The dead request's backend may
# still be waiting beside it, or may be gone already: PostgreSQL ends it by
# itself once it sees its client gone (client_connection_check_interval),
# and whether it has by now depends only on how fast the API restarted.
wait_until(lambda: int(sql_value("select count(*) from pg_stat_activity where "
                                 "wait_event_type = 'Lock' and query like"
                                 f" '%tx_execute(%' and pid not in ({dead})")) == 1,
           "the retry to wait behind the held table or the dead request's transaction")
lock.run("commit;")
lock.close()
answer = retry.wait()
record(scenario, "transactional", [answer], effects("transactional", rcpt), 1, [201])

# Two refunds of one payment at once, that together exceed it: the amount
# is held when the first takes its key, so the second is refused (409,
# nothing taken) and, once the first has succeeded, its retry is a 422.
scenario = "two refunds exceeding the payment"
rcpt = new_key("acc")
k1, k2 = new_key(), new_key()
body("refund (lease)", rcpt)
answers = [Background(post, "refund (lease)", rcpt, k, amount=60000) for k in (k1, k2)]
answers = [x.wait() for x in answers]
retry = post("refund (lease)", rcpt, (k1, k2)[[x.status for x in answers].index(409)]
             if 409 in [x.status for x in answers] else k2, amount=60000)
record(scenario, "refund (lease)", answers + [retry], effects("refund (lease)", rcpt), 1,
       [201, 409, 422])

# 6. The provider is down, then back.
scenario = "provider down, then a retry"
rcpt, key = new_key("acc"), new_key()
provider.stop()
down = post("lease", rcpt, key)
provider = Provider(port=provider.port, name=f"provider-{new_key('r')}",
                    IDEM_PROVIDER_LATENCY_MS=LATENCY_MS).start()
up = post("lease", rcpt, key)
record(scenario, "lease", [down, up], effects("lease", rcpt), 1, [502, 201])

# 7. A declined card, then a retry.
key = new_key()
first = post("lease", "decline", key)
again = post("lease", "decline", key)
t.ok(again.replayed and again.body == first.body, "the decline is replayed", again)
record("card declined, then a retry", "lease", [first, again],
       len(provider.charges(f"shop-1:{key}")), 0, [402, 402])

# 8. The provider is slower than the timeout, then a retry.
scenario = "provider slower than the timeout, then a retry"
# With a new provider key per attempt, every retry is another slow charge
# and the client never gets an answer. With the derived key, the provider
# answers an immediate retry 409 while it still works on the charge, and
# the retry after its Retry-After gets that charge.
def slow_charges(amount):
    """Charges to the slow recipient of this amount: this strategy's own
    (each has its amount), not another test's key that a recovery job
    sends to this provider meanwhile."""
    return int(sql_value("select count(*) from provider.charges where recipient = 'slow'"
                         f" and amount = {amount}"))


for amount, (strategy, expect, statuses) in enumerate([("lease", 1, [504, 409, 201]),
                                                       ("fresh provider key", 2, [504, 504]),
                                                       ("naive", 2, [504, 504])], 4242):
    key = new_key()
    first = post(strategy, "slow", key, amount=amount)
    wait_until(lambda: slow_charges(amount) == 1, "the slow charge to be recorded")
    answers = [first, post(strategy, "slow", key, amount=amount)]
    if strategy == "lease":
        if answers[-1].status == 201:
            # The provider had finished thinking before the retry came (a
            # slow machine): the retry got the charge at once.
            statuses = [504, 201, 201]
        time.sleep(int(answers[-1].headers.get("retry-after", "1")))
        answers.append(post(strategy, "slow", key, amount=amount))
    else:
        wait_until(lambda: slow_charges(amount) == 2, "the second slow charge")
    record(scenario, strategy, answers, slow_charges(amount), expect, statuses)

# 9. A worker whose lease was taken over finishes late: its result is not
# written. It is held up in the database (a psql session locks the payments
# table its completion writes first) until its lease expires and a retry
# takes the key over.
scenario = "late worker after a take-over"
rcpt, key = new_key("acc"), new_key()
lock = PsqlSession()
lock.run("begin; lock table payments in share mode;")


def blocked_completions():
    return int(sql_value("select count(*) from pg_stat_activity where wait_event = "
                         "'relation' and query like '%lease_complete(%'"))


def counter(name):
    text = request(api.port, "GET", "/metrics").body.decode()
    return int(re.search(rf"^{name} (\d+)$", text, re.M).group(1))


fenced, takeovers = counter("idem_lease_fenced_total"), counter("idem_lease_takeovers_total")
late = Background(post, "lease", rcpt, key)
wait_until(lambda: blocked_completions() == 1, "the first worker to block on completion")
wait_until(lambda: not key_row(key)["leased"], "the first worker's lease to expire")
taker = Background(post, "lease", rcpt, key)
wait_until(lambda: blocked_completions() == 2, "the retry to take over and block too")
t.eq(key_row(key)["lease_id"], 2, f"{scenario}: the retry holds lease 2")
lock.run("commit;")
lock.close()
a, b = late.wait(), taker.wait()
t.ok(b.status == 201 and not b.replayed, f"{scenario}: the new holder completes", b)
t.ok(a.status == 409 or (a.status == 201 and a.replayed and a.body == b.body),
     f"{scenario}: the late worker answers what the key holds (409 or the replay)", a)
t.eq(key_row(key)["response"], b.body.decode(), f"{scenario}: the key holds the new holder's response")
t.eq(int(sql_value(f"select count(*) from payments where idem_key = {quote(key)}")), 1,
     f"{scenario}: one payment row")
t.ok("its late result was not written" in api.read_log(), f"{scenario}: the API logged it")
t.eq((counter("idem_lease_fenced_total") - fenced,
      counter("idem_lease_takeovers_total") - takeovers), (1, 1),
     f"{scenario}: /metrics counts the take-over and the fenced result")
record(scenario, "lease", [a, b], effects("lease", rcpt), 1, [a.status, 201])

api.stop()
provider.stop()

# One block per scenario, in the order they first ran.
order = {}
for row in table:
    order.setdefault(row[0], len(order))
table.sort(key=lambda row: order[row[0]])
width = [max(len(row[i]) for row in table + [("scenario", "strategy", "client saw",
                                               "effect")]) for i in range(4)]
lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(
    ("scenario", "strategy", "client saw", "effect"), width)) + " |",
    "|" + "|".join("-" * (w + 2) for w in width) + "|"]
lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(row, width)) + " |" for row in table]
print("\n".join(lines), file=sys.stderr)
t.done()
