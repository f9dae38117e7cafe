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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
from harness import DB_URL, TMP, Api, post, sql  # noqa: E402

SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
THREADS = 2
UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(port, script, seconds=SECONDS):
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


def pgbench(script, seconds=SECONDS):
    prefix = os.path.join(TMP, f"pgbench-{os.path.basename(script)}")
    for f in glob.glob(prefix + "*"):
        os.unlink(f)
    out = subprocess.run(
        ["pgbench", "-n", "-c", str(CONNECTIONS), "-j", str(THREADS),
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


def main():
    api = Api(name="bench-api").start()
    sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint,"
        " status, status_code, response, finished_at) values ('shop-1', 'bench-lookup',"
        " 'orders.create', repeat('a', 64), 'done', 201, '{\"order_id\":1}', now())"
        " on conflict do nothing")

    wrk(api.port, "orders_fresh.lua", seconds=3)
    results = {
        "api_fresh": wrk(api.port, "orders_fresh.lua"),
        "api_replay": wrk(api.port, "orders_replay.lua"),
        "db_fresh": pgbench("order_create.sql"),
        "db_lookup": pgbench("key_lookup.sql"),
    }
    rss = peak_rss_mib(api)
    api.stop()

    cpu = ""
    with open("/proc/cpuinfo") as f:
        m = re.search(r"model name\s*:\s*(.*)", f.read())
        cpu = m.group(1) if m else platform.processor()

    lines = [
        f"{os.cpu_count()} CPUs ({cpu}), {CONNECTIONS} connections, {SECONDS} s per run,"
        f" API with 2 workers, PostgreSQL 15 on the same machine.",
        "",
        "| run | req/s | p50 ms | p99 ms | ratio to ceiling |",
        "|---|---:|---:|---:|---:|",
        row("ceiling: `order_create()` under pgbench", results["db_fresh"]),
        row("API `POST /v1/orders`, fresh keys (wrk)", results["api_fresh"],
            results["db_fresh"]),
        row("ceiling: single-row key lookup under pgbench", results["db_lookup"]),
        row("API `POST /v1/orders`, replays of one key (wrk)", results["api_replay"],
            results["db_lookup"]),
        "",
        f"API peak resident memory (parent + workers, VmHWM): {rss:.1f} MiB.",
    ]
    for name in ("api_fresh", "api_replay"):
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
