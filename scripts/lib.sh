# Shared by the scripts behind the make targets; sourced, not run.
# The embedded PostgreSQL cluster lives under the project in .pgdata/.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
APP=$(basename "$ROOT")
EMBEDDED_PGDATA=$ROOT/.pgdata
# Its port; another lets two checkouts (or a test) keep clusters of their own.
EMBEDDED_PGPORT=${IDEM_EMBEDDED_PGPORT:-54329}

export PGOPTIONS="-c client_min_messages=warning"

pg_bin() {
	ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

# Where a cluster made by cluster_start puts its Unix socket: in its data
# directory, unless the socket's path would pass the 107 bytes a sockaddr_un
# holds (a deep checkout); then nowhere, and clients use TCP on loopback.
cluster_socket_dir() {
	local dir=$1 port=$2
	if [ $((${#dir} + ${#port} + 10)) -le 100 ]; then
		echo "$dir"
	fi
}

# A libpq connection string for a cluster made by cluster_start on port $1:
# database $2 (idem), over the Unix socket in data directory $3 (the
# embedded cluster's for its port) when there is one, else over TCP.
cluster_url() {
	local port=$1 db=${2:-idem} dir=${3:-} host=127.0.0.1 sock
	if [ -z "$dir" ] && [ "$port" = "$EMBEDDED_PGPORT" ]; then
		dir=$EMBEDDED_PGDATA
	fi
	if [ -n "$dir" ]; then
		sock=$(cluster_socket_dir "$dir" "$port")
		if [ -n "$sock" ] && [ -S "$sock/.s.PGSQL.$port" ]; then
			host=$sock
		fi
	fi
	echo "host=$host port=$port dbname=$db user=idem" \
	    "sslmode=disable gssencmode=disable connect_timeout=3"
}

# The settings of a production server on this machine (2 cores, 24 GiB of
# RAM, PostgreSQL alone with the API): a buffer cache that holds the
# working set, the planner told about the page cache, checkpoints every 15
# minutes or 4 GB of WAL (so that they do not dominate a benchmark), spread
# over 90% of the interval. Durability stays at the defaults: fsync,
# synchronous_commit and full_page_writes on. IDEM_PG_OPTIONS adds more
# (make bench: pg_stat_statements).
CLUSTER_SETTINGS="-c max_connections=200 -c shared_buffers=1GB \
-c effective_cache_size=16GB -c wal_buffers=16MB -c max_wal_size=4GB \
-c min_wal_size=512MB -c checkpoint_timeout=15min \
-c checkpoint_completion_target=0.9 -c work_mem=8MB \
-c maintenance_work_mem=256MB"

# PostgreSQL refuses to run as root: run its programs as postgres then.
as_postgres() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# Creates the cluster in $1 on the first call, starts it on port $2 (TCP on
# loopback, and a Unix socket in $1: cluster_socket_dir) and creates the
# database idem.
cluster_start() {
	local dir=$1 port=$2 bin
	bin=$(pg_bin)

	if [ ! -f "$dir/PG_VERSION" ]; then
		mkdir -p "$dir"
		# As root, postgres must reach the folder: not so in a clone
		# under /root (mode 700 on Debian), whose initdb fails.
		if [ "$(id -u)" -eq 0 ] && id postgres >/dev/null 2>&1 &&
		    ! runuser -u postgres -- test -x "$(dirname "$dir")"; then
			rmdir "$dir" 2>/dev/null || true
			echo "$dir: the postgres user cannot reach" \
			    "$(dirname "$dir") (PostgreSQL runs as postgres" \
			    "when you are root): clone where postgres can" \
			    "enter every folder (not under /root), or run as" \
			    "another user" >&2
			return 1
		fi
		chmod 700 "$dir"
		[ "$(id -u)" -ne 0 ] || chown postgres:postgres "$dir"
		as_postgres "$bin/initdb" -D "$dir" -U idem --auth=trust \
		    -E UTF8 --locale=C.UTF-8 >/dev/null
	fi

	if ! as_postgres "$bin/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
		as_postgres "$bin/pg_ctl" -D "$dir" -w -t 60 \
		    -l "$dir/server.log" -o "-p $port \
		    -c listen_addresses=127.0.0.1 \
		    -c unix_socket_directories='$(cluster_socket_dir "$dir" "$port")' \
		    $CLUSTER_SETTINGS ${IDEM_PG_OPTIONS:-}" \
		    start >/dev/null
	fi

	if [ -z "$(psql "$(cluster_url "$port" postgres "$dir")" -XAtq -c \
	    "select 1 from pg_database where datname = 'idem'")" ]; then
		psql "$(cluster_url "$port" postgres "$dir")" -Xq -c \
		    "create database idem"
	fi
}

cluster_stop() {
	local dir=$1
	if [ -f "$dir/postmaster.pid" ]; then
		as_postgres "$(pg_bin)/pg_ctl" -D "$dir" -w -m fast stop \
		    >/dev/null || true
	fi
}

# True while a server runs on the cluster in $1 (pg_ctl status: its
# postmaster.pid names a live postmaster).
cluster_running() {
	[ -f "$1/postmaster.pid" ] &&
	    as_postgres "$(pg_bin)/pg_ctl" -D "$1" status >/dev/null 2>&1
}

# Applies the migrations in sql/ not applied yet, each once, recorded in
# the version table (scripts/migrate; --dev: a changed file applied again,
# for the dev targets). Every path that migrates goes through it.
migrate() {
	"$ROOT/scripts/migrate" "$@"
}

# The release this checkout is (src/core/release.h).
release_version() {
	sed -n 's/^#define IDEM_RELEASE[[:space:]]*"\(.*\)"/\1/p' \
	    "$ROOT/src/core/release.h"
}

# Writes src/core/schema_list.c, the migrations of sql/ this build expects
# (src/core/schema.h), when they differ from the file's.
schema_list() {
	local out=$ROOT/src/core/schema_list.c names count text
	names=$(cd "$ROOT/sql" && ls *.sql | sort | paste -sd, -)
	count=$(cd "$ROOT/sql" && ls *.sql | wc -l)
	text="/* Written by scripts/build from sql/: do not edit. */

#include \"schema.h\"

const char	schema_expected[] = \"{$names}\";
const int	schema_expected_count = $count;"
	if [ "$(cat "$out" 2>/dev/null)" != "$text" ]; then
		echo "$text" > "$out"
	fi
}

# Applies SQL files in order and stops at the first that fails, naming it
# (and returning non-zero): a later file may depend on it. Query results
# (the registrations' empty rows) are not printed; errors and notices are.
apply_sql() {
	local url=$1 f
	shift
	for f in "$@"; do
		# One transaction per file: the instances serving meanwhile see
		# it all or none of it (a function dropped and made again).
		if ! psql "$url" -X -q -1 -v ON_ERROR_STOP=1 -o /dev/null -f "$f"; then
			echo "$(basename "$f") failed; the files after it were not applied" >&2
			return 1
		fi
	done
}

# Applies the dev data in dev/ in order, after the migrations: the dev
# clients, the fake provider's schema and the demo strategies' SQL, none
# of which belongs in a production database. Each is safe to apply twice.
load_dev_data() {
	apply_sql "$1" "$ROOT"/dev/*.sql
}

# True when GET url answers 200 within 2 s (make demo and make cluster wait
# for their servers with it).
http_ready() {
	[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1")" = 200 ]
}

# The provider the API calls (IDEM_PROVIDER_KIND, src/lease/provider.c):
# the fake provider, or with stripe the Stripe mock installed by
# scripts/deps (tools/stripe-mock), which takes any sk_test_ secret.
PROVIDER_KIND=${IDEM_PROVIDER_KIND:-fake}
STRIPE_MOCK="$ROOT/tools/stripe-mock/serve.js"
STRIPE_MOCK_SECRET=sk_test_idem_development

# make run and make cluster start the mock themselves: the API is given
# the mock's secret unless one is set. Nothing else is (make api with the
# stripe kind and no secret refuses to start).
stripe_mock_secret() {
	if [ "$PROVIDER_KIND" = stripe ]; then
		export IDEM_PROVIDER_SECRET=${IDEM_PROVIDER_SECRET:-$STRIPE_MOCK_SECRET}
	fi
}

# The provider alone, in the foreground, on IDEM_PROVIDER_PORT; the fake
# one with its configuration file (conf/fake-provider.conf by default).
provider_exec() {
	if [ "$PROVIDER_KIND" = stripe ]; then
		"$ROOT/scripts/deps" stripe-mock >&2
		PORT=${IDEM_PROVIDER_PORT:-8889} LOG_LEVEL=warn exec node "$STRIPE_MOCK"
	fi
	exec kore -fnrc "${1:-conf/fake-provider.conf}"
}

# Whether the provider answers: the fake one's list, the mock's (the
# secret given to curl on its standard input, not in its arguments).
provider_ready() {
	local url="http://127.0.0.1:${1:-${IDEM_PROVIDER_PORT:-8889}}"
	if [ "$PROVIDER_KIND" = stripe ]; then
		[ "$(printf 'user = "%s:"\n' "$STRIPE_MOCK_SECRET" |
		    curl -s -o /dev/null -w '%{http_code}' --max-time 2 -K - \
		    "$url/v1/charges?limit=1")" = 200 ]
		return
	fi
	http_ready "$url/v1/charges?idempotency_key=ready"
}

# Ctrl-C in a terminal signals its whole foreground process group: make as
# well as the script it runs, and make then reports the interrupt ("***
# Interrupt", status 130) whatever the script does. So a script started in
# a terminal's foreground runs itself again as a job of its own (set -m),
# in its own process group, which gets the terminal: a Ctrl-C signals that
# job alone, and make only sees it exit, with the status it chose. Ctrl-Z
# is ignored there (stopping that job would leave make waiting on
# nothing).
#
# The outer script waits for that job in the background, not as bash waits
# for a foreground one (a trap runs only after such a wait): make passes a
# SIGTERM (or a SIGHUP) to the outer script only, which passes it to the
# job's process group, waits until the job has stopped everything it
# started, takes the terminal back and exits with its status. It ignores
# SIGINT itself. Called as: run_alone_in_terminal "$0" "$@".
run_alone_in_terminal() {
	local pgid tpgid child status
	[ -z "${IDEM_ALONE_IN_TERMINAL:-}" ] || { trap '' TSTP; return 0; }
	read -r pgid tpgid < <(ps -o pgid=,tpgid= -p $$) || return 0
	[ "$pgid" = "$tpgid" ] || return 0
	export IDEM_ALONE_IN_TERMINAL=1
	set -m
	"$@" &
	child=$!
	set +m
	trap '' INT
	trap 'kill -TERM -- -$child 2>/dev/null' TERM
	trap 'kill -HUP -- -$child 2>/dev/null' HUP
	give_terminal_to "$child"
	# wait returns early, above 128, when a trapped signal arrives; a
	# second wait on a job that has ended returns its status.
	while :; do
		wait "$child" && status=0 || status=$?
		kill -0 "$child" 2>/dev/null || break
	done
	give_terminal_to "$(ps -o pgid= -p $$)"
	exit "$status"
}

# Makes process group $1 the controlling terminal's foreground group (from
# a background group too: SIGTTOU ignored).
give_terminal_to() {
	python3 -c 'import os, signal, sys
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
fd = os.open("/dev/tty", os.O_RDWR)
os.tcsetpgrp(fd, int(sys.argv[1]))' "$1" 2>/dev/null || true
}

# A database URL as it may be shown (a message, a log): its password, in
# a connection string's password= or a URI's user:password@, masked.
url_shown() {
	sed -E 's/(password[[:space:]]*=[[:space:]]*)('"'"'[^'"'"']*'"'"'|[^ ]*)/\1*****/g;
	    s#(://[^:/@]*:)[^@/]*@#\1*****@#; s/([?&]password=)[^&]*/\1*****/g' <<<"$1"
}
