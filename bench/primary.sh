#!/usr/bin/env bash
# What one primary takes: each operation's SQL, as the API runs it for a
# fresh key, under pgbench against IDEM_DATABASE_URL (with make cluster
# running: its primary, whose commits wait for the synchronous standby).
# Prints a Markdown table of writes per second. For docs/production.md's "Past
# one primary". Usage: IDEM_DATABASE_URL=... bench/primary.sh [seconds]
# [clients]
set -eu
cd "$(dirname "$0")"
seconds=${1:-10}
clients=${2:-16}
url=${IDEM_DATABASE_URL:?IDEM_DATABASE_URL: the primary (a multi-host URL works)}

# Transfers move points from funded customers c-0..c-999 to c-1000..c-1999.
psql "$url" -Xq -v ON_ERROR_STOP=1 -c "insert into bonus_accounts
    (client_id, customer_id, balance) select 'shop-1', 'c-' || i, 1000000000
    from generate_series(0, 999) i on conflict (client_id, customer_id)
    do update set balance = greatest(bonus_accounts.balance, 1000000000)"
psql "$url" -Xq -v ON_ERROR_STOP=1 -c "insert into bonus_ledger (client_id,
    customer_id, points, reason, idem_key) select 'shop-1', 'c-' || i,
    1000000000 - coalesce((select sum(points) from bonus_ledger l where
    l.client_id = 'shop-1' and l.customer_id = 'c-' || i), 0), 'bench funding',
    'bench-funding-' || i from generate_series(0, 999) i where 1000000000 -
    coalesce((select sum(points) from bonus_ledger l where l.client_id =
    'shop-1' and l.customer_id = 'c-' || i), 0) <> 0"

echo "| operation (SQL of one request, fresh key) | writes/s | p50 ms | p99 ms |"
echo "|---|---:|---:|---:|"
for op in "POST /v1/orders:order_create.sql" \
    "POST /v1/bonuses:bonus_apply.sql" \
    "POST /v1/bonuses/transfers:bonus_transfer.sql" \
    "POST /v1/payments (reserve, charge, complete):payment.sql"; do
	name=${op%%:*}
	file=${op#*:}
	log=$(mktemp /tmp/idem-primary.XXXXXX)
	out=$(pgbench -n -M extended -c "$clients" -j 2 -T "$seconds" -r \
	    -l --log-prefix="$log" -f "$file" "$url" 2>&1)
	tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
	lat=$(cat "$log"* | awk '{print $3 / 1000}' | sort -n | awk '
	    { v[NR] = $1 } END { printf "%.1f | %.1f", v[int(NR * 0.5)],
	    v[int(NR * 0.99)] }')
	rm -f "$log"*
	printf '| %s | %.0f | %s |\n' "$name" "$tps" "$lat"
done
