"""make bench: the API under wrk next to the database's floor for the same
work under pgbench, in one run on this machine, at the same concurrency,
with the CPU each side spends per request (from /proc). Prints a Markdown
table for docs/benchmark.md and writes it to bench/results/latest.md.

The floor of a fresh order is the same rows written in ONE statement
(bench/order_floor.sql); of a replay, a single-row lookup
(bench/key_lookup.sql); of a payment with provider latency 0, its SQL run
directly (bench/payment.sql). BENCH_SECONDS=2 BENCH_WARMUP_SECONDS=1 is
the short mode for CI."""

import glob
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from harness import (DB_URL, TMP, Api, Provider, PsqlSession, concurrently,  # noqa: E402
                     new_key, post, sql)

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
# Every row measured this many times, one run after the other; the table
# gives each figure's median and the spread of req/s (docs/benchmark.md's
# figures come from BENCH_RUNS=3).
RUNS = int(os.environ.get("BENCH_RUNS", "1"))
WARMUP = int(os.environ.get("BENCH_WARMUP_SECONDS", "5"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
PGDATA = os.environ.get("IDEM_TEST_PGDATA", "")
THREADS = 2
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
TICK = os.sysconf("SC_CLK_TCK")
# Orders sent one by one with pg_stat_statements.track = all, to count the
# statements of one order at every level.
COUNTED_ORDERS = 200
# What pgbench's run gets on top of warm-up and measure, for its connections.
CONNECT_SLACK = 3


# --- CPU from /proc ----------------------------------------------------------

def cpu_seconds(pid, children=True):
    """utime + stime of a process (all its threads), and of its children
    it has reaped (cutime + cstime): a worker Kore restarted, a backend
    that exited. 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    # fields[0] is the state (field 3 of proc(5)): utime is field 14.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def postmaster():
    with open(os.path.join(PGDATA, "postmaster.pid")) as f:
        return int(f.readline())


def pg_cpu():
    """CPU of every process of the cluster: the backends and auxiliary
    processes running now, and the postmaster with those it has reaped."""
    pm = postmaster()
    total = sum(cpu_seconds(p) for p in children(pm))
    return total + cpu_seconds(pm)


def kore_cpu(k):
    return cpu_seconds(k.proc.pid) + sum(cpu_seconds(p) for p in k.workers())


# A run is marked noisy when other processes of the machine (or the
# hypervisor, as steal) took more than this share of its CPUs.
NOISY_SHARE = 0.10


def machine_cpu():
    """CPU the whole machine spent (busy, all CPUs) and the time the
    hypervisor took from it (steal), in seconds, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = v
    return (user + nice + system + irq + softirq) / TICK, steal / TICK


def own_cpu(client=None):
    """This process's CPU, its reaped children's (wrk), and a client still
    running (pgbench)."""
    t = os.times()
    own = t.user + t.system + t.children_user + t.children_system
    return own + (cpu_seconds(client, children=False) if client else 0.0)


class Meter:
    """CPU of PostgreSQL, the API and the provider, and the statements
    pg_stat_statements counted, over one measured run."""

    def __init__(self, api=None, provider=None, client=None):
        self.api, self.provider, self.client = api, provider, client

    def __enter__(self):
        self.calls = statements()
        self.pg = pg_cpu()
        self.kore = kore_cpu(self.api) if self.api else 0.0
        self.prov = kore_cpu(self.provider) if self.provider else 0.0
        self.own = own_cpu(self.client)
        self.busy, self.steal = machine_cpu()
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc):
        busy, steal = machine_cpu()
        elapsed = time.monotonic() - self.started
        self.pg = pg_cpu() - self.pg
        self.kore = (kore_cpu(self.api) - self.kore) if self.api else None
        self.prov = (kore_cpu(self.provider) - self.prov) if self.provider else None
        self.own = own_cpu(self.client) - self.own
        # What the run's own processes did not spend of the machine's
        # busy time, and steal: others' share of the CPUs over the run.
        ours = self.pg + (self.kore or 0.0) + (self.prov or 0.0) + self.own
        self.foreign = max(0.0, (busy - self.busy) - ours + (steal - self.steal)) / \
            (elapsed * os.cpu_count())
        # The query that read the count before is counted in it now.
        self.calls = statements() - self.calls - 1


_session = []


def session_value(query):
    """One value from a psql session kept open: a snapshot that takes a
    millisecond, not a new connection's hundred on a busy machine."""
    if not _session:
        _session.append(PsqlSession())
    return _session[0].run(query + ";")[0]


def statements():
    """Top-level statements executed so far (pg_stat_statements), every
    database of the cluster."""
    return int(session_value("select coalesce(sum(calls), 0) from pg_stat_statements"))


# --- runs --------------------------------------------------------------------

STARTED = time.monotonic()


def progress(what):
    """A line on stderr per run, for CI logs."""
    print(f"bench: {time.monotonic() - STARTED:6.1f} s  {what}", file=sys.stderr, flush=True)


def quiesce():
    """Each run starts from a quiet database: the previous run's dead rows
    vacuumed and its dirty pages written, not competing with it."""
    sql("vacuum analyze")
    sql("checkpoint")


def per_request(r, m, n):
    r["pg_us"] = m.pg / n * 1e6
    r["api_us"] = m.kore / n * 1e6 if m.kore is not None else None
    r["prov_us"] = m.prov / n * 1e6 if m.prov is not None else None
    r["statements"] = m.calls / n
    r["foreign"] = m.foreign
    return r


def wrk(api, script, provider=None, seconds=SECONDS, warmup=True):
    if warmup:
        progress(f"wrk {script}")
    quiesce()
    if warmup:
        wrk(api, script, provider, WARMUP, warmup=False)
    with Meter(api, provider) as m:
        out = subprocess.run(
            ["wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency",
             "-s", os.path.join(ROOT, "bench", script), f"http://127.0.0.1:{api.port}"],
            check=True, capture_output=True, text=True, preexec_fn=client_priority).stdout

    def latency(pct):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m.group(1)) * UNITS[m.group(2)]

    n = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return per_request({"rps": rps, "p50": latency(50), "p99": latency(99), "n": n,
                        "non2xx": int(bad.group(1)) if bad else 0,
                        "socket_errors": errors.group(1) if errors else ""}, m, n)


LEAN_TABLES = ("idempotency_keys", "orders", "bonus_accounts", "bonus_ledger")


def lean_floor():
    """bench/order_floor.sql's statement on the lean schema
    (bench/lean_schema.sql): the same text, its tables in schema lean.
    Written to TMP; its path."""
    with open(os.path.join(ROOT, "bench", "order_floor.sql")) as f:
        text = f.read()
    for table in LEAN_TABLES:
        text = re.sub(rf"\binsert into {table}\b", f"insert into lean.{table}", text)
    path = os.path.join(TMP, "lean_floor.sql")
    with open(path, "w") as f:
        f.write(text)
    return path


def pgbench(script, mode="extended", seconds=SECONDS):
    """pgbench, measured over `seconds` from WARMUP seconds after its
    connections are up, while it runs: like the API's pooled connections,
    the backends measured are warm (a new backend spends milliseconds of
    CPU on its caches and on compiling the PL/pgSQL it calls), and none
    starts or exits in the window. pgbench's -T counts from its start,
    connections included, so it runs CONNECT_SLACK seconds longer. mode:
    prepared (planned once per connection, as the API sends its calls) or
    extended (each statement planned every time)."""
    progress(f"pgbench {script} ({mode})")
    quiesce()
    prefix = os.path.join(TMP, f"pgbench-{mode}-{os.path.basename(script)}")
    for f in glob.glob(prefix + "*"):
        os.unlink(f)
    proc = subprocess.Popen(
        ["pgbench", "-n", "-M", mode, "-c", str(CONNECTIONS), "-j", str(THREADS),
         "-T", str(WARMUP + seconds + CONNECT_SLACK), "-f",
         os.path.join(ROOT, "bench", script), "-l", f"--log-prefix={prefix}", DB_URL],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + CONNECT_SLACK
    while proc.poll() is None and time.monotonic() < deadline and int(session_value(
            "select count(*) from pg_stat_activity"
            " where application_name = 'pgbench'")) < CONNECTIONS:
        time.sleep(0.05)
    time.sleep(WARMUP)
    with Meter(client=proc.pid) as m:
        started = time.time()
        try:
            proc.wait(seconds)
        except subprocess.TimeoutExpired:
            pass
        ended = time.time()
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench {script} failed: {out}{err}")
    # Log lines: client, transaction, latency (us), script, end (s, us).
    lat = []
    for f in glob.glob(prefix + "*"):
        with open(f) as fh:
            for line in fh:
                v = line.split()
                if started <= int(v[4]) + int(v[5]) / 1e6 < ended:
                    lat.append(int(v[2]) / 1000.0)
    n = len(lat)
    if n < 2 or ended - started < seconds * 0.9:
        raise RuntimeError(f"pgbench {script}: {n} transactions in"
                           f" {ended - started:.1f} s measured: {out}{err}")
    q = statistics.quantiles(lat, n=100)
    return per_request({"rps": n / (ended - started), "p50": q[49], "p99": q[98], "n": n},
                       m, n)


# --- statements of one order, at every level ---------------------------------

def counted(run, n):
    """Runs run() with pg_stat_statements.track = all: the statements
    executed per call of run, at every level (PL/pgSQL's own SQL, the
    foreign-key checks), the heaviest first, and their total per call."""
    progress("statements counted")
    sql("alter system set pg_stat_statements.track = 'all'")
    sql("select pg_reload_conf()")
    time.sleep(0.5)
    sql("select pg_stat_statements_reset()")
    run()
    rows = sql("select calls, total_exec_time, toplevel, regexp_replace(query, '\\s+', ' ', 'g')"
               " from pg_stat_statements where query !~* 'pg_stat_statements'"
               " order by total_exec_time desc")
    sql("alter system reset pg_stat_statements.track")
    sql("select pg_reload_conf()")
    time.sleep(0.5)
    total = sum(int(r[0]) for r in rows) / n
    top = sum(int(r[0]) for r in rows if r[2] == "t") / n
    detail = [(int(r[0]) / n, float(r[1]) / int(r[0]), r[2] == "t", r[3])
              for r in rows if int(r[0]) >= n / 2]
    return total, top, detail


def count_api_order(api):
    def run():
        for i in range(COUNTED_ORDERS):
            r = post(api.port, "/v1/orders", {"customer_id": f"c-{i % 1000}",
                                              "amount": 150000, "currency": "RUB"},
                     key=new_key("counted"))
            assert r.status == 201, r
    return counted(run, COUNTED_ORDERS)


def count_sql(script):
    def run():
        subprocess.run(["pgbench", "-n", "-M", "extended", "-c", "1", "-t",
                        str(COUNTED_ORDERS), "-f", os.path.join(ROOT, "bench", script),
                        DB_URL], check=True, capture_output=True)
    return counted(run, COUNTED_ORDERS)


# --- memory ------------------------------------------------------------------

def peak_rss_mib(api):
    total = 0
    for pid in [api.proc.pid] + api.workers():
        with open(f"/proc/{pid}/status") as f:
            total += int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1))
    return total / 1024.0


def pss_mib(api):
    total = 0
    for pid in [api.proc.pid] + api.workers():
        with open(f"/proc/{pid}/smaps_rollup") as f:
            total += int(re.search(r"^Pss:\s+(\d+) kB", f.read(), re.M).group(1))
    return total / 1024.0


def payment_burst(n=200):
    """n payments with distinct keys at once, the provider thinking 300 ms:
    the seconds until the last one answered."""
    provider = Provider(name="bench-provider-300", IDEM_PROVIDER_LATENCY_MS=300).start()
    api = Api(name="bench-api-300", IDEM_PROVIDER_URL=provider.url).start()
    keys = iter([new_key("burst") for _ in range(n)])
    started = time.monotonic()
    answers = concurrently(n, lambda: post(api.port, "/v1/payments", {
        "amount": 100, "currency": "RUB", "recipient": "acc-burst"}, key=next(keys)))
    elapsed = time.monotonic() - started
    api.stop()
    provider.stop()
    return elapsed, sum(1 for r in answers if r.status == 201)


# --- the report --------------------------------------------------------------

def num(v, fmt):
    return "" if v is None else format(v, fmt)


def row(name, r, floor=None):
    ratio = f"{r['rps'] / floor['rps']:.2f}" if floor else ""
    noisy = " **noisy**" if r["foreign"] > NOISY_SHARE else ""
    spread = (f" ({r['rps_min']:,.0f}-{r['rps_max']:,.0f})" if RUNS > 1 else "")
    return (f"| {name} | {r['rps']:,.0f}{spread} | {r['p50']:.2f} | {r['p99']:.2f} | {ratio} "
            f"| {r['pg_us']:,.0f} | {num(r['api_us'], ',.0f')} "
            f"| {r['statements']:.2f} | {100 * r['foreign']:.0f}%{noisy} |")


def target(ok, text):
    return f"- {'met' if ok else '**missed**'}: {text}"


# The API's processes run ahead of PostgreSQL's backends for the CPU (see
# docs/benchmark.md): its event loop serves 32 clients alone, and at
# an equal share of 2 CPUs with 32 runnable backends it waits its turn.
API_NICE = -10
_api_nice = [0]


def client_priority():
    """wrk runs at the API's priority: a client behind the server it
    measures would count its own waits for a CPU as the server's latency
    (replays, where the API alone keeps both CPUs busy, had a p99 of
    20 ms that was wrk waiting its turn)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _api_nice[0])
    except PermissionError:
        pass


def api_priority(api, nice):
    """Sets the API's parent and workers to nice; False when not allowed
    (raising a priority needs root)."""
    for pid in [api.proc.pid] + api.workers():
        try:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
        except PermissionError:
            return False
    _api_nice[0] = nice
    return True


def machine():
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
    cpu = m.group(1) if m else platform.processor()
    with open("/proc/meminfo") as f:
        mem = int(re.search(r"MemTotal:\s+(\d+) kB", f.read()).group(1)) / 1024 / 1024
    with open(os.path.join(ROOT, "kore.conf")) as f:
        conf = f.read()
    workers = re.search(r"^workers\s+(\d+)", conf, re.M).group(1)
    conns = re.search(r"^pgsql_conn_max\s+(\d+)", conf, re.M).group(1)
    names = ("server_version", "shared_buffers", "effective_cache_size", "wal_buffers",
             "max_wal_size", "checkpoint_timeout", "checkpoint_completion_target",
             "work_mem", "fsync", "synchronous_commit", "full_page_writes")
    s = dict(sql("select name, current_setting(name) from pg_settings where name in ("
                 + ",".join(f"'{n}'" for n in names) + ")"))
    s["server_version"] = sql("show server_version")[0][0].split()[0]
    via = ("a Unix socket" if re.search(r"host=/", DB_URL) else "TCP on loopback")
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem:.0f} GiB RAM; {CONNECTIONS} connections,"
        f" {SECONDS} s per run after {WARMUP} s of warm-up, each run from a vacuumed,"
        f" checkpointed database; API prod build with {workers} workers ({conns} database"
        f" connections each), at nice {_api_nice[0]}; PostgreSQL {s['server_version']} on the same machine over"
        f" {via}: shared_buffers {s['shared_buffers']}, effective_cache_size"
        f" {s['effective_cache_size']}, wal_buffers {s['wal_buffers']}, max_wal_size"
        f" {s['max_wal_size']}, checkpoint_timeout {s['checkpoint_timeout']}"
        f" (completion target {s['checkpoint_completion_target']}), work_mem"
        f" {s['work_mem']}; fsync {s['fsync']}, synchronous_commit"
        f" {s['synchronous_commit']}, full_page_writes {s['full_page_writes']}."
        " Floors and ceilings run under pgbench at the same concurrency, measured"
        " from a warm-up on the same connections, as prepared statements (as the"
        " API sends its calls). CPU is utime + stime from /proc over the measured run: every"
        " process of the cluster (backends, and those reaped, through the postmaster),"
        " the API's parent and workers; per request completed.")


def measure(api, provider):
    """One run of every row."""
    R = {}
    # Each floor runs just before the API on the same work, so that both
    # meet tables of about the same size.
    sql("select lean.catch_up()")
    R["floor_lean"] = pgbench(lean_floor(), "prepared")
    R["floor_fresh"] = pgbench("order_floor.sql", "prepared")
    R["floor_fresh_ext"] = pgbench("order_floor.sql")
    R["db_fresh"] = pgbench("order_create.sql", "prepared")
    api_priority(api, 0)
    R["api_fresh_nice0"] = wrk(api, "orders_fresh.lua")
    api_priority(api, API_NICE)
    R["api_fresh"] = wrk(api, "orders_fresh.lua")
    R["db_lookup"] = pgbench("key_lookup.sql", "prepared")
    R["api_replay"] = wrk(api, "orders_replay.lua")
    R["db_pay"] = pgbench("payment.sql", "prepared")
    R["api_pay"] = wrk(api, "payments_fresh.lua", provider)
    R["db_pay_replay"] = pgbench("payment_replay.sql", "prepared")
    R["api_pay_replay"] = wrk(api, "payments_replay.lua")
    R["api_bare"] = wrk(api, "unauthorized.lua")
    return R


def combine(runs):
    """Each row over the runs: the median of every figure, the spread of
    req/s (min, max), every socket error, the wrong answers summed, and
    the largest share of others' CPU."""
    R = {}
    for name in runs[0]:
        rs = [r[name] for r in runs]
        c = {}
        for field, v in rs[0].items():
            if field == "socket_errors":
                c[field] = "; ".join(r[field] for r in rs if r[field])
            elif field in ("non2xx", "n"):
                c[field] = sum(r[field] for r in rs)
            elif field == "foreign":
                c[field] = max(r[field] for r in rs)
            elif v is None:
                c[field] = None
            else:
                c[field] = statistics.median(r[field] for r in rs)
        c["rps_min"] = min(r["rps"] for r in rs)
        c["rps_max"] = max(r["rps"] for r in rs)
        R[name] = c
    return R


def main():
    provider = Provider(name="bench-provider", IDEM_PROVIDER_LATENCY_MS=0).start()
    api = Api(name="bench-api", IDEM_PROVIDER_URL=provider.url).start()
    for key, op in (("bench-lookup", "orders.create"), ("bench-payment", "payments.create")):
        sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
            f" status, status_code, response, finished_at) values ('shop-1', '{key}',"
            f" '{op}', repeat('a', 64), 'done', 201, '{{\"order_id\":1}}', now())"
            " on conflict do nothing")
    sql(open(os.path.join(ROOT, "bench", "lean_schema.sql")).read())

    post(api.port, "/v1/orders", {"customer_id": "c-replay", "amount": 150000,
                                  "currency": "RUB"}, key="bench-replay-order")
    post(api.port, "/v1/payments", {"amount": 10000, "currency": "RUB",
                                    "recipient": "acc-replay"}, key="bench-replay-payment")
    runs = []
    for i in range(RUNS):
        if RUNS > 1:
            progress(f"run {i + 1} of {RUNS}")
        runs.append(measure(api, provider))
    R = combine(runs)

    api_all, api_top, api_detail = count_api_order(api)
    floor_all, _, _ = count_sql("order_floor.sql")
    tx_all, _, _ = count_sql("order_create.sql")

    rss, pss = peak_rss_mib(api), pss_mib(api)
    api.stop()
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "api.log"), "w") as f:
        f.write(api.read_log())
    provider.stop()
    _session[0].close()
    progress("payment burst")
    burst, burst_ok = payment_burst()
    progress("done")

    fresh, floor, lean = R["api_fresh"], R["floor_fresh"], R["floor_lean"]
    replay, lookup = R["api_replay"], R["db_lookup"]
    pay, pay_sql = R["api_pay"], R["db_pay"]
    lines = [
        machine(),
        "",
        "| run | req/s" + (f", median of {RUNS} (spread)" if RUNS > 1 else "") +
        " | p50 ms | p99 ms | ratio to floor | PostgreSQL CPU µs/req"
        " | API CPU µs/req | statements/req | others' CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        row("lean floor: the same rows and statement in a schema of primary keys only"
            " (`bench/lean_schema.sql`), prepared", R["floor_lean"]),
        row("floor: the rows of a fresh order in one statement, prepared", floor,
            R["floor_lean"]),
        row("informative: the same statement, extended protocol (planned every time)",
            R["floor_fresh_ext"], floor),
        row("informative: `tx_execute()` of orders.create under pgbench, prepared as the"
            " API sends it", R["db_fresh"], floor),
        row("informative: API `POST /v1/orders`, fresh keys, API at the default"
            " priority (nice 0)", R["api_fresh_nice0"], floor),
        row("API `POST /v1/orders`, fresh keys", fresh, floor),
        row("floor: single-row key lookup, prepared", lookup),
        row("API `POST /v1/orders`, replays of one key", replay, lookup),
        row("ceiling: reserve + provider charge + complete", pay_sql),
        row("API `POST /v1/payments`, fresh keys, provider latency 0", pay, pay_sql),
        row("ceiling: `lease_reserve_v2()` on a finished key", R["db_pay_replay"]),
        row("API `POST /v1/payments`, replays of one key", R["api_pay_replay"],
            R["db_pay_replay"]),
        row("API bare handler: `POST /v1/orders` without a token (401, no database)",
            R["api_bare"]),
        "",
        "statements/req: top-level statements per request or transaction"
        " (pg_stat_statements calls over the run, the API's background jobs included)."
        " others' CPU: the share of the machine's CPUs that other processes and the"
        " hypervisor (steal) took during the run, from /proc/stat less the run's own"
        f" processes (the cluster, the API, the provider, wrk or pgbench, this script);"
        f" above {100 * NOISY_SHARE:.0f}% the run is marked noisy and its figures are"
        " not a quiet machine's."
        f" The fake provider spent {pay['prov_us']:,.0f} µs of CPU per fresh payment.",
        "",
        f"Statements per fresh order at every level (pg_stat_statements.track = all,"
        f" {COUNTED_ORDERS} orders one by one): API {api_all:.1f} ({api_top:.1f}"
        f" top-level), `tx_execute()` under pgbench {tx_all:.1f}, one-statement floor"
        f" {floor_all:.1f}. The API's, most time first:",
        "",
        "| calls/order | mean ms | level | statement |",
        "|---:|---:|---|---|",
    ]
    for calls, mean, top, query in api_detail[:12]:
        q = query if len(query) <= 90 else query[:87] + "..."
        lines.append(f"| {calls:.2f} | {mean:.3f} | {'top' if top else 'nested'}"
                     f" | `{q.replace('|', '/')}` |")
    lines += [
        "",
        f"200 concurrent payments with distinct keys, provider thinking 300 ms:"
        f" {burst_ok} of 200 created, the last answered after {burst:.2f} s.",
        "",
        f"API resident memory after the runs: peak RSS summed over parent and workers"
        f" (VmHWM, counts shared libraries once per process) {rss:.1f} MiB;"
        f" proportional set size (PSS) {pss:.1f} MiB.",
        "",
        "Targets:",
        target(fresh["rps"] >= 0.8 * floor["rps"],
               f"fresh orders at least 0.8 of the one-statement floor:"
               f" {fresh['rps'] / floor['rps']:.2f}"),
        target(fresh["p99"] <= 2 * floor["p99"],
               f"fresh orders' p99 at most 2x the floor's: {fresh['p99']:.2f} ms,"
               f" {fresh['p99'] / floor['p99']:.2f}x"),
        target(fresh["pg_us"] <= 1.3 * floor["pg_us"],
               f"PostgreSQL CPU per fresh order at most 1.3x the floor's:"
               f" {fresh['pg_us']:,.0f} µs, {fresh['pg_us'] / floor['pg_us']:.2f}x"),
        target(fresh["api_us"] <= 40,
               f"API CPU per fresh order at most 40 µs: {fresh['api_us']:,.0f} µs"),
        target(floor["rps"] >= 0.8 * lean["rps"],
               f"the service's schema floor at least 0.8 of the lean schema's:"
               f" {floor['rps'] / lean['rps']:.2f}"),
        target(replay["rps"] >= 0.9 * lookup["rps"],
               f"order replays at least 0.9 of the key lookup:"
               f" {replay['rps'] / lookup['rps']:.2f}, {replay['rps']:,.0f} req/s"),
        target(pay["rps"] >= 0.6 * pay_sql["rps"],
               f"payments (provider latency 0) at least 0.6 of their SQL ceiling:"
               f" {pay['rps'] / pay_sql['rps']:.2f}"),
        target(R["api_pay_replay"]["p99"] < 10,
               f"payment replays' p99 under 10 ms:"
               f" {R['api_pay_replay']['p99']:.2f} ms"),
        target(not any(R[n]["socket_errors"] for n in
                       ("api_fresh_nice0", "api_fresh", "api_replay", "api_pay",
                        "api_pay_replay", "api_bare")),
               "no socket error or timeout in any API run: " +
               (", ".join(f"{n} {R[n]['socket_errors']}" for n in
                          ("api_fresh_nice0", "api_fresh", "api_replay", "api_pay",
                           "api_pay_replay", "api_bare") if R[n]["socket_errors"]) or "none")),
        target(rss <= 48, f"API RSS at most 48 MiB: {rss:.1f} MiB"),
        target(all(r["foreign"] <= NOISY_SHARE for r in R.values()),
               f"a quiet machine: others took at most {100 * NOISY_SHARE:.0f}% of the"
               f" CPUs in every run (the most: {100 * max(r['foreign'] for r in R.values()):.0f}%)"),
    ]
    for name in ("api_fresh_nice0", "api_fresh", "api_replay", "api_pay",
                 "api_pay_replay"):
        r = R[name]
        if r["non2xx"] or r["socket_errors"]:
            lines.append(f"WARNING {name}: {r['non2xx']} non-2xx, socket errors: "
                         f"{r['socket_errors']}")
    bare = R["api_bare"]
    if bare["non2xx"] != bare["n"] or bare["socket_errors"]:
        lines.append(f"WARNING api_bare: {bare['n'] - bare['non2xx']} answers other than"
                     f" the 401, socket errors: {bare['socket_errors']}")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(ROOT, "bench", "results", "latest.md"), "w") as f:
        f.write(text + "\n")
    # A figure of wrong answers is no figure: an API run that got any
    # answer but its 2xx (the bare run: any but its 401) fails the bench.
    wrong = [n for n in ("api_fresh_nice0", "api_fresh", "api_replay", "api_pay",
                         "api_pay_replay")
             if R[n]["non2xx"]] + (["api_bare"] if bare["non2xx"] != bare["n"] else [])
    if wrong:
        sys.exit(f"make bench: wrong answers in {', '.join(wrong)}")


if __name__ == "__main__":
    main()
