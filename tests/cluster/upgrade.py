"""make test-upgrade (scripts/test-upgrade): a rolling upgrade under load.

The previous release runs as make cluster (3 instances behind haproxy).
Clients send orders and payments through haproxy, each key retried on
every retryable answer until it has its final one. Meanwhile this
release's migrations are applied, then each instance in turn is stopped
(SIGTERM to its parent, as a service manager stops Kore) and started again
as this release on its port: the previous make cluster's supervisor starts
it from its configuration file, rewritten first to load this tree's build
(as a changed systemd unit would). The next instance is stopped only once
haproxy has the new one up.

Checked afterwards:
- every answer is the contract's: 201; a 409 or 503 problem with
  Retry-After; a 502 or 504 problem (the provider). A request cut by the
  stop of its instance (Kore's SIGTERM cuts requests in flight: a broken
  connection, or haproxy's own 502) is accepted only if it was in flight
  at that stop; its client then leaves the key, to the recovery job;
- every function of the previous release's schema is still there after
  make migrate, the same object with the same result type (a call of the
  previous release may be running inside it while a migration commits);
- every instance runs this release's build;
- the keys the stops cut are finished by the recovery job: no key of the
  run in progress, within its bound, with no client's help;
- every acknowledged key replays its answer, byte for byte, and every key
  ends with a final answer (the cut ones too);
- nothing twice: one order per key, one payment per key, one charge per
  payment key at the provider (its own database), and none for a key
  that did not succeed.
"""

import collections
import http.client
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, COMMAND_BOUND, ROOT, Tap, alive, cluster_port,  # noqa: E402
                     post, quote, request, sql, sql_value, wait_until)

KEYS = int(os.environ.get("IDEM_UPGRADE_KEYS", "400"))
CLIENTS = 6
# Bounds on hangs (a test fails on one only when its condition never
# comes): an instance's processes to end on SIGTERM (its requests in
# flight answered first); a new instance to serve, and haproxy to see it;
# a share of the keys to be sent.
STOP_BOUND = 60
START_BOUND = 120
KEYS_BOUND = 300
# A readiness probe gives up after PROBE_S and is asked again; a request
# to one instance, and one command: bounds on a hang.
PROBE_S = 2
REQUEST_S = 10
CLUSTER_DIR = os.environ["IDEM_CLUSTER_DIR"]
OLD_ROOT = os.environ["IDEM_UPGRADE_OLD_ROOT"]
PORT = cluster_port()
API_PORT = int(os.environ["IDEM_CLUSTER_API_PORT"])
INSTANCES = int(os.environ["IDEM_INSTANCES"])
PROVIDER_DB = os.environ["IDEM_TEST_PROVIDER_DATABASE_URL"]
RUN = f"up{int(time.time())}"
# Bounds on a hang, far above need: a key's retries, the recovery job.
KEY_SECONDS = 120
RECOVERY_SECONDS = 120

t = Tap()
t0 = time.monotonic()


def now():
    return time.monotonic() - t0


def log(text):
    t.note(f"[{now():6.1f}s] {text}")


# --- the load ---------------------------------------------------------------

Answer = collections.namedtuple("Answer", "key status body headers start end")
answers = []
lock = threading.Lock()
keys = {}               # key -> (kind, path, body)
finals = {}             # key -> the final Answer the load got
cut = set()             # keys the load left after a cut answer
stops = []              # (from, to, instance): SIGTERM sent to its processes gone
numbers = itertools.count()
stop_load = threading.Event()


def problem(a):
    return a.headers.get("content-type", "").startswith("application/problem+json")


def retryable(a):
    """A retryable answer of the service itself (not the edge's page)."""
    if a.status is None or not problem(a):
        return False
    if a.status in (409, 503):
        return "retry-after" in a.headers
    return a.status in (502, 504)


def send(key):
    kind, path, body = keys[key]
    start = now()
    try:
        r = post(PORT, path, body, key=key, timeout=ANSWER_BOUND)
        a = Answer(key, r.status, r.body, r.headers, start, now())
    except (OSError, http.client.HTTPException) as e:
        a = Answer(key, None, repr(e).encode(), {}, start, now())
    with lock:
        answers.append(a)
    return a


def new_key():
    key = f"{RUN}-{next(numbers)}"
    if random.random() < 0.5:
        keys[key] = ("order", "/v1/orders", {
            "customer_id": f"{RUN}-c{random.randint(1, 30)}",
            "amount": random.randint(100, 500000), "currency": "RUB"})
    else:
        keys[key] = ("payment", "/v1/payments", {
            "amount": random.randint(100, 100000), "currency": "RUB",
            "recipient": f"acc-{random.randint(1, 50)}", "purpose": key})
    return key


def client():
    """Keys one after another, each retried until its final answer; a key
    whose request was cut is left (to the recovery job)."""
    while not stop_load.is_set():
        with lock:
            key = new_key()
        deadline = now() + KEY_SECONDS
        while now() < deadline:
            a = send(key)
            if a.status == 201:
                with lock:
                    finals[key] = a
                break
            if a.status is None or (a.status in (502, 503, 504) and not problem(a)):
                with lock:
                    cut.add(key)
                break
            if not retryable(a):
                break
            time.sleep(0.2)


# --- the upgrade ------------------------------------------------------------

def instance_pid(i):
    try:
        with open(f"{CLUSTER_DIR}/api{i}.pid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def build_of(pid):
    """The tree whose build process pid has mapped (its app .so)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    for root in (ROOT, OLD_ROOT):
        if f" {os.path.realpath(root)}/" in maps:
            return root
    return None


def healthy(i):
    try:
        return request(API_PORT + i, "GET", "/healthz", timeout=PROBE_S).status == 200
    except OSError:
        return False


probes = itertools.count()


def haproxy_sends_to(i):
    """Whether haproxy has instance i up: a read pinned to it
    (X-Idem-Instance, which haproxy follows only while the instance is
    up) shows in that instance's access log. haproxy 2.6 here logs no
    state change for a server that was out for less than its two failed
    checks, and has no stats socket to ask."""
    probe = f"{RUN}-probe-{i}-{next(probes)}"
    try:
        request(PORT, "GET", f"/v1/bonuses/{probe}",
                headers={"Authorization": "Bearer dev-shop-1",
                         "X-Idem-Instance": f"api{i}"}, timeout=REQUEST_S)
    except OSError:
        return False
    with open(f"{CLUSTER_DIR}/api{i}.log", errors="replace") as f:
        return f"path=/v1/bonuses/{probe} " in f.read()


def new_conf(i):
    """This release's kore.conf for instance i: its own pid file, and this
    tree's build (as scripts/cluster writes it)."""
    with open(os.path.join(ROOT, "kore.conf")) as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        if line.startswith("pidfile "):
            line = f"pidfile {CLUSTER_DIR}/api{i}.pid"
        elif line.startswith("load ./app.so"):
            line = line.replace("./app.so", os.path.join(ROOT, "app.so"), 1)
        out.append(line)
    tmp = f"{CLUSTER_DIR}/api{i}.conf.new"
    with open(tmp, "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(tmp, f"{CLUSTER_DIR}/api{i}.conf")


def new_migrations():
    """This release's migrations that the previous one does not have as
    they are: a file of sql/ that is new, or changed."""
    out = []
    for name in sorted(os.listdir(os.path.join(ROOT, "sql"))):
        if not name.endswith(".sql"):
            continue
        with open(os.path.join(ROOT, "sql", name), "rb") as f:
            ours = f.read()
        try:
            with open(os.path.join(OLD_ROOT, "sql", name), "rb") as f:
                theirs = f.read()
        except FileNotFoundError:
            theirs = None
        if ours != theirs:
            out.append(os.path.join(ROOT, "sql", name))
    return out


def migrate():
    """make migrate, as an operator runs it before the new instances: it
    adopts the database the previous release made (its migrations recorded
    by their checksums, not run again under the load) and applies what this
    release adds."""
    files = new_migrations()
    log(f"this release's migrations: make migrate "
        f"(new or changed: {[os.path.basename(f) for f in files] or 'none'})")
    before = functions()
    r = subprocess.run([os.path.join(ROOT, "scripts", "migrate"),
                        os.environ["IDEM_TEST_DATABASE_URL"]],
                       capture_output=True, text=True, timeout=COMMAND_BOUND)
    t.ok(r.returncode == 0, "make migrate applies this release's migrations while "
         "the previous release serves", r.stdout[-2000:] + r.stderr[-2000:])
    # A call of the previous release may be running inside any of its
    # functions while a migration commits: none is dropped (the same
    # object after), and none changes its result type (docs/limits.md).
    after = functions()
    t.ok("lease_reserve(text,text,text,text,jsonb,integer,integer)" in before,
         "the previous release's functions are read where it made them", sorted(before))
    changed = sorted(f"{sig}: " + ("gone" if sig not in after else "dropped and made again"
                                   if after[sig][0] != oid else f"{res} -> {after[sig][1]}")
                     for sig, (oid, res) in before.items()
                     if after.get(sig) != (oid, res))
    t.eq(changed, [], f"every one of the previous release's {len(before)} functions "
         "is still there, with its arguments and result type, never dropped")


def functions():
    """The schema's functions: signature -> (object id, result type)."""
    return {sig: (oid, res) for oid, sig, res in sql(
        "select p.oid, p.oid::regprocedure, pg_get_function_result(p.oid)"
        "  from pg_proc p where p.pronamespace = current_schema()::regnamespace")}


def replace(i):
    old = instance_pid(i)
    try:
        with open(f"/proc/{old}/task/{old}/children") as f:
            processes = [old] + [int(p) for p in f.read().split()]
    except OSError:
        processes = [old]
    new_conf(i)
    log(f"api{i}: SIGTERM to its parent (pid {old}, {os.path.basename(build_of(old) or '?')})")
    sent = now()
    os.kill(old, signal.SIGTERM)
    # Until its last worker is gone, a request accepted there may be cut.
    wait_until(lambda: not any(alive(p) for p in processes),
               f"api{i}'s processes to end", STOP_BOUND, 0.01)
    stops.append((sent, now(), i))
    log(f"api{i}: its processes ended ({now() - sent:.2f} s)")

    def replaced():
        pid = instance_pid(i)
        return pid not in (None, old) and alive(pid) and healthy(i)
    wait_until(replaced, f"api{i} to serve again", START_BOUND, 0.1)
    pid = instance_pid(i)
    log(f"api{i}: this release's instance serves (pid {pid})")
    wait_until(lambda: haproxy_sends_to(i), f"haproxy to have api{i} up", START_BOUND, 0.2)
    log(f"api{i}: haproxy has it up")
    return pid


# --- main -------------------------------------------------------------------

def main():
    log(f"run {RUN}: {CLIENTS} clients, {KEYS} keys at least")
    for i in range(1, INSTANCES + 1):
        t.ok(build_of(instance_pid(i)) == OLD_ROOT,
             f"api{i} runs the previous release's build at the start")
    clients = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for th in clients:
        th.start()
    try:
        wait_until(lambda: len(keys) >= KEYS // 5, "keys before the migrations", KEYS_BOUND, 0.2)
        log(f"{len(keys)} keys; this release's migrations")
        migrate()
        # Each stage under its share of the load: the migrated database
        # with the previous release alone, then with each mix of the two.
        for i in range(1, INSTANCES + 1):
            wait_until(lambda n=len(keys): len(keys) >= n + KEYS // 5,
                       "keys before the next instance", KEYS_BOUND, 0.2)
            replace(i)
        n = len(keys)
        wait_until(lambda: len(keys) >= max(KEYS, n + KEYS // 5), "the last keys",
                   2 * KEYS_BOUND, 0.2)
    finally:
        stop_load.set()
        for th in clients:
            th.join()
    log(f"load ended: {len(keys)} keys, {len(answers)} answers, "
        f"{len(finals)} acknowledged, {len(cut)} cut by a stop")
    check()


def in_flight_at_a_stop(a):
    return any(a.start <= to and a.end >= since for since, to, _ in stops)


def check():
    for i in range(1, INSTANCES + 1):
        t.ok(build_of(instance_pid(i)) == ROOT, f"api{i} runs this release's build")

    statuses = collections.Counter((a.status, problem(a)) for a in answers)
    log(f"answers (status, problem+json): {dict(statuses)}")
    for a in answers:
        if a.status is None or not (a.status == 201 or problem(a)):
            log(f"cut: {a.key} {a.status} sent at {a.start:.2f} s, ended {a.end:.2f} s")
    log("stops: " + ", ".join(f"api{i} {since:.2f}-{to:.2f} s" for since, to, i in stops))
    wrong = [a for a in answers if a.status != 201 and not retryable(a)
             and not ((a.status is None or (a.status == 502 and not problem(a)))
                      and in_flight_at_a_stop(a))]
    t.eq([(a.key, a.status, a.body[:400]) for a in wrong[:5]], [],
         "every answer is the contract's (a cut only in flight at a stop)")

    # The keys the stops cut (their lease held by a stopped instance, or
    # their order's transaction rolled back), with no retry of a client:
    # the recovery job finishes every payment in progress.
    started = now()
    log("keys in progress when the load ended: " + sql_value(
        "select count(*) from idempotency_keys where status = 'in_progress'"
        f" and idem_key like {quote(RUN + '-%')}"))

    def none_in_progress():
        return sql_value("select count(*) from idempotency_keys where status ="
                         f" 'in_progress' and idem_key like {quote(RUN + '-%')}") == "0"
    wait_until(none_in_progress, "the recovery job to finish the keys in progress",
               RECOVERY_SECONDS, 0.5)
    t.ok(True, f"no key left in progress {now() - started:.1f} s after the load "
         f"({len(cut)} cut by a stop, left to the recovery job)")

    # Every key to its end: an acknowledged one replays what its client
    # was told; a cut one gets its final answer now.
    last = {}
    pending = list(keys)

    def retry():
        while True:
            with lock:
                if not pending:
                    return
                key = pending.pop()
            deadline = now() + KEY_SECONDS
            while now() < deadline:
                a = send(key)
                if a.status is not None and not retryable(a):
                    break
                time.sleep(0.2)
            last[key] = a
    threads = [threading.Thread(target=retry) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    t.eq([k for k in keys if last[k].status != 201][:5], [],
         "every key ends with a 201 (the cut ones too)")
    lost = [k for k, a in finals.items()
            if (last[k].status, last[k].body) != (a.status, a.body)
            or last[k].headers.get("idempotent-replayed") != "true"]
    t.eq(lost[:5], [], f"every one of the {len(finals)} acknowledged keys replays "
         "its answer, byte for byte")

    # Nothing twice.
    kinds = {k: v[0] for k, v in keys.items()}
    for kind, table in (("order", "orders"), ("payment", "payments")):
        rows = dict(sql(f"select idem_key, count(*) from {table} where client_id ="
                        f" 'shop-1' and idem_key like {quote(RUN + '-%')} group by 1"))
        bad = [(k, rows.get(k)) for k in keys if kinds[k] == kind
               and int(rows.get(k, 0)) != (1 if last[k].status == 201 else 0)]
        t.eq(bad[:5], [], f"one {kind} per key that succeeded, none for the others")
    out = subprocess.run(
        ["psql", PROVIDER_DB, "-XAtq", "-F", "|", "-c",
         "select split_part(idempotency_key, ':', 2), count(*) from provider.charges"
         f" where idempotency_key like {quote('shop-1:' + RUN + '-%')} group by 1"],
        check=True, capture_output=True, text=True).stdout
    charges = dict(line.split("|") for line in out.splitlines() if line)
    bad = [(k, charges.get(k)) for k in keys if kinds[k] == "payment"
           and int(charges.get(k, 0)) != (1 if last[k].status == 201 else 0)]
    t.eq(bad[:5], [], "one charge at the provider per payment key that succeeded")

    with open(os.path.join(os.environ["IDEM_TEST_TMP"], "acknowledged.json"), "w") as f:
        json.dump([{"key": k, "path": keys[k][1], "body": keys[k][2],
                    "response": last[k].body.decode()}
                   for k in keys if last[k].status == 201], f)


main()
t.done()
