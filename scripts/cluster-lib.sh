# Shared by make cluster, make cluster-failover and make test-cluster;
# sourced, not run. The production topology on one machine: a
# pg_auto_failover monitor and two PostgreSQL nodes (a primary and a
# synchronous standby), a plain PostgreSQL for the fake provider (a real
# provider does not fail over with us), the fake provider, API instances
# and haproxy in front of them. Everything listens on 127.0.0.1 and lives
# in $CLUSTER_DIR (.cluster/ under the project by default, git-ignored).

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CLUSTER_DIR=${IDEM_CLUSTER_DIR:-$ROOT/.cluster}
# PostgreSQL ports: the monitor, node1, node2, the provider's database.
# Below 32768, where no client's ephemeral port can take them.
CLUSTER_PGPORT=${IDEM_CLUSTER_PGPORT:-15430}
CLUSTER_MONITOR_PORT=$CLUSTER_PGPORT
CLUSTER_PROVIDER_PGPORT=$((CLUSTER_PGPORT + 3))
CLUSTER_NODES="node1 node2"
# API instance i listens on CLUSTER_API_PORT + i; haproxy on IDEM_PORT.
CLUSTER_API_PORT=${IDEM_CLUSTER_API_PORT:-8900}
CLUSTER_INSTANCES=${IDEM_INSTANCES:-2}
CLUSTER_PORT=${IDEM_PORT:-8888}
CLUSTER_PROVIDER_PORT=${IDEM_PROVIDER_PORT:-8889}
# haproxy's HTTPS, with a certificate from IDEM_TLS_CERT or from a local
# CA made at the first start (cluster_tls).
CLUSTER_TLS_PORT=${IDEM_TLS_PORT:-8443}
# The address haproxy's two ports listen on (IDEM_BIND_ADDRESS; loopback
# by default), and the one this script's own checks ask (loopback when
# it listens on every address).
CLUSTER_BIND_ADDRESS=${IDEM_BIND_ADDRESS:-127.0.0.1}
case "$CLUSTER_BIND_ADDRESS" in
0.0.0.0 | "*" | "::" | "[::]") CLUSTER_ASK_ADDRESS=127.0.0.1 ;;
*) CLUSTER_ASK_ADDRESS=$CLUSTER_BIND_ADDRESS ;;
esac
CLUSTER_TLS_DIR=$CLUSTER_DIR/tls

node_port() {
	case "$1" in
	node1) echo $((CLUSTER_PGPORT + 1)) ;;
	node2) echo $((CLUSTER_PGPORT + 2)) ;;
	*) echo "no node $1" >&2; return 1 ;;
	esac
}

# One connection string for every API instance, whichever node is primary:
# libpq tries the hosts in turn and keeps the one that takes writes.
cluster_database_url() {
	echo "host=127.0.0.1,127.0.0.1" \
	    "port=$(node_port node1),$(node_port node2) dbname=idem user=idem" \
	    "target_session_attrs=read-write sslmode=disable" \
	    "gssencmode=disable connect_timeout=2"
}

cluster_provider_database_url() {
	cluster_url "$CLUSTER_PROVIDER_PGPORT" idem "$CLUSTER_DIR/provider-db"
}

# The environment of pg_autoctl: as postgres when run as root (it refuses
# root), with its state (HOME, XDG folders) in the cluster's folder
# rather than in a home directory.
if [ "$(id -u)" -eq 0 ]; then
	AS_PG_USER=(runuser -u postgres --)
	PG_SUPERUSER=postgres
else
	AS_PG_USER=()
	PG_SUPERUSER=$(id -un)
fi

autoctl_env() {
	"${AS_PG_USER[@]}" env "$@"
}

autoctl() {
	autoctl_env HOME="$CLUSTER_DIR/home" \
	    XDG_CONFIG_HOME="$CLUSTER_DIR/home/.config" \
	    XDG_DATA_HOME="$CLUSTER_DIR/home/.local/share" \
	    XDG_RUNTIME_DIR="$CLUSTER_DIR/run" \
	    PATH="$(pg_bin):/usr/bin:/bin" PGCONNECT_TIMEOUT=2 \
	    pg_autoctl "$@"
}

monitor_url() {
	echo "postgres://autoctl_node@127.0.0.1:$CLUSTER_MONITOR_PORT/pg_auto_failover?sslmode=disable"
}

# psql to the monitor's database as postgres (the node state).
monitor_sql() {
	psql "host=127.0.0.1 port=$CLUSTER_MONITOR_PORT dbname=pg_auto_failover user=autoctl_node sslmode=disable" \
	    -XAtq -c "$1"
}

# The state the monitor last saw a node in (primary, secondary, ...).
node_state() {
	monitor_sql "select reportedstate from pgautofailover.node where nodename = '$1'" 2>/dev/null
}

node_goal() {
	monitor_sql "select goalstate from pgautofailover.node where nodename = '$1'" 2>/dev/null
}

cluster_primary() {
	monitor_sql "select nodename from pgautofailover.node where reportedstate = 'primary' and goalstate = 'primary'" 2>/dev/null
}

# Waits up to $3 seconds until node $1 reports state $2 and has it as goal.
wait_node_state() {
	local node=$1 state=$2 i
	for i in $(seq 1 $((${3:-120} * 2))); do
		if [ "$(node_state "$node")" = "$state" ] &&
		    [ "$(node_goal "$node")" = "$state" ]; then
			return 0
		fi
		sleep 0.5
	done
	echo "$node did not reach $state (it is $(node_state "$node")," \
	    "going to $(node_goal "$node"))" >&2
	return 1
}

# Small memory settings on this shared machine; pg_autoctl writes a
# quarter of the RAM into every instance. Appended after its include,
# so that they win.
pg_small_settings() {
	local conf=$1/postgresql.conf
	grep -q "^# idem cluster" "$conf" && return 0
	cat >> "$conf" <<-EOF
	# idem cluster: small instances on one machine
	shared_buffers = 128MB
	effective_cache_size = 256MB
	wal_keep_size = 256MB
	max_connections = 200
	EOF
}

# Connections from loopback for the API's role, besides pg_autoctl's own
# rules.
pg_loopback_hba() {
	local hba=$1/pg_hba.conf
	grep -q "^# idem cluster" "$hba" && return 0
	cat >> "$hba" <<-EOF
	# idem cluster: the API and the migrations, on loopback
	host all all 127.0.0.1/32 trust
	EOF
}

# Starts a pg_autoctl service (the monitor or a node) in a process group
# of its own, whose id is saved in $CLUSTER_DIR/<name>.pgid: killing that
# group kills pg_autoctl and its postmaster together, as a crash of the
# machine would.
autoctl_start() {
	local name=$1
	setsid bash -c 'echo $$ > "$1"; shift; exec "$@"' _ \
	    "$CLUSTER_DIR/$name.pgid" "${AS_PG_USER[@]}" env \
	    HOME="$CLUSTER_DIR/home" \
	    XDG_CONFIG_HOME="$CLUSTER_DIR/home/.config" \
	    XDG_DATA_HOME="$CLUSTER_DIR/home/.local/share" \
	    XDG_RUNTIME_DIR="$CLUSTER_DIR/run" \
	    PATH="$(pg_bin):/usr/bin:/bin" PGCONNECT_TIMEOUT=2 \
	    pg_autoctl run --pgdata "$CLUSTER_DIR/$name" \
	    >> "$CLUSTER_DIR/$name.log" 2>&1 < /dev/null &
}

# kill -9 of a pg_autoctl service as a crash of its machine would: its
# process group (pg_autoctl, the postmaster) and every descendant, since
# PostgreSQL's backends run in sessions of their own (and one that is
# stopped, as a test holds a WAL sender, would never notice the
# postmaster's death and would keep the shared memory). The tree is read
# from /proc without a process per step: it is a few dozen backends.
autoctl_crash() {
	local pgid p queue all kids
	pgid=$(cat "$CLUSTER_DIR/$1.pgid")
	queue=($(ps -o pid= -g "$pgid"))
	all=()
	while [ ${#queue[@]} -gt 0 ]; do
		p=${queue[0]}
		queue=("${queue[@]:1}")
		all+=("$p")
		kids=()
		read -r -a kids < "/proc/$p/task/$p/children" 2>/dev/null || true
		queue+=("${kids[@]}")
	done
	kill -KILL "${all[@]}" 2>/dev/null || true
	rm -f "$CLUSTER_DIR/$1.pgid"
}

# Sends signal $2 to the postmaster of service $1 (the monitor or a node),
# if one runs (its pid is the first line of postmaster.pid).
postmaster_signal() {
	local pid
	pid=$(head -n 1 "$CLUSTER_DIR/$1/postmaster.pid" 2>/dev/null) || return 0
	[ -n "$pid" ] || return 0
	# That pid, if the file is stale, may be another's process now.
	tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null |
	    grep -qF -- "-D $CLUSTER_DIR/$1 " || return 0
	kill "-$2" "$pid" 2>/dev/null || true
}

# True while the process group saved by autoctl_start has a process.
autoctl_running() {
	local pgid
	pgid=$(cat "$CLUSTER_DIR/$1.pgid" 2>/dev/null) || return 1
	[ -n "$pgid" ] && kill -0 -- "-$pgid" 2>/dev/null
}

# The monitor: created on the first run. With IDEM_CLUSTER_FAST_FAILOVER=1
# (the tests), the health checks and timeouts measured here (see docs/production.md) that
# bring an unplanned failover from ~50 s to ~9 s.
monitor_start() {
	local d=$CLUSTER_DIR/monitor
	if [ ! -f "$d/PG_VERSION" ]; then
		autoctl create monitor --pgdata "$d" \
		    --pgport "$CLUSTER_MONITOR_PORT" --hostname 127.0.0.1 \
		    --auth trust --no-ssl >> "$CLUSTER_DIR/monitor.log" 2>&1
		autoctl config set --pgdata "$d" \
		    postgresql.listen_addresses 127.0.0.1 >/dev/null
		pg_small_settings "$d"
		pg_loopback_hba "$d"
	fi
	autoctl_running monitor || autoctl_start monitor
	local i
	for i in $(seq 1 120); do
		monitor_sql "select 1" >/dev/null 2>&1 && break
		sleep 0.5
	done
	monitor_sql "select 1" >/dev/null
	if [ "${IDEM_CLUSTER_FAST_FAILOVER:-0}" = 1 ]; then
		monitor_fast_failover
	fi
}

monitor_fast_failover() {
	local s
	for s in health_check_period=1000 health_check_timeout=1000 \
	    health_check_max_retries=1 health_check_retry_delay=500 \
	    node_considered_unhealthy_timeout=3000 primary_demote_timeout=5000; do
		monitor_admin "alter system set pgautofailover.${s%%=*} = ${s#*=}"
	done
	monitor_admin "select pg_reload_conf()"
}

monitor_admin() {
	psql "host=127.0.0.1 port=$CLUSTER_MONITOR_PORT dbname=pg_auto_failover user=$PG_SUPERUSER sslmode=disable" \
	    -XAtq -v ON_ERROR_STOP=1 -c "$1" >/dev/null
}

# A node: created on the first run (the second one is a base backup of
# the primary, made by pg_autoctl), then run.
node_start() {
	local name=$1 d=$CLUSTER_DIR/$1
	if [ ! -f "$d/PG_VERSION" ]; then
		# What pg_autoctl kept of a node whose data is gone (a lost
		# disk, a create cut short): its state file made the create
		# refuse ("the state file exists and there's no init in
		# progress"), for ever.
		rm -rf "$d" "$CLUSTER_DIR/home/.local/share/pg_autoctl$d" \
		    "$CLUSTER_DIR/home/.config/pg_autoctl$d"
		autoctl create postgres --pgdata "$d" --pgport "$(node_port "$name")" \
		    --hostname 127.0.0.1 --listen 127.0.0.1 --name "$name" \
		    --dbname idem --auth trust --no-ssl \
		    --monitor "$(monitor_url)" >> "$CLUSTER_DIR/$name.log" 2>&1
		pg_small_settings "$d"
		pg_loopback_hba "$d"
		if [ "${IDEM_CLUSTER_FAST_FAILOVER:-0}" = 1 ]; then
			autoctl config set --pgdata "$d" \
			    timeout.network_partition_timeout 3 >/dev/null
		fi
	fi
	autoctl_running "$name" || autoctl_start "$name"
}

# The role and database the API uses, then the migrations and the dev
# data (the dev clients' tokens), through the multi-host URL.
cluster_schema() {
	local url
	url="host=127.0.0.1 port=$(node_port "$(writable_node)") dbname=idem user=$PG_SUPERUSER sslmode=disable"
	psql "$url" -XAtq -v ON_ERROR_STOP=1 <<-'EOF'
	select 'create role idem login'
	 where not exists (select 1 from pg_roles where rolname = 'idem')
	\gexec
	alter database idem owner to idem;
	alter schema public owner to idem;
	EOF
	migrate --dev "$(cluster_database_url)" >/dev/null
	load_dev_data "$(cluster_database_url)" >/dev/null
	migrate --dev "$(cluster_provider_database_url)" >/dev/null
	load_dev_data "$(cluster_provider_database_url)" >/dev/null
}

# A later start, from whatever state the last run left (a switch-over, a
# failover, a node that was down): the node the monitor holds for the
# primary starts first, and the other follows it once it serves. Started
# together, the standby tried to follow a primary that was not up, and
# the start ended with no primary.
cluster_nodes_restart() {
	local first second
	# By the monitor's goal (what it last decided; a reported state is
	# the last one before the stop): the primary, or the node it was
	# promoting when the stop came in the middle of a failover.
	first=$(monitor_sql "select nodename from pgautofailover.node
	    order by (goalstate in ('primary', 'wait_primary', 'single',
	    'stop_replication', 'prepare_promotion', 'report_lsn')) desc,
	    (reportedstate in ('primary', 'wait_primary', 'single')) desc,
	    nodeid limit 1")
	[ -n "$first" ] || first=node1
	if [ "$first" = node1 ]; then second=node2; else second=node1; fi
	echo "starting $first first (the monitor's primary), then $second"
	monitor_sees_down
	node_start "$first"
	wait_serving "$first" ||
	    echo "$first does not serve as the primary yet; starting $second"
	node_start "$second"
}

# Waits until the monitor's own health checks, made since it started, have
# found down each node whose pg_autoctl is not running (120 s at most; with
# pg_auto_failover's defaults it takes about 10 s). Until then its table
# holds what it knew before the stop: a standby stopped a moment before
# the monitor still reads healthy and running there. A primary that starts
# first reports its PostgreSQL not running yet, and the monitor, taking
# the stale standby for a healthy candidate, began a failover to it (a
# node not started): the start then ended with no primary ("make cluster,
# kill -9 of an API parent, make cluster-failover, a stop, make cluster":
# 2 runs of 2). A node found down is no candidate, and the primary keeps
# its role.
monitor_sees_down() {
	local n names="" i
	for n in $CLUSTER_NODES; do
		autoctl_running "$n" || names="$names, '$n'"
	done
	[ -n "$names" ] || return 0
	for i in $(seq 1 240); do
		[ "$(monitor_sql "select count(*) from pgautofailover.node
		    where nodename in (${names#, }) and not (health = 0 and
		    healthchecktime > pg_postmaster_start_time())")" = 0 ] &&
		    return 0
		[ $((i % 20)) -ne 0 ] || echo "waiting for the monitor to see" \
		    "${names#, } down before they start"
		sleep 0.5
	done
	# Not a reason to give up the start: the old order, at worst.
	echo "the monitor did not see ${names#, } down within 120 s;" \
	    "starting them anyway" >&2
}

# A node whose data is gone (its disk lost, or deleted by hand) that the
# monitor still lists: dropped from it, so that the other node serves
# alone (single, promoted if it was the standby: it is synchronous, it
# has every acknowledged commit), and the lost one is made anew as its
# standby. Without the drop, the survivor waited for a peer that would
# never report, and a new node1 could not register under its old name.
drop_lost_nodes() {
	local n
	for n in $CLUSTER_NODES; do
		[ ! -f "$CLUSTER_DIR/$n/PG_VERSION" ] || continue
		[ -n "$(monitor_sql "select 1 from pgautofailover.node
		    where nodename = '$n'")" ] || continue
		echo "$n has no data (lost); dropping it from the monitor," \
		    "it is made anew as the standby"
		! autoctl_running "$n" || autoctl_crash "$n"
		autoctl drop node --monitor "$(monitor_url)" --formation default \
		    --name "$n" --force >> "$CLUSTER_DIR/$n.log" 2>&1 || true
		if [ -n "$(monitor_sql "select 1 from pgautofailover.node
		    where nodename = '$n'")" ]; then
			echo "the monitor still lists $n (see $CLUSTER_DIR/$n.log)" >&2
			return 1
		fi
		rm -rf "${CLUSTER_DIR:?}/$n"
	done
}

# The node whose PostgreSQL takes writes now (as primary, wait_primary or
# single), by asking each; none when neither does.
writable_node() {
	local n
	for n in $CLUSTER_NODES; do
		[ "$(psql "host=127.0.0.1 port=$(node_port "$n") dbname=postgres user=$PG_SUPERUSER sslmode=disable connect_timeout=2" \
		    -XAtc "select not pg_is_in_recovery()" 2>/dev/null)" = t ] &&
		    { echo "$n"; return 0; }
	done
	return 0
}

# Waits (120 s at most) for a node's PostgreSQL to take writes, saying
# what it waits for every 10 s; 1 if it did not.
wait_serving() {
	local i
	for i in $(seq 1 240); do
		[ "$(psql "host=127.0.0.1 port=$(node_port "$1") dbname=postgres user=$PG_SUPERUSER sslmode=disable connect_timeout=2" \
		    -XAtc "select not pg_is_in_recovery()" 2>/dev/null)" = t ] &&
		    return 0
		[ $((i % 20)) -ne 0 ] || echo "waiting for $1 to serve as the" \
		    "primary (the monitor has it $(node_state "$1"))"
		sleep 0.5
	done
	return 1
}

# Starts the monitor and both nodes and waits for a primary and a
# synchronous standby.
cluster_databases_start() {
	mkdir -p "$CLUSTER_DIR/home" "$CLUSTER_DIR/run"
	chmod 755 "$CLUSTER_DIR"
	chmod 700 "$CLUSTER_DIR/run"
	if [ "$(id -u)" -eq 0 ]; then
		# pg_autoctl creates its data folders itself.
		chown postgres:postgres "$CLUSTER_DIR" "$CLUSTER_DIR/home" \
		    "$CLUSTER_DIR/run"
	fi

	monitor_start
	drop_lost_nodes
	if [ -f "$CLUSTER_DIR/node1/PG_VERSION" ] &&
	    [ -f "$CLUSTER_DIR/node2/PG_VERSION" ]; then
		cluster_nodes_restart
	elif [ -f "$CLUSTER_DIR/node1/PG_VERSION" ] ||
	    [ -f "$CLUSTER_DIR/node2/PG_VERSION" ]; then
		# One node was lost (scripts/cluster-node drop, or its data
		# deleted): the other serves, and the lost one is made anew as
		# its standby.
		local first second
		if [ -f "$CLUSTER_DIR/node1/PG_VERSION" ]; then
			first=node1 second=node2
		else
			first=node2 second=node1
		fi
		monitor_sees_down
		node_start "$first"
		wait_serving "$first" ||
		    { echo "$first does not serve as the primary" >&2; return 1; }
		node_start "$second"
	else
		node_start node1
		if [ ! -f "$CLUSTER_DIR/node2/PG_VERSION" ]; then
			wait_node_state node1 single 120
		fi
		node_start node2
	fi
	# Settled: a primary and a secondary, each in the state the monitor
	# wants, each seen up by the monitor's health checks. A start that
	# went on at the first primary met the monitor's next health check,
	# which had not seen the standby up yet: it moved the primary to
	# wait_primary for a moment, and the migrations found no primary.
	local i
	for i in $(seq 1 240); do
		[ "$(monitor_sql "select string_agg(reportedstate::text, ','
		    order by reportedstate::text) from pgautofailover.node
		    where reportedstate = goalstate and health = 1")" = \
		    primary,secondary ] && break
		sleep 0.5
	done
	if [ -z "$(writable_node)" ]; then
		# What the monitor has, and its last decisions: the reason.
		echo "no primary; the monitor's nodes and last events:" >&2
		monitor_sql "select nodename, reportedstate, goalstate, health,
		    replicationquorum, candidatepriority from pgautofailover.node
		    order by nodename" >&2 || true
		monitor_sql "select * from (select eventtime::time(0), nodename,
		    description from pgautofailover.event order by eventid desc
		    limit 12) e order by 1" >&2 || true
		return 1
	fi
	cluster_start "$CLUSTER_DIR/provider-db" "$CLUSTER_PROVIDER_PGPORT"
}

# Stops every pg_autoctl service and the provider's database; the data
# stays. The standby first, then the primary, then the monitor: with the
# primary stopped first, the monitor could begin to promote the standby
# while it was being stopped, and leave the next start half a failover.
cluster_databases_stop() {
	local name pgid i primary order
	# None when the monitor is down already (a make cluster-reset after a
	# stop): set -e must not end the stop there.
	primary=$(monitor_sql "select nodename from pgautofailover.node
	    where goalstate in ('primary', 'wait_primary', 'single') limit 1" \
	    2>/dev/null) || primary=""
	case "$primary" in
	node1) order="node2 node1" ;;
	node2) order="node1 node2" ;;
	*) order=$CLUSTER_NODES ;;
	esac
	for name in $order monitor; do
		autoctl_running "$name" || continue
		pgid=$(cat "$CLUSTER_DIR/$name.pgid")
		kill -TERM -- "-$pgid" 2>/dev/null || true
		# SIGTERM reached the postmaster too, in the group: a smart
		# shutdown, which waits for every client to leave. A client
		# that stays (make cluster-failover's pg_autoctl listening to
		# the monitor for a minute, an operator's psql) held it past the
		# bound below, and the SIGKILL of the group then left the
		# postmaster's children (each in a session of its own), holding
		# its shared memory: no later start of that node could start
		# PostgreSQL. SIGINT is the fast shutdown, clients cut.
		postmaster_signal "$name" INT
		for i in $(seq 1 60); do
			autoctl_running "$name" || break
			sleep 0.5
		done
		# Still there after 30 s: the whole tree, backends included.
		! autoctl_running "$name" || autoctl_crash "$name"
		rm -f "$CLUSTER_DIR/$name.pgid"
	done
	cluster_stop "$CLUSTER_DIR/provider-db"
}

# The PEM haproxy serves on CLUSTER_TLS_PORT: IDEM_TLS_CERT (a certificate,
# its chain and its key in one file) when set; otherwise one made once, at
# the first start, by a local certificate authority of the cluster's own
# (tls/ca.pem is what a client trusts: curl --cacert). The server's
# certificate names 127.0.0.1 and localhost. Prints the PEM's path.
cluster_tls() {
	local d=$CLUSTER_TLS_DIR ext
	if [ -n "${IDEM_TLS_CERT:-}" ]; then
		[ -r "$IDEM_TLS_CERT" ] ||
		    { echo "IDEM_TLS_CERT=$IDEM_TLS_CERT: no such readable file" >&2; return 1; }
		echo "$IDEM_TLS_CERT"
		return 0
	fi
	# Made again, CA and all, when a file is missing or the certificate
	# ends within a day (its CA's key is not kept: clients trust ca.pem).
	if [ ! -s "$d/server.pem" ] || [ ! -s "$d/ca.pem" ] ||
	    ! openssl x509 -in "$d/server.pem" -noout -checkend 86400 >/dev/null 2>&1; then
		rm -rf "$d"
		mkdir -p "$d"
		chmod 700 "$d"
		ext=$(mktemp)
		printf '%s\n' "basicConstraints = critical, CA:FALSE" \
		    "keyUsage = critical, digitalSignature" \
		    "extendedKeyUsage = serverAuth" \
		    "subjectAltName = IP:127.0.0.1, DNS:localhost" > "$ext"
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
		    -nodes -keyout "$d/ca.key" -out "$d/ca.pem" -days 3650 \
		    -subj "/CN=idem cluster local CA" \
		    -addext "basicConstraints = critical, CA:TRUE" \
		    -addext "keyUsage = critical, keyCertSign, cRLSign" \
		    2>/dev/null &&
		openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		    -keyout "$d/server.key" -out "$d/server.csr" \
		    -subj "/CN=127.0.0.1" 2>/dev/null &&
		openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" \
		    -CAkey "$d/ca.key" -CAcreateserial -days 825 \
		    -extfile "$ext" -out "$d/server.crt" 2>"$d/openssl.err" ||
		    { rm -f "$ext"; echo "could not make the local CA in $d:" \
		    "$(cat "$d/openssl.err")" >&2; return 1; }
		rm -f "$ext" "$d/openssl.err" "$d/server.csr" "$d/ca.key" "$d/ca.srl"
		cat "$d/server.crt" "$d/ca.pem" "$d/server.key" > "$d/server.pem.tmp"
		chmod 600 "$d/server.pem.tmp" "$d/server.key"
		mv "$d/server.pem.tmp" "$d/server.pem"
	fi
	echo "$d/server.pem"
}
