"""make bench: the API under wrk next to the database's own ceiling for the
same work under pgbench, in one run on this machine, at the same
concurrency. Prints a Markdown table for the README."""

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
from harness import DB_URL, TMP, Api, Provider, concurrently, new_key, post, sql  # noqa: E402

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
WARMUP = int(os.environ.get("BENCH_WARMUP_SECONDS", "5"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
THREADS = 2
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def quiesce():
    """Each run starts from a quiet database: the previous run's dead rows
    vacuumed and its dirty pages written, not competing with it."""
    sql("vacuum analyze")
    sql("checkpoint")


def wrk(port, script, seconds=SECONDS, warmup=True):
    quiesce()
    if warmup:
        wrk(port, script, WARMUP, warmup=False)
    out = subprocess.run(
        ["wrk", f"-t{THREADS}", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency",
         "-s", os.path.join(ROOT, "bench", script), f"http://127.0.0.1:{port}"],
        check=True, capture_output=True, text=True).stdout

    def latency(pct):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m.group(1)) * UNITS[m.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    return {"rps": rps, "p50": latency(50), "p99": latency(99),
            "non2xx": int(bad.group(1)) if bad else 0,
            "socket_errors": errors.group(1) if errors else ""}


def pgbench(script, seconds=SECONDS, warmup=True):
    quiesce()
    if warmup:
        pgbench(script, WARMUP, warmup=False)
    prefix = os.path.join(TMP, f"pgbench-{os.path.basename(script)}")
    for f in glob.glob(prefix + "*"):
        os.unlink(f)
    out = subprocess.run(
        ["pgbench", "-n", "-M", "extended", "-c", str(CONNECTIONS), "-j", str(THREADS),
         "-T", str(seconds), "-f", os.path.join(ROOT, "bench", script),
         "-l", f"--log-prefix={prefix}", DB_URL],
        check=True, capture_output=True, text=True).stdout
    tps = float(re.search(r"tps = ([\d.]+) \(without initial", out).group(1))
    lat = []
    for f in glob.glob(prefix + "*"):
        with open(f) as fh:
            lat.extend(int(line.split()[2]) / 1000.0 for line in fh)
    q = statistics.quantiles(lat, n=100)
    return {"rps": tps, "p50": q[49], "p99": q[98]}


def peak_rss_mib(api):
    total = 0
    for pid in [api.proc.pid] + api.workers():
        with open(f"/proc/{pid}/status") as f:
            total += int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1))
    return total / 1024.0


def row(name, r, ceiling=None):
    ratio = f"{r['rps'] / ceiling['rps']:.2f}" if ceiling else ""
    return (f"| {name} | {r['rps']:,.0f} | {r['p50']:.2f} | {r['p99']:.2f} | {ratio} |")


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


def main():
    provider = Provider(name="bench-provider", IDEM_PROVIDER_LATENCY_MS=0).start()
    api = Api(name="bench-api", IDEM_PROVIDER_URL=provider.url).start()
    for key, op in (("bench-lookup", "orders.create"), ("bench-payment", "payments.create")):
        sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
            f" status, status_code, response, finished_at) values ('shop-1', '{key}',"
            f" '{op}', repeat('a', 64), 'done', 201, '{{\"order_id\":1}}', now())"
            " on conflict do nothing")

    post(api.port, "/v1/orders", {"customer_id": "c-replay", "amount": 150000,
                                  "currency": "RUB"}, key="bench-replay-order")
    post(api.port, "/v1/payments", {"amount": 10000, "currency": "RUB",
                                    "recipient": "acc-replay"}, key="bench-replay-payment")
    # Each ceiling runs just before the API on the same work, so that both
    # meet tables of about the same size.
    results = {}
    for ceiling, script, api_run, lua in [
            ("db_fresh", "order_create.sql", "api_fresh", "orders_fresh.lua"),
            ("db_lookup", "key_lookup.sql", "api_replay", "orders_replay.lua"),
            ("db_pay", "payment.sql", "api_pay", "payments_fresh.lua"),
            ("db_pay_replay", "payment_replay.sql", "api_pay_replay",
             "payments_replay.lua")]:
        results[ceiling] = pgbench(script)
        results[api_run] = wrk(api.port, lua)
    rss, pss = peak_rss_mib(api), pss_mib(api)
    api.stop()
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "api.log"), "w") as f:
        f.write(api.read_log())
    provider.stop()
    burst, burst_ok = payment_burst()

    cpu = ""
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        cpu = m.group(1) if m else platform.processor()

    lines = [
        f"{os.cpu_count()} CPUs ({cpu}), {CONNECTIONS} connections, {SECONDS} s per run"
        f" after {WARMUP} s of warm-up,"
        " API with 2 workers (8 database connections each), PostgreSQL 15 with default"
        " settings on the same machine, prod build. Ceilings run the same SQL under"
        " pgbench (extended protocol) at the same concurrency.",
        "",
        "| run | req/s | p50 ms | p99 ms | ratio to ceiling |",
        "|---|---:|---:|---:|---:|",
        row("ceiling: `tx_run()` of orders.create", results["db_fresh"]),
        row("API `POST /v1/orders`, fresh keys", results["api_fresh"], results["db_fresh"]),
        row("ceiling: single-row key lookup", results["db_lookup"]),
        row("API `POST /v1/orders`, replays of one key", results["api_replay"],
            results["db_lookup"]),
        row("ceiling: reserve + provider charge + complete", results["db_pay"]),
        row("API `POST /v1/payments`, fresh keys, provider latency 0", results["api_pay"],
            results["db_pay"]),
        row("ceiling: `lease_reserve()` on a finished key", results["db_pay_replay"]),
        row("API `POST /v1/payments`, replays of one key", results["api_pay_replay"],
            results["db_pay_replay"]),
        "",
        f"200 concurrent payments with distinct keys, provider thinking 300 ms:"
        f" {burst_ok} of 200 created, the last answered after {burst:.2f} s.",
        "",
        f"API resident memory after the runs: peak RSS summed over parent and workers"
        f" (VmHWM, counts shared libraries once per process) {rss:.1f} MiB;"
        f" proportional set size (PSS) {pss:.1f} MiB.",
    ]
    for name in ("api_fresh", "api_replay", "api_pay", "api_pay_replay"):
        r = results[name]
        if r["non2xx"] or r["socket_errors"]:
            lines.append(f"WARNING {name}: {r['non2xx']} non-2xx, socket errors: "
                         f"{r['socket_errors']}")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "latest.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
