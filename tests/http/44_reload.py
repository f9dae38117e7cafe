"""A reload (SIGHUP to the parent: kodev reload, systemd's ExecReload)
keeps everything: settings, counters, routes, jobs, and the requests in
flight. Kore reloads the module in the parent and in every worker; a worker
swaps its code only once it holds no work, so nothing it was doing is lost,
and a worker forked later by the reloaded parent works like the others."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, HEALTH_BOUND, JOB_BOUND, Api, Background,  # noqa: E402
                     Provider, PsqlSession, Tap, charges_to, key_row, new_key, quote, request,
                     sql, sql_value, wait_until)

t = Tap()
# The lease is far above what a payment held in flight takes here (a
# payment is held at its completion while a reload happens): no retry or
# recovery job takes it over meanwhile, however slow the machine.
LEASE = 30
# The service's statements end after IDEM_DB_TIMEOUT_MS (5 s by default),
# a held completion too: held by a lock for as long as the test's steps
# take, it must outlast them however slow the machine (a plain run beside
# a loaded one saw the held payment canceled at 5 s). A bound on a hang.
HOLD_BOUND = 60
provider = Provider(name="provider-reload", IDEM_PROVIDER_LATENCY_MS=1500).start()
env = {"IDEM_PROVIDER_URL": provider.url, "IDEM_LEASE_SECONDS": LEASE,
       "IDEM_PROVIDER_TIMEOUT_MS": 4000, "IDEM_RECOVERY_AFTER_SECONDS": 1,
       "IDEM_RECOVERY_INTERVAL_SECONDS": 1, "IDEM_CLEANUP_INTERVAL_SECONDS": 1,
       "IDEM_RETENTION_SECONDS": 3600, "IDEM_DB_TIMEOUT_MS": HOLD_BOUND * 1000}
api = Api(name="api-reload", **env).start()
PUBLIC = f"http://127.0.0.1:{api.port}/problems/"


def counter(name, labels=""):
    text = request(api.port, "GET", "/metrics").body.decode()
    line = name + ("{" + labels + "}" if labels else "")
    m = re.search("^" + re.escape(line) + r" (\d+)$", text, re.M)
    return int(m.group(1)) if m else None


def created_orders():
    return counter("idem_requests_total", 'route="POST /v1/orders",outcome="created"')


def reloads(k):
    """How many times its workers reloaded (the parent reloads too, and
    logs it the same way: not counted)."""
    return sum(1 for line in k.read_log().splitlines()
               if line.startswith("[wrk ") and "reloaded '" in line)


def handled_sighup(k, mark):
    """The workers that, after the log's first mark characters, began to
    drain for a reload (from then on they accept no new connection) or
    reloaded."""
    return {int(m.group(1)) for m in re.finditer(
        r"(?m)^\[wrk (\d+)\]: (?:reload waits for |reloaded ')", k.read_log()[mark:])}


def blocked_completions():
    """Payments charged and waiting to be completed: their completion waits
    on a lock of the payments table a psql session holds (hold())."""
    return int(sql_value("select count(*) from pg_stat_activity where wait_event = "
                         "'relation' and query like '%lease_complete(%'"))


def hold():
    """Holds every payment's completion (its writes to the payments table)
    until the session commits: a payment in flight, as long as the test
    needs, whatever the machine's speed."""
    s = PsqlSession()
    s.run("begin; lock table payments in share mode;")
    return s


def order(key, customer="c-reload"):
    return api.post("/v1/orders", {"customer_id": customer, "amount": 1000,
                                   "currency": "RUB"}, key=key, timeout=ANSWER_BOUND)


def old_finished_key():
    """A finished key past the retention, for the cleanup job to delete."""
    k = new_key("old")
    sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
        " status, status_code, response, created_at, finished_at) values ('shop-1', "
        f"{quote(k)}, 'orders.create', repeat('b', 64), 'done', 201, '{{}}',"
        " now() - interval '2 hours', now() - interval '2 hours')")
    return k


def abandoned_payment(recipient):
    """An in-progress payment whose lease ended, for the recovery job."""
    k = new_key("abandoned")
    sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
        " status, lease_id, locked_until, request) values ('shop-1', "
        f"{quote(k)}, 'payments.create', repeat('c', 64), 'in_progress', 1,"
        " now() - interval '10 seconds', "
        f"""'{{"amount": 700, "currency": "RUB", "recipient": "{recipient}"}}')""")
    return k


workers = sorted(api.workers())
t.eq(len(workers), 2, "the API runs two workers")
first = api.post("/v1/payments", {"amount": 100, "currency": "RUB", "recipient": "acc-r"},
                 key=new_key("pay"))
t.eq(first.status, 201, "a payment before the reload is created")
before = created_orders()

# Load while the reload happens: orders with fresh keys and replays, and a
# payment whose provider call is in flight when SIGHUP arrives.
stop = threading.Event()
answers, errors = [], []


def load(n):
    keys = []
    while not stop.is_set():
        k = new_key(f"load{n}")
        try:
            answers.append((order(k).status, "fresh"))
            keys.append(k)
            answers.append((order(keys[len(keys) // 2]).status, "replay"))
        except Exception as e:  # a cut connection is a failure of the test
            errors.append(repr(e))


threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(4)]
for th in threads:
    th.start()
wait_until(lambda: len(answers) >= 20, "orders under load before the reload")
pay_key, pay_rcpt = new_key("inflight"), new_key("acc")
held = hold()
inflight = Background(api.post, "/v1/payments",
                      {"amount": 500, "currency": "RUB", "recipient": pay_rcpt}, key=pay_key)
wait_until(lambda: blocked_completions() == 1, "the payment to be charged and held")
n = reloads(api)
mark = len(api.read_log())
os.kill(api.proc.pid, signal.SIGHUP)
# The worker holding the payment drains; the other reloads at once and
# takes every new connection meanwhile. A connection the draining worker
# accepted before it saw the SIGHUP waits for its drain, as it may: every
# worker has handled the SIGHUP (said it drains, and from then on accepts
# nothing, or reloaded) before /healthz is asked (a loaded plain run once
# asked between the other's reload and the draining one's line, and
# /healthz waited out the held payment). The other worker may drain too,
# for a moment, for an order of the load: its line is not the one that
# matters, so each worker is waited on by its id.
wait_until(lambda: reloads(api) >= n + 1, "the other worker to reload")
wait_until(lambda: handled_sighup(api, mark) == {1, 2},
           "both workers to handle the SIGHUP (the one with the payment to drain)",
           show=lambda: handled_sighup(api, mark))
waited = []
for _ in range(6):
    started = time.monotonic()
    status = request(api.port, "GET", "/healthz", timeout=HEALTH_BOUND).status
    waited.append((status, round(time.monotonic() - started, 2)))
waited_ok = all(s == 200 and w < 1.0 for s, w in waited)
drained_before = reloads(api) == n + 1
held.run("commit;")
held.close()
wait_until(lambda: reloads(api) >= n + 2, "both workers to reload")
during = len(answers)
wait_until(lambda: len(answers) >= during + 20, "orders under load after the reload")
stop.set()
for th in threads:
    th.join(ANSWER_BOUND)

paid = inflight.wait(ANSWER_BOUND)
t.ok(drained_before, "the worker with the payment in flight did not reload before it "
     "was completed")
t.ok(waited_ok, "while one worker drained, new connections were served at once by the "
     "other", waited)
t.eq(paid.status, 201, "the payment in flight during the reload is created")
t.eq(charges_to(pay_rcpt), 1, "with exactly one charge")
t.eq(errors, [], "no request under load lost its connection")
t.ok(len(answers) >= 40 and all(s == 201 for s, _ in answers),
     f"every order under load was answered 201 ({len(answers)} answers)",
     [a for a in answers if a[0] != 201][:5])
t.eq(sorted(api.workers()), workers, "the same two workers run: none died")
log = api.read_log()
t.ok("forced no reloaded" in log and "work drained; reloading" in log,
     "a worker with work in flight waited for it before it reloaded")
t.ok(not re.search(r"exited with status|gone|restarting worker", log),
     "Kore logged no dead worker", log[-2000:])

# Every route and setting after the reload.
r = request(api.port, "GET", "/nope")
t.eq((r.status, r.json()["type"]), (404, PUBLIC + "not-found"),
     "a problem's type is the public URL, not (null)")
after = created_orders()
t.ok(after is not None and after >= before + sum(1 for s, k in answers if k == "fresh"),
     "the request counters went on from where they were", (before, after))
r = api.post("/v1/payments", {"amount": 100, "currency": "RUB", "recipient": "acc-r2"},
             key=new_key("pay"))
t.eq((r.status, r.json()["status"]), (201, "succeeded"),
     "a payment after the reload reaches the provider")
dup_key = new_key("dup")
held = hold()
slow = Background(api.post, "/v1/payments",
                  {"amount": 100, "currency": "RUB", "recipient": "acc-r3"}, key=dup_key)
wait_until(lambda: key_row(dup_key) is not None, "the first attempt to reserve")
dup = api.post("/v1/payments", {"amount": 100, "currency": "RUB", "recipient": "acc-r3"},
               key=dup_key)
held.run("commit;")
held.close()
t.ok(dup.status == 409 and 1 <= int(dup.headers.get("retry-after", "0")) <= LEASE,
     "a duplicate gets 409 with a Retry-After within the lease setting", dup.headers)
t.eq(slow.wait(ANSWER_BOUND).status, 201, "and the first attempt completes")
r = api.get("/v1/bonuses/c-reload")
t.ok(r.status == 200 and r.json()["balance"] > 0, "GET /v1/bonuses/{id} answers", r)
r = api.post("/v1/bonuses", {"customer_id": "c-reload", "points": -1, "reason": "x"},
             key=new_key("bonus"))
t.eq(r.status, 201, "POST /v1/bonuses answers")
r = api.get("/v1/orders?customer_id=c-reload")
t.ok(r.status == 200 and len(r.json()["orders"]) > 0, "GET /v1/orders answers", r)
t.eq(request(api.port, "GET", "/healthz").status, 200, "GET /healthz answers")

# The jobs run with their settings: the cleanup deletes an old key, and the
# recovery takes an abandoned payment over once (lease 2), not every tick.
old = old_finished_key()
rcpt = new_key("acc")
lost = abandoned_payment(rcpt)
wait_until(lambda: key_row(old) is None, "the cleanup job to delete the old key")
t.ok(key_row(old) is None, "the cleanup job still deletes keys past the retention")
wait_until(lambda: key_row(lost)["status"] == "done", "the recovery job to finish it")
row = key_row(lost)
t.eq((row["lease_id"], row["status_code"]), (2, "201"),
     "the recovery job took the abandoned payment over once and completed it")
t.eq(charges_to(rcpt), 1, "one charge for it at the provider")

# A worker forked by the reloaded parent: kill one, Kore starts another.
victim = api.workers()[0]
os.kill(victim, signal.SIGKILL)
wait_until(lambda: len(api.workers()) == 2 and victim not in api.workers(),
           "Kore to replace the killed worker")
counts = set()
for _ in range(20):
    r = request(api.port, "GET", "/nope")
    counts.add(r.json()["type"])
    m = request(api.port, "GET", "/metrics")
    counts.add(m.status)
t.eq(counts, {PUBLIC + "not-found", 200},
     "every worker, the new one too, has the settings and the metrics")
t.ok(created_orders() >= after, "the counters survived the new worker")
old = old_finished_key()
wait_until(lambda: key_row(old) is None, "the jobs to run in the new worker 1",
           timeout=JOB_BOUND)
t.ok(key_row(old) is None, "the jobs run after the worker was replaced")

# A recovery round over many abandoned payments ends between two of them
# for a reload, rather than after all (each takes the provider 1.5 s).
held = hold()
batch = [(abandoned_payment(r), r) for r in (new_key("acc") for _ in range(4))]
keys_sql = ", ".join(quote(k) for k, _ in batch)


def recovered_count():
    return int(sql_value("select count(*) from idempotency_keys where status = 'done'"
                         f" and idem_key in ({keys_sql})"))


# The job charges the first and waits to complete it (held); the reload
# comes then. The first is let go and the lock taken again at once: the
# session's lock waits behind the first's completion, and holds the next
# payment's, which comes after the provider's 1.5 s.
wait_until(lambda: blocked_completions() == 1, "the recovery job to charge the first "
           "and wait to complete it", timeout=JOB_BOUND)
n = reloads(api)
os.kill(api.proc.pid, signal.SIGHUP)
wait_until(lambda: reloads(api) >= n + 1, "the idle worker to reload")
held.run("commit; begin; lock table payments in share mode;")
wait_until(lambda: reloads(api) >= n + 2, "both workers to reload")
t.eq(recovered_count(), 1,
     "a reload waits for the payment the recovery job works on, not for all of them")
held.run("commit;")
held.close()
wait_until(lambda: recovered_count() == 4, "the new code to recover the rest",
           timeout=JOB_BOUND)
t.eq([charges_to(r) for _, r in batch], [1, 1, 1, 1], "each once at the provider")

# The fake provider reloads too.
os.kill(provider.proc.pid, signal.SIGHUP)
wait_until(lambda: reloads(provider) >= 2, "the provider's workers to reload")
r = api.post("/v1/payments", {"amount": 100, "currency": "RUB", "recipient": "acc-r4"},
             key=new_key("pay"))
t.eq(r.status, 201, "a payment goes through the reloaded provider")

# kodev reload: it signals the pid in ./kore.pid, the pidfile kore.conf names.
with open(os.path.join(os.path.dirname(__file__), "..", "..", "kore.conf")) as f:
    t.ok(re.search(r"^pidfile kore\.pid$", f.read(), re.M),
         "kore.conf keeps its pid in kore.pid, where kodev reload looks")
with tempfile.TemporaryDirectory() as d:
    with open(os.path.join(d, "kore.pid"), "w") as f:
        f.write(f"{api.proc.pid}\n")
    n = reloads(api)
    out = subprocess.run(["kodev", "reload"], cwd=d, capture_output=True, text=True)
    t.eq(out.returncode, 0, "kodev reload signals the API")
    wait_until(lambda: reloads(api) >= n + 2, "kodev reload to reload both workers")
t.eq(len(api.workers()), 2, "two workers after kodev reload")
t.eq(order(new_key("after")).status, 201, "and they serve")

api.stop()
provider.stop()
t.done()
