"""The chaos soak: orders, bonuses, transfers, payments and refunds, each
key sent as three concurrent duplicates on separate connections (one to
each of two API instances on one database, the third to either, so that
duplicates land on different processes), while faults are injected in a
seeded random order: a worker killed with SIGKILL (Kore's parent forks
another), a whole API instance killed with SIGKILL and started again, a
reload (SIGHUP), the fake provider killed for a few seconds, PostgreSQL
stopped and started. The provider misbehaves on its own besides: a tenth
of the payments go to its recipient "fail" (it answers 500, for ever) and
a twentieth to "slow" (it thinks past the API's provider timeout), and
the refunds likewise ("refund-fail", "refund-slow").

Afterwards the recovery job is given its time, every key is retried (same
key, same body) until it has its final answer, and the books are checked
in the database. Used by tests/http/47_chaos_soak.py (a few hundred keys,
every fault at least once, in make test) and tests/soak/soak.py (make
soak: 10,000 keys by default). Python standard library only.

Words used below. An answer is *final* when the key has its outcome: a
201, a 402 card-declined, or a saved 422 (insufficient-balance,
balance-limit-exceeded, payment-rejected, refund-rejected); those are the
*acknowledged* answers, which must agree byte for byte across a key's
duplicates and retries and with the key's row. A key whose provider
always fails ("fail", "refund-fail") can never be final: its end is a
502 of a fresh attempt (a 503 outcome-pending when the provider keeps
its 500s), and its row stays in_progress with nothing made.
"""

import collections
import hashlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time

from harness import (ANSWER_BOUND, EXIT_BOUND, HEALTH_BOUND, JOB_BOUND, STRIPE_SECRET, WAIT_SECONDS, Api,
                     DbProxy, Provider, StripeMock, TMP, alive, cluster, get, post, request,
                     sql)

PATHS = {"order": "/v1/orders", "bonus": "/v1/bonuses",
         "transfer": "/v1/bonuses/transfers", "payment": "/v1/payments",
         "refund": "/v1/refunds"}
OPERATIONS = {"order": "orders.create", "bonus": "bonuses.apply",
              "transfer": "bonuses.transfer", "payment": "payments.create",
              "refund": "refunds.create"}
OPS = tuple(PATHS)
LEASE_OPS = ("payment", "refund")
SAVED_422 = {"insufficient-balance", "balance-limit-exceeded",
             "payment-rejected", "refund-rejected"}
FAULTS = ("worker_kill9", "api_kill9_restart", "api_reload", "provider_down",
          "pg_restart")
# Workers are killed every few seconds by a thread of their own; the other
# faults come one after another from another thread, so that a worker may
# die while PostgreSQL or the provider is down (never while its instance
# restarts or reloads, which would only confuse the count of its workers).
OTHER_FAULTS = FAULTS[1:]


def derived_base(derived):
    """The derived key of generation 1 of a provider key of any generation
    (src/lease/lease.c, provider_key(): <client>:<key>:<n> is generation n
    of <client>:<key>; the soak's keys are never hashed and hold no ':')."""
    client, _, rest = derived.partition(":")
    return f"{client}:{rest.split(':', 1)[0]}"


class Config:
    """The soak's size and settings. With from_env the environment
    overrides them (SOAK_KEYS, SOAK_SECONDS, SOAK_GROUPS,
    SOAK_SETTLE_SECONDS, SOAK_PROVIDER); SOAK_SEED always, to replay a run's
    plan and order of faults. provider: "fake" (the fake provider) or
    "stripe" (the Stripe adapter against stripe-stateful-mock)."""

    def __init__(self, keys=10000, seconds=300, seed=None, groups=40,
                 settle_seconds=300, gap=(2.0, 6.0), kill_gap=(2.0, 5.0),
                 abandon=0.15, chaos_retries=6, http_timeout=30, from_env=True,
                 provider="fake"):
        env = os.environ if from_env else {"SOAK_SEED": os.environ.get("SOAK_SEED")}
        env = {k: v for k, v in env.items() if v}
        self.provider = env.get("SOAK_PROVIDER", provider)
        if self.provider not in ("fake", "stripe"):
            raise ValueError(f"SOAK_PROVIDER={self.provider}: fake or stripe")
        self.keys = int(env.get("SOAK_KEYS", keys))
        self.seconds = float(env.get("SOAK_SECONDS", seconds))
        seed = env.get("SOAK_SEED", seed)
        self.seed = int(seed) if seed is not None else random.SystemRandom().randrange(10**9)
        self.groups = int(env.get("SOAK_GROUPS", groups))
        self.settle_seconds = float(env.get("SOAK_SETTLE_SECONDS", settle_seconds))
        self.gap = gap                      # seconds between two other faults
        self.kill_gap = kill_gap            # seconds between two worker kills
        self.abandon = abandon              # share of keys never retried in the chaos
        self.chaos_retries = chaos_retries  # retries of each duplicate in the chaos
        self.http_timeout = http_timeout    # past it a request counts as a hang
        self.lease_seconds = 3
        self.provider_timeout_ms = 1500
        self.provider_latency_ms = 50


class Answer:
    __slots__ = ("phase", "instance", "status", "kind", "body", "replayed",
                 "retry_after", "seconds", "at")

    def __init__(self, phase, instance, status, kind, body=b"", replayed=False,
                 retry_after=None, seconds=0.0):
        self.phase = phase
        self.instance = instance
        self.status = status      # None: no answer (kind says why)
        self.kind = kind          # the problem type, or the error's name
        self.body = body
        self.replayed = replayed
        self.retry_after = retry_after
        self.seconds = seconds
        self.at = 0.0             # sent, in seconds since the chaos began

    def label(self):
        if self.status is None:
            return f"no answer ({self.kind})"
        return f"{self.status} {self.kind}" if self.kind else str(self.status)


class Key:
    """One operation: its key, client and body, and every answer it got."""

    def __init__(self, op, client, key, body, never=False, abandon=False,
                 refunds=()):
        self.op = op
        self.client = client
        self.key = key
        self.body = body          # a dict; bytes once sent (body_bytes)
        self.never = never        # its provider always fails
        self.abandon = abandon    # not retried in the chaos phase
        self.refunds = list(refunds)  # a payment's planned refunds (Keys)
        self.parent = None        # a refund's payment (Key)
        self.answers = []
        self.sent = False
        self._bytes = None

    def body_bytes(self):
        if self._bytes is None:
            self._bytes = json.dumps(self.body).encode()
        return self._bytes

    def final(self):
        """The first acknowledged answer, or None."""
        for a in self.answers:
            if is_final(a):
                return a
        return None


def is_final(a):
    return a.status in (201, 402) or (a.status == 422 and a.kind in SAVED_422)


def expected_status(a, op):
    """Whether an answer is one the contract allows here (a 500, a 400, a
    mismatch 422, a hang are not)."""
    if a.status is None:
        return a.kind != "timeout"
    if is_final(a):
        return True
    if a.status == 503:
        return True
    if op in LEASE_OPS:
        return (a.status, a.kind) in ((409, "request-in-progress"),
                                      (502, "provider-unavailable"),
                                      (504, "provider-timeout"))
    return False


def problem_type(resp):
    if resp.headers.get("content-type", "").startswith("application/problem+json"):
        try:
            return json.loads(resp.body)["type"].rsplit("/", 1)[-1]
        except (ValueError, KeyError, AttributeError):
            return "unparsable-problem"
    if resp.status >= 400:
        return "not-a-problem"
    return ""


def sha(data):
    return hashlib.sha256(data).hexdigest()


# --- the plan -----------------------------------------------------------------

def make_plan(cfg, run):
    """cfg.keys keys from the seed: orders 30%, bonuses 20%, transfers 15%,
    payments 25% and their refunds about 10%, over two clients and a few
    customers each (so that accounts are contended)."""
    rng = random.Random(cfg.seed)
    ncust = max(6, cfg.keys // 150)
    customers = {c: [f"soak-{run}-{c}-c{i}" for i in range(ncust)]
                 for c in ("shop-1", "shop-2")}
    roots, n = [], 0

    def key(op, i):
        return f"soak-{run}-{op}-{i}"

    while n < cfg.keys:
        client = rng.choice(("shop-1", "shop-2"))
        op = rng.choices(("order", "bonus", "transfer", "payment"), (30, 20, 15, 25))[0]
        abandon = rng.random() < cfg.abandon
        cust = customers[client]
        if op == "order":
            body = {"customer_id": rng.choice(cust), "amount": rng.randint(100, 50000),
                    "currency": rng.choice(("RUB", "EUR"))}
            if rng.random() < 0.5:
                body["comment"] = f"soak order {n}"
            k = Key(op, client, key(op, n), body, abandon=abandon)
        elif op == "bonus":
            points = rng.randint(1, 400) * (1 if rng.random() < 0.6 else -1)
            k = Key(op, client, key(op, n), {"customer_id": rng.choice(cust),
                                             "points": points, "reason": "soak"},
                    abandon=abandon)
        elif op == "transfer":
            a, b = rng.sample(cust, 2)
            k = Key(op, client, key(op, n), {"from_customer_id": a, "to_customer_id": b,
                                             "points": rng.randint(1, 300),
                                             "reason": "soak transfer"}, abandon=abandon)
        else:
            amount = rng.randint(200, 100000)
            x = rng.random()
            refunds = 0
            stripe = cfg.provider == "stripe"
            method = "tok_visa"
            if x < 0.10:
                # Fails for ever: the fake's 500, Stripe's kept 500 (every
                # attempt reconciled, then a new generation that fails).
                recipient, method = "fail", "tok_500"
            elif x < 0.15:
                # The fake thinks past the timeout; Stripe's first answer is
                # a kept 500, reconciled, then the next generation charged.
                recipient, method = "slow", f"tok_500|tok_visa|soak-{run}-{n}"
            elif x < 0.18:
                recipient, method = "decline", "tok_chargeDeclined"
            elif x < 0.20:
                recipient = "reject"
                if stripe:
                    amount = 100000000     # amount_too_large
            else:
                refunds = rng.choice((1, 1, 2)) if rng.random() < 0.375 else 0
                refunds = min(refunds, cfg.keys - n - 1)
                if refunds:
                    y = rng.random()
                    # Stripe's mock has no failing refunds.
                    recipient = ("refund-fail" if y < 0.10 and not stripe else
                                 "refund-slow" if y < 0.15 and not stripe else
                                 f"acc-{rng.randrange(1000)}")
                else:
                    recipient = f"acc-{rng.randrange(1000)}"
            body = {"amount": amount, "currency": "RUB", "recipient": recipient,
                    "purpose": f"soak payment {n}"}
            if stripe:
                body["recipient"] = f"acc-{rng.randrange(1000)}"
                body["payment_method"] = method
            k = Key(op, client, key(op, n), body, never=recipient == "fail", abandon=abandon)
            k.magic = (method if stripe else recipient) if x < 0.20 else None
            for j in range(refunds):
                r = Key("refund", client, key("refund", f"{n}.{j}"),
                        {"amount": rng.randint(1, amount // 2), "reason": "soak refund"},
                        never=recipient == "refund-fail",
                        abandon=rng.random() < cfg.abandon)
                r.parent = k
                k.refunds.append(r)
            n += refunds
        roots.append(k)
        n += 1
    return roots, customers


# --- the soak -----------------------------------------------------------------

class Soak:
    def __init__(self, cfg, log=print):
        self.cfg = cfg
        self.log = log
        self.run = f"{cfg.seed:x}{int(time.time()) % 100000:05d}"
        self.roots, self.customers = make_plan(cfg, self.run)
        self.faults = collections.Counter()
        self.fault_log = []
        self.fault_times = []      # (began, ended, what), in seconds since the chaos began
        self.api_lock = threading.Lock()   # one fault at a time on the API instances
        self.start_failures = []   # starts that had to be tried again
        self.defects = []          # what the soak saw go wrong, as text
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.prio = collections.deque()   # refunds whose payment succeeded
        self.next_root = 0
        self.busy_payments = 0            # payments with planned refunds in flight
        self.chaos_over = threading.Event()
        self.timing = {}

    # The processes.

    def start(self):
        c = self.cfg
        self.proxy = None
        if c.provider == "stripe":
            # A provider outage is a proxy that holds and cuts connections:
            # the mock keeps its state in memory, as Stripe keeps its.
            self.provider = StripeMock().start()
            self.proxy = DbProxy(target=self.provider.port)
            url = f"http://127.0.0.1:{self.proxy.port}"
            kind = {"IDEM_PROVIDER_KIND": "stripe", "IDEM_PROVIDER_SECRET": STRIPE_SECRET}
        else:
            self.provider = Provider(name="soak-provider",
                                     IDEM_PROVIDER_LATENCY_MS=c.provider_latency_ms,
                                     IDEM_PROVIDER_TIMEOUT_MS=c.provider_timeout_ms).start()
            url = self.provider.url
            kind = {}
        env = {"IDEM_PROVIDER_URL": url, **kind,
               "IDEM_LEASE_SECONDS": c.lease_seconds,
               "IDEM_PROVIDER_TIMEOUT_MS": c.provider_timeout_ms,
               "IDEM_RECOVERY_AFTER_SECONDS": 2,
               "IDEM_RECOVERY_INTERVAL_SECONDS": 1,
               "IDEM_RECOVERY_BACKOFF_SECONDS": 1,
               "IDEM_RECOVERY_BACKOFF_MAX_SECONDS": 5,
               # A kept 500's settle window: short, so that the soak's
               # retries reach the reconciliation within its time.
               "IDEM_PROVIDER_SETTLE_SECONDS": 1}
        self.apis = [Api(name="soak-api-a", **env).start(),
                     Api(name="soak-api-b", **env).start()]
        return self

    def stop(self):
        for k in self.apis + [self.provider]:
            k.stop()

    # Sending.

    def send(self, k, api, phase):
        t0 = time.monotonic()
        try:
            r = post(api.port, PATHS[k.op], k.body_bytes(), key=k.key, client=k.client,
                     timeout=self.cfg.http_timeout)
        except socket.timeout:
            a = Answer(phase, api.name, None, "timeout")
        except (OSError, http.client.HTTPException) as e:
            a = Answer(phase, api.name, None, type(e).__name__)
        else:
            ra = r.headers.get("retry-after")
            a = Answer(phase, api.name, r.status, problem_type(r), r.body, r.replayed,
                       int(ra) if ra and ra.isdigit() else None)
        a.seconds = time.monotonic() - t0
        a.at = t0 - self.t0
        k.answers.append(a)
        return a

    @staticmethod
    def pause(a, attempt):
        if a.retry_after is not None:
            return min(a.retry_after, 3) * (0.5 + random.random() / 2)
        return min(0.1 * 2 ** attempt, 2.0) * (0.5 + random.random())

    def duplicate(self, k, api, barrier, retries):
        try:
            barrier.wait(WAIT_SECONDS)
        except threading.BrokenBarrierError:
            pass
        for attempt in range(retries + 1):
            a = self.send(k, api, "chaos")
            if is_final(a) or self.chaos_over.is_set():
                return
            if attempt < retries:
                time.sleep(self.pause(a, attempt))

    def send_duplicates(self, k, retries):
        """The key's three duplicates at once, on three connections: one to
        each instance and one to either."""
        k.sent = True
        apis = [self.apis[0], self.apis[1], random.choice(self.apis)]
        barrier = threading.Barrier(3)
        threads = [threading.Thread(target=self.duplicate, args=(k, api, barrier, retries))
                   for api in apis]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def take(self, deadline, rate, t0):
        """The next key for a group: a refund whose payment succeeded, or
        the next root once it is due (roots are spread over the phase)."""
        with self.cond:
            while True:
                if time.monotonic() > deadline:
                    return None
                if self.prio:
                    return self.prio.popleft()
                if self.next_root < len(self.roots):
                    due = t0 + self.next_root / rate
                    now = time.monotonic()
                    if now >= due:
                        k = self.roots[self.next_root]
                        self.next_root += 1
                        if k.refunds:
                            self.busy_payments += 1
                        return k
                    self.cond.wait(due - now)
                elif self.busy_payments:
                    self.cond.wait(0.2)
                else:
                    return None

    def release_refunds(self, k):
        """A payment's refunds, once it has its payment_id."""
        a = k.final() if k.refunds else None
        out = []
        if a is not None and a.status == 201:
            pid = json.loads(a.body)["payment_id"]
            for r in k.refunds:
                if not r.sent:
                    if "payment_id" not in r.body:
                        r.body = {"payment_id": pid, **r.body}
                    out.append(r)
        return out

    def group(self, deadline, rate, t0):
        while True:
            k = self.take(deadline, rate, t0)
            if k is None:
                return
            self.send_duplicates(k, 0 if k.abandon else self.cfg.chaos_retries)
            if k.refunds:
                with self.cond:
                    self.prio.extend(self.release_refunds(k))
                    self.busy_payments -= 1
                    self.cond.notify_all()

    # Faults.

    def fault(self, kind, rng):
        api = rng.choice(self.apis)
        if kind in ("worker_kill9", "api_kill9_restart", "api_reload"):
            with self.api_lock:
                self.fault_of(kind, rng, api)
        else:
            self.fault_of(kind, rng, api)

    def fault_of(self, kind, rng, api):
        t0 = time.monotonic()
        what = kind
        if kind == "worker_kill9":
            workers = api.workers()
            if not workers:
                self.defects.append(f"{api.name} had no workers to kill")
                return
            victim = rng.choice(workers)
            os.kill(victim, signal.SIGKILL)
            what = f"{kind} {api.name} pid {victim}"
            if not self.wait(lambda: len(api.workers()) == 2 and victim not in api.workers()
                             and all(alive(p) for p in api.workers()), WAIT_SECONDS):
                self.defects.append(f"{api.name}: worker {victim} killed at "
                                    f"{t0 - self.t0:.1f}s was not replaced within {WAIT_SECONDS} s "
                                    f"(workers {api.workers()})")
        elif kind == "api_kill9_restart":
            api.kill9()
            time.sleep(rng.uniform(0.3, 1.5))
            self.start_again(api)
            what = f"{kind} {api.name}"
        elif kind == "api_reload":
            before = api.read_log().count("reloaded '")
            os.kill(api.proc.pid, signal.SIGHUP)
            what = f"{kind} {api.name}"
            if not self.wait(lambda: api.read_log().count("reloaded '") >= before + 2, ANSWER_BOUND):
                # (a worker reloads once its requests in flight have
                # answered, each within its stated timeout)
                self.defects.append(f"{api.name}: a reload at {t0 - self.t0:.1f}s did not "
                                    f"reach both workers within {ANSWER_BOUND} s")
        elif kind == "provider_down" and self.proxy is not None:
            self.proxy.black_hole()
            time.sleep(rng.uniform(2, 4))
            self.proxy.restore()
        elif kind == "provider_down":
            self.provider.kill9()
            time.sleep(rng.uniform(2, 4))
            self.start_again(self.provider)
        elif kind == "pg_restart":
            cluster("stop")
            time.sleep(rng.uniform(1, 3))
            cluster("start")
        self.faults[kind] += 1
        self.fault_log.append(f"{t0 - self.t0:7.1f}s {what} ({time.monotonic() - t0:.1f}s)")
        self.fault_times.append((t0 - self.t0, time.monotonic() - self.t0, what))

    def start_again(self, k):
        """Starts a server the soak killed, on its port. A start that does
        not answer within 20 s is noted with what holds the port, and
        tried again: the third failure is a defect."""
        for attempt in range(3):
            try:
                k.start()
                return
            except Exception as e:
                held = subprocess.run(["ss", "-tanp", f"( sport = :{k.port} or dport = :{k.port} )"],
                                      capture_output=True, text=True).stdout
                self.start_failures.append(f"{k.name} at {time.monotonic() - self.t0:.1f}s: {e!r}; "
                                           f"port {k.port}: {held.strip()[:600]}")
                if k.proc is not None and k.proc.poll() is None:
                    k.kill9()
        raise RuntimeError(f"{k.name} did not start three times")

    @staticmethod
    def wait(cond, seconds, interval=0.05):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(interval)
        return cond()

    def inject(self, done, kinds, gap, stream):
        """Faults of kinds in a seeded random order until done is set, one
        every gap seconds: every kind once first (shuffled), then any."""
        rng = random.Random(self.cfg.seed * 7 + stream)
        first = list(kinds)
        rng.shuffle(first)
        while not done.is_set():
            done.wait(rng.uniform(*gap))
            if done.is_set() and not first:
                break
            kind = first.pop(0) if first else rng.choice(kinds)
            try:
                self.fault(kind, rng)
            except Exception as e:  # a fault that could not be injected or undone
                self.defects.append(f"fault {kind} failed: {e!r}")
                self.heal()

    def heal(self):
        """Everything up again after a fault that failed half-way."""
        try:
            cluster("start")
        except Exception as e:
            self.defects.append(f"PostgreSQL did not start: {e!r}")
        for k in self.apis + [self.provider]:
            if k.proc is None or k.proc.poll() is not None:
                try:
                    k.start()
                except Exception as e:
                    self.defects.append(f"{k.name} did not start: {e!r}")

    # The phases.

    def chaos(self):
        c = self.cfg
        self.t0 = time.monotonic()
        rate = max(len(self.roots) / c.seconds, 1e-3)
        deadline = self.t0 + 3 * c.seconds
        done = threading.Event()
        injectors = [threading.Thread(target=self.inject, args=(done, kinds, gap, n), daemon=True)
                     for n, (kinds, gap) in enumerate(((OTHER_FAULTS, c.gap),
                                                       (("worker_kill9",), c.kill_gap)))]
        for th in injectors:
            th.start()
        groups = [threading.Thread(target=self.group, args=(deadline, rate, self.t0),
                                   daemon=True) for _ in range(c.groups)]
        for g in groups:
            g.start()
        for g in groups:
            g.join()
        self.chaos_over.set()
        done.set()
        for th in injectors:
            th.join(2 * JOB_BOUND)
            if th.is_alive():
                self.defects.append(f"the last fault did not end within {2 * JOB_BOUND} s")
        self.heal()
        for k in self.apis + [self.provider]:
            if k.proc.poll() is not None:
                self.defects.append(f"{k.name} exited on its own")
        self.timing["chaos"] = time.monotonic() - self.t0
        self.unsent_roots = len(self.roots) - self.next_root

    def sent_keys(self):
        out = []
        for k in self.roots:
            if k.sent:
                out.append(k)
                out.extend(r for r in k.refunds if r.sent)
        return out

    def in_progress(self, keys):
        """The run's keys whose row is in_progress."""
        rows = sql("select client_id, idem_key from idempotency_keys"
                   f" where idem_key like 'soak-{self.run}-%' and status = 'in_progress'")
        mine = {(k.client, k.key) for k in keys}
        return {(c, k) for c, k in rows if (c, k) in mine}

    def finish(self, k, deadline):
        """Retries a key (same key, same body), alternating instances,
        until it has its final answer (a 502 for a key whose provider always
        fails); then once more at the other instance, which must replay."""
        attempt = 0
        while time.monotonic() < deadline:
            api = self.apis[attempt % 2]
            a = self.send(k, api, "settle")
            # A key whose provider always fails ends on a 502, or on a
            # 503 outcome-pending when the provider keeps its 500s (each
            # generation's after its settle window).
            if is_final(a) or (k.never and (a.status, a.kind) in (
                    (502, "provider-unavailable"), (503, "outcome-pending"))):
                if is_final(a):
                    self.send(k, self.apis[(attempt + 1) % 2], "settle")
                return True
            attempt += 1
            time.sleep(self.pause(a, min(attempt, 4)))
        return False

    def pool(self, fn, items, n=16):
        items = list(items)
        lock = threading.Lock()

        def work():
            while True:
                with lock:
                    if not items:
                        return
                    item = items.pop()
                fn(item)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    def settle(self):
        """The recovery job's time, then every key retried to its end."""
        t0 = time.monotonic()
        deadline = t0 + self.cfg.settle_seconds
        keys = self.sent_keys()
        open_keys = [k for k in keys if k.final() is None and not k.never]
        # The recovery job finishes the lease keys nobody retries.
        lease_open = {(k.client, k.key) for k in open_keys if k.op in LEASE_OPS}
        self.wait(lambda: not (self.in_progress(open_keys) & lease_open),
                  min(90, self.cfg.settle_seconds / 3), interval=1)
        left = self.in_progress(open_keys) & lease_open
        self.recovered = len(lease_open) - len(left)
        self.lease_open = len(lease_open)
        self.timing["recovery"] = time.monotonic() - t0

        unsettled = []

        def one(k):
            if not self.finish(k, deadline):
                unsettled.append(k)

        self.pool(one, keys)
        # Refunds whose payment succeeded only now: sent as duplicates too.
        late = [r for k in self.roots if k.sent for r in self.release_refunds(k)]
        self.pool(lambda r: self.send_duplicates(r, 0), late)
        self.pool(one, late)
        self.late_refunds = len(late)
        self.unsettled = unsettled
        self.timing["settle"] = time.monotonic() - t0

    # The books.

    def check(self):
        """Every check as (name, ok, diagnostics)."""
        keys = self.sent_keys()
        run = f"'soak-{self.run}-%'"
        checks = []

        def rows(query):
            return sql(query)

        krows = {(c, k): (op, st, code, h) for c, k, op, st, code, h in rows(
            "select client_id, idem_key, operation, status, coalesce(status_code::text, ''),"
            " coalesce(encode(sha256(convert_to(response, 'UTF8')), 'hex'), '')"
            f" from idempotency_keys where idem_key like {run}")}
        count = collections.Counter()
        ids = collections.defaultdict(list)
        for c, k, i in rows(f"select client_id, idem_key, order_id from orders where idem_key like {run}"):
            count["order", c, k] += 1
            ids["order", c, k].append(i)
        for c, k, t in rows("select client_id, idem_key, coalesce(transfer_id::text, '')"
                            f" from bonus_ledger where idem_key like {run}"):
            count["ledger", c, k] += 1
        for c, k, i in rows("select client_id, idem_key, entry_id from bonus_ledger"
                            f" where idem_key like {run} and order_id is null and transfer_id is null"):
            ids["bonus", c, k].append(i)
        for c, k, i in rows("select client_id, idem_key, transfer_id from bonus_transfers"
                            f" where idem_key like {run}"):
            count["transfer", c, k] += 1
            ids["transfer", c, k].append(i)
        payments = {}
        for c, k, i, ch, amount in rows("select client_id, idem_key, payment_id, charge_id, amount"
                                        f" from payments where idem_key like {run}"):
            count["payment", c, k] += 1
            ids["payment", c, k].append(i)
            payments[ch] = (f"{c}:{k}", amount)
        refunds, refund_status = {}, {}
        for c, k, i, st, pr, amount in rows(
                "select client_id, idem_key, refund_id, status, coalesce(provider_refund_id, ''),"
                f" amount from refunds where idem_key like {run}"):
            count["refund", c, k] += 1
            ids["refund", c, k].append(i)
            refund_status[c, k] = st
            if st == "succeeded":
                refunds[pr] = (f"{c}:{k}", amount)
        if self.cfg.provider == "stripe":
            charges, prefunds = self.stripe_books()
        else:
            mine = (f" where idempotency_key like {'shop-_:soak-' + self.run + '-%'!r}"
                    f" or idempotency_key like {'shop-_~%:soak-' + self.run + '-%'!r}")
            charges = {ch: (derived_base(k), amount) for k, ch, amount in rows(
                "select idempotency_key, charge_id, amount from provider.charges" + mine)}
            prefunds = {r: (derived_base(k), amount) for k, r, amount in rows(
                "select idempotency_key, refund_id, amount from provider.refunds" + mine)}
        charge_count = collections.Counter(k for k, _ in charges.values())
        refund_count = collections.Counter(k for k, _ in prefunds.values())

        doubles, losses, differ, unfinished, bad_rows = [], [], [], [], []
        for k in keys:
            ck = (k.client, k.key)
            acked = [a for a in k.answers if is_final(a)]
            final = acked[0] if acked else None
            if len({(a.status, a.body) for a in acked}) > 1:
                differ.append((k.key, sorted({(a.status, a.body[:120]) for a in acked})))
            row = krows.get(ck)
            if row is None:
                if acked:
                    losses.append((k.key, "acknowledged, no key row"))
                else:
                    unfinished.append((k.key, "no key row", [x.label() for x in k.answers][-3:]))
                continue
            op, st, code, h = row
            if op != OPERATIONS[k.op]:
                bad_rows.append((k.key, op))
            if k.never and final is None:
                if st != "in_progress":
                    bad_rows.append((k.key, "provider always fails, yet", st, code))
            elif st != "done" or final is None:
                unfinished.append((k.key, st, [x.label() for x in k.answers][-3:]))
                continue
            elif (str(final.status), sha(final.body)) != (code, h):
                losses.append((k.key, "the key row holds another answer than the client got",
                               final.status, code))
            created = final is not None and final.status == 201
            body = json.loads(final.body) if created else {}
            pkey = f"{k.client}:{k.key}"

            def expect(what, got, want, id_field=None, table=None):
                if got > want:
                    doubles.append((k.key, what, got))
                elif got < want:
                    losses.append((k.key, what, got, want))
                elif id_field and got and ids[table, k.client, k.key][0] != str(body[id_field]):
                    losses.append((k.key, what, "other id", ids[table, k.client, k.key], body))

            if k.op == "order":
                expect("orders", count["order", k.client, k.key], int(created), "order_id", "order")
                expect("ledger rows", count["ledger", k.client, k.key],
                       int(created and body.get("bonus_points", 0) > 0))
            elif k.op == "bonus":
                expect("ledger rows", count["ledger", k.client, k.key], int(created),
                       "entry_id", "bonus")
            elif k.op == "transfer":
                expect("transfers", count["transfer", k.client, k.key], int(created),
                       "transfer_id", "transfer")
                expect("ledger rows", count["ledger", k.client, k.key], 2 * int(created))
            elif k.op == "payment":
                expect("payments", count["payment", k.client, k.key], int(created),
                       "payment_id", "payment")
                expect("provider charges", charge_count[pkey], int(created))
            else:
                expect("refunds", count["refund", k.client, k.key], 1,
                       "refund_id" if created else None, "refund")
                expect("provider refunds", refund_count[pkey], int(created))
                want = ("succeeded" if created else "pending" if final is None else "rejected")
                if refund_status.get((k.client, k.key)) != want:
                    bad_rows.append((k.key, "refund", refund_status.get((k.client, k.key)), want))

        checks.append(("no double: one order / ledger entry / transfer / payment and charge /"
                       " refund per key, none past it", not doubles, doubles[:10]))
        checks.append(("no loss: every acknowledged answer is in the database (key row and"
                       " business row)", not losses, losses[:10]))
        checks.append(("every acknowledged answer is identical across its duplicates and"
                       " retries", not differ, differ[:5]))
        checks.append(("every key ended: done, or in_progress with nothing made when its"
                       " provider always fails", not unfinished and not bad_rows,
                       (unfinished + bad_rows)[:10]))
        never = {(k.client, k.key) for k in keys if k.never}
        leftover = sorted(self.in_progress(keys) - never)
        checks.append(("no key left in progress (but those whose provider always fails)",
                       not leftover, leftover[:10]))
        mine = {f"{k.client}:{k.key}" for k in keys}
        stray = [c for c, (k, _) in charges.items() if k not in mine]
        checks.append(("payments = the provider's charges (charge, key, amount)",
                       {ch: (k, int(a)) for ch, (k, a) in payments.items()} ==
                       {ch: (k, int(a)) for ch, (k, a) in charges.items()} and not stray,
                       [("payments only", sorted(set(payments) - set(charges))[:5]),
                        ("charges only", sorted(set(charges) - set(payments))[:5])]))
        checks.append(("succeeded refunds = the provider's refunds (refund, key, amount)",
                       {r: (k, int(a)) for r, (k, a) in refunds.items()} ==
                       {r: (k, int(a)) for r, (k, a) in prefunds.items()},
                       [("refunds only", sorted(set(refunds) - set(prefunds))[:5]),
                        ("provider only", sorted(set(prefunds) - set(refunds))[:5])]))
        balances = rows(
            "select a.client_id, a.customer_id, a.balance,"
            " coalesce((select sum(l.points) from bonus_ledger l where l.client_id = a.client_id"
            " and l.customer_id = a.customer_id), 0)"
            f" from bonus_accounts a where a.customer_id like {run}")
        orphans = rows("select distinct client_id, customer_id from bonus_ledger l"
                       f" where customer_id like {run} and not exists (select 1 from"
                       " bonus_accounts a where a.client_id = l.client_id"
                       " and a.customer_id = l.customer_id)")
        wrong = [b for b in balances if b[2] != b[3]]
        checks.append((f"every balance ({len(balances)} accounts) equals the sum of its ledger",
                       not wrong and not orphans and balances, (wrong + orphans)[:10]))
        # The reads agree: every customer's balance, every payment with its refunds.
        bad_reads = []
        balance_of = {(b[0], b[1]): int(b[2]) for b in balances}
        for client, custs in self.customers.items():
            for i, cust in enumerate(custs):
                r = get(self.apis[i % 2].port, f"/v1/bonuses/{cust}", client=client)
                want = {"customer_id": cust, "balance": balance_of.get((client, cust), 0)}
                if r.status != 200 or r.json() != want:
                    bad_reads.append((cust, r.status, r.body[:200], want))
        refunded = collections.Counter()
        for k in keys:
            f = k.final()
            if k.op == "refund" and f is not None and f.status == 201:
                refunded[k.body["payment_id"]] += k.body["amount"]
        for i, k in enumerate(keys):
            f = k.final()
            if k.op != "payment" or f is None or f.status != 201:
                continue
            pid = json.loads(f.body)["payment_id"]
            r = get(self.apis[i % 2].port, f"/v1/payments/{pid}", client=k.client)
            body = r.json() if r.status == 200 else {}
            if (r.status != 200 or body.get("charge_id") != json.loads(f.body)["charge_id"] or
                    body.get("refunded") != refunded[pid] or
                    len(body.get("refunds", [])) != sum(1 for x in k.refunds if x.sent)):
                bad_reads.append((k.key, pid, r.status, r.body[:300], refunded[pid]))
        checks.append(("the reads agree with the books: GET /v1/bonuses/{customer} of every"
                       " customer, GET /v1/payments/{id} of every payment with its refunds",
                       not bad_reads, bad_reads[:5]))
        workers = {api.name: (api.proc.poll() is None, api.workers()) for api in self.apis}
        checks.append(("no worker left dead: each API instance runs its two workers",
                       all(up and len(w) == 2 and all(alive(p) for p in w)
                           for up, w in workers.values()), workers))
        # A pooled connection whose server restarted fails its first query
        # (a retryable 503, docs/operations.md, "Health and outages"): each instance
        # answers /healthz 200 again (WAIT_SECONDS: a bound on a hang), then
        # every time; each answer comes within HEALTH_BOUND, the service's
        # stated bound with a margin.
        health = []
        for api in self.apis:
            health.append(self.wait(lambda: request(api.port, "GET", "/healthz",
                                                    timeout=HEALTH_BOUND).status == 200,
                                    WAIT_SECONDS))
            health.extend(request(api.port, "GET", "/healthz",
                                  timeout=HEALTH_BOUND).status == 200
                          for _ in range(4))
        checks.append(("and they serve (GET /healthz)", all(health), health))
        unexpected = [(k.key, a.phase, a.instance, a.label(), a.body[:200])
                      for k in keys for a in k.answers if not expected_status(a, k.op)]
        checks.append(("no unexpected answer (a 500, a 400, a mismatch, a hang, a 409 on a"
                       " transactional route...)", not unexpected, unexpected[:10]))
        checks.append(("every key retried to its end within the settle time",
                       not self.unsettled,
                       [(k.key, [a.label() for a in k.answers][-5:]) for k in self.unsettled[:10]]))
        checks.append(("every fault injected at least once",
                       all(self.faults[f] for f in FAULTS), dict(self.faults)))
        checks.append(("nothing went wrong in the faults themselves", not self.defects,
                       self.defects + self.start_failures))
        self.counts = {"doubles": len(doubles), "losses": len(losses), "differ": len(differ)}
        return checks

    # The figures.

    def stripe_books(self):
        """The mock's succeeded charges and its refunds of this run, by id:
        (the client's derived key of generation 1, amount). A key of a
        later generation (<client>:<key>:<n>) counts for its key."""
        prefix = f"soak-{self.run}-"

        def base(derived):
            k = derived_base(derived)
            return k if k.partition(":")[2].startswith(prefix) else None

        charges, refunds = {}, {}
        for c in self.provider._all("charges"):
            k = base((c.get("metadata") or {}).get("idempotency_key", ""))
            if k and c.get("status") == "succeeded":
                charges[c["id"]] = (k, c["amount"])
        for r in self.provider._all("refunds"):
            k = base((r.get("metadata") or {}).get("idempotency_key", ""))
            if k and r.get("status") == "succeeded":
                refunds[r["id"]] = (k, r["amount"])
        return charges, refunds

    def figures(self):
        keys = self.sent_keys()
        by_op = collections.Counter(k.op for k in keys)
        answers = collections.Counter()
        phases = collections.Counter()
        for k in keys:
            for a in k.answers:
                answers[a.label() + (" (replay)" if a.replayed else "")] += 1
                phases[a.phase] += 1
        ends = collections.Counter()
        for k in keys:
            f = k.final()
            ends[f.label() if f else ("never (provider always fails)" if k.never else "none")] += 1
        magic = collections.Counter()
        for k in keys:
            if k.op == "payment" and getattr(k, "magic", None):
                magic["payments with " + k.magic.split("|soak")[0]] += 1
            if k.op == "refund" and k.parent.body["recipient"] in ("refund-fail", "refund-slow"):
                magic["refunds of " + k.parent.body["recipient"]] += 1
        times = sorted(a.seconds for k in keys for a in k.answers)
        slow = collections.Counter(a.label() for k in keys for a in k.answers if a.seconds >= 4)

        def pct(p):
            return times[min(len(times) - 1, int(p * len(times)))] if times else 0.0

        def during(a):
            """The faults under way while the request ran, or the last one
            before it."""
            now = [what.split(" pid")[0] for began, ended, what in sorted(self.fault_times)
                   if began <= a.at + a.seconds and ended >= a.at]
            if now:
                return " and ".join(now) + " under way"
            before = [(ended, what) for began, ended, what in self.fault_times if ended < a.at]
            if not before:
                return "before any fault"
            ended, what = max(before)
            return f"{a.at - ended:.1f} s after {what.split(' pid')[0]}"

        slowest = sorted(((a, k) for k in keys for a in k.answers), key=lambda x: -x[0].seconds)[:5]
        acked_chaos = sum(1 for k in keys if any(is_final(a) for a in k.answers
                                                 if a.phase == "chaos"))
        lines = [
            f"seed {self.cfg.seed} (SOAK_SEED), run {self.run}, provider {self.cfg.provider}",
            f"keys: {len(keys)} ({', '.join(f'{op} {by_op[op]}' for op in OPS)});"
            f" {sum(1 for k in keys if k.abandon)} not retried by their client in the chaos;"
            f" {self.unsent_roots} planned but not sent in time",
            f"requests: {phases['chaos']} in the chaos phase (3 concurrent duplicates per key"
            f" and their retries), {phases['settle']} in the settle phase",
            "faults injected: " + ", ".join(f"{f} {self.faults[f]}" for f in FAULTS),
            "provider misbehaving by its test recipient or token: " + ", ".join(f"{m} {n}" for m, n in sorted(magic.items())),
            f"answers by status: " + ", ".join(f"{s}: {n}" for s, n in sorted(answers.items())),
            f"latency: p50 {pct(0.5):.3f} s, p99 {pct(0.99):.3f} s, max {pct(1):.3f} s;"
            f" answers after 4 s or more: {sum(slow.values())}" +
            (" (" + ", ".join(f"{s}: {n}" for s, n in sorted(slow.items())) + ")" if slow else ""),
            "slowest: " + "; ".join(f"{a.seconds:.1f} s {k.op} {a.label()} at {a.at:.0f} s ({k.key}, {a.instance}), {during(a)}"
                                    for a, k in slowest),
            f"keys acknowledged during the chaos: {acked_chaos}; outcomes: " +
            ", ".join(f"{s}: {n}" for s, n in sorted(ends.items())),
            f"lease keys left unfinished by the chaos: {self.lease_open}, finished by the recovery"
            f" job alone: {self.recovered} in {self.timing['recovery']:.1f} s",
            f"refunds sent only after the chaos (their payment succeeded late): {self.late_refunds}",
            f"servers started again after a fault that did not answer within 20 s and were"
            f" tried again: {len(self.start_failures)}" +
            "".join(f"\n  {f}" for f in self.start_failures),
            f"doubles: {self.counts['doubles']}, losses: {self.counts['losses']}, acknowledged"
            f" answers that differ: {self.counts['differ']}",
            f"time: chaos phase {self.timing['chaos']:.1f} s, time to settle"
            f" {self.timing['settle']:.1f} s",
        ]
        return lines


def run(cfg, log=print):
    """Runs the whole soak; returns the Soak with its checks and figures."""
    s = Soak(cfg, log)
    log(f"soak: {cfg.keys} keys, seed {cfg.seed}, {cfg.seconds:.0f} s of faults")
    s.start()
    try:
        s.chaos()
        log(f"chaos phase over after {s.timing['chaos']:.1f} s; settling")
        s.settle()
        s.checks = s.check()
    finally:
        s.stop()
        keep = os.environ.get("SOAK_KEEP_LOGS")
        if keep:
            import shutil
            os.makedirs(keep, exist_ok=True)
            for k in s.apis + [s.provider]:
                shutil.copy(k.logpath, keep)
            shutil.copy(os.path.join(TMP, "pgdata", "server.log"), keep)
    return s


def tap(t, cfg):
    """Runs the soak and reports it to a Tap: its figures as notes, each
    check as a test, and the faults in order when one failed."""
    s = run(cfg, log=t.note)
    for line in s.figures():
        t.note(line)
    for name, ok, diag in s.checks:
        t.ok(ok, name, diag)
    if t.failed:
        t.note("faults, in order:")
        for line in sorted(s.fault_log):
            t.note(line)
    return s
