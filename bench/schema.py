"""make bench-schema: what each part of the service's schema costs a
fresh order, measured. The one-statement floor (bench/order_floor.sql)
runs under pgbench with one part of the schema taken away (an index, a
foreign key, a table's CHECK constraints), each just after a run of the
floor with everything, in an order shuffled every round; the part's cost is the PostgreSQL CPU
per order it saves, as a median over the rounds, because a part costs
a few per cent and the machine's own drift is as large. The lean schema
(bench/lean_schema.sql: primary keys only) is measured the same way.
Writes bench/results/schema.md. Runs in the throwaway cluster of
scripts/bench; each part is put back before the next is taken."""

import os
import random
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench  # noqa: E402
from bench import DB_URL, pg_cpu, progress, quiesce, sql  # noqa: E402

ROUNDS = int(os.environ.get("BENCH_SCHEMA_ROUNDS", "3"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "5"))
CONNECTIONS = 8
TABLES = ("idempotency_keys", "orders", "bonus_accounts", "bonus_ledger")


def parts():
    """(name, drop, restore) of every index but a primary key, every
    foreign key, and each table's CHECK constraints together."""
    out = []
    tables = ",".join(f"'{t}'::regclass" for t in TABLES)
    for name, table, ddl in sql(
            "select c.relname, i.indrelid::regclass, pg_get_indexdef(i.indexrelid)"
            " from pg_index i join pg_class c on c.oid = i.indexrelid"
            f" where i.indrelid in ({tables}) and not i.indisprimary order by 1"):
        out.append((f"index {name} on {table}", [f"drop index {name}"], [ddl]))
    for name, table, ddl in sql(
            "select conname, conrelid::regclass, pg_get_constraintdef(oid)"
            f" from pg_constraint where conrelid in ({tables}) and contype = 'f'"
            " order by 1"):
        out.append((f"foreign key {name} on {table}",
                    [f"alter table {table} drop constraint {name}"],
                    [f"alter table {table} add constraint {name} {ddl}"]))
    for table in TABLES:
        checks = sql("select conname, pg_get_constraintdef(oid) from pg_constraint"
                     f" where conrelid = '{table}'::regclass and contype = 'c'"
                     " order by 1")
        if checks:
            out.append((f"the {len(checks)} CHECK constraints of {table}",
                        [f"alter table {table} drop constraint {c}" for c, _ in checks],
                        [f"alter table {table} add constraint {c} {d}"
                         for c, d in checks]))
    return out


def run(script):
    """PostgreSQL CPU per transaction of script under pgbench, and tps."""
    quiesce()
    before = pg_cpu()
    out = subprocess.run(
        ["pgbench", "-n", "-M", "prepared", "-c", str(CONNECTIONS), "-j", "2",
         "-T", str(SECONDS), "-f", os.path.join(ROOT, "bench", script), DB_URL],
        check=True, capture_output=True, text=True).stdout
    spent = pg_cpu() - before
    n = int(re.search(r"processed: (\d+)", out).group(1))
    return spent / n * 1e6, float(re.search(r"tps = ([\d.]+)", out).group(1))


def main():
    sql(open(os.path.join(ROOT, "bench", "lean_schema.sql")).read())
    found = parts()
    saved = {name: [] for name, _, _ in found}
    lean, base_all, tps_full, tps_lean = [], [], [], []
    for r in range(ROUNDS):
        progress(f"schema round {r + 1} of {ROUNDS}")
        # Each part is measured beside a run of the full schema of its
        # own, in an order shuffled every round, so that the tables'
        # growth through a round favours no part.
        order = list(found) + [None]
        random.shuffle(order)
        for part in order:
            base, tps = run("order_floor.sql")
            base_all.append(base)
            if part is None:
                sql("select lean.catch_up()")
                us, tps_l = run(bench.lean_floor())
                lean.append(us / base)
                tps_full.append(tps)
                tps_lean.append(tps_l)
                continue
            name, drop, restore = part
            for s in drop:
                sql(s)
            try:
                us, _ = run("order_floor.sql")
            finally:
                for s in restore:
                    sql(s)
            saved[name].append(1 - us / base)
    base = statistics.median(base_all)
    lines = [
        f"PostgreSQL CPU per fresh order of the one-statement floor, {ROUNDS} round{'s' if ROUNDS != 1 else ''} of"
        f" {SECONDS} s at {CONNECTIONS} connections, median {base:,.0f} µs. Each row: the"
        " change of it without the part (median over the rounds, each against a"
        " run of the full schema just before it; the lean tables first brought to"
        " the service's row counts): negative, what the part costs; positive, the"
        " machine's drift. An index put back is built anew, compact.",
        "",
        "| part of the schema | CPU per order without it | min | max |",
        "|---|---:|---:|---:|",
    ]
    for name, _, _ in found:
        v = saved[name]
        lines.append(f"| {name} | {-100 * statistics.median(v):+.1f}% |"
                     f" {-100 * max(v):+.1f}% | {-100 * min(v):+.1f}% |")
    lines += [
        f"| everything but the primary keys (bench/lean_schema.sql) |"
        f" {100 * (statistics.median(lean) - 1):+.1f}% | {100 * (min(lean) - 1):+.1f}% |"
        f" {100 * (max(lean) - 1):+.1f}% |",
        "",
        f"Throughput, medians: the service's schema {statistics.median(tps_full):,.0f}"
        f" orders/s, the lean schema {statistics.median(tps_lean):,.0f}: "
        f"{statistics.median(tps_full) / statistics.median(tps_lean):.2f}.",
    ]
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "schema.md"), "w") as f:
        f.write(text + "\n")
    bench._session and bench._session[0].close()


if __name__ == "__main__":
    main()
