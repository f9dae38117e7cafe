/*
 * The service's PostgreSQL connections on Kore's event loop, with libpq's
 * asynchronous API only: PQconnectStartParams()/PQconnectPoll() to make a
 * connection, PQsendPrepare() and PQsendQueryPrepared(), PQflush(),
 * PQconsumeInput(), PQisBusy() and PQgetResult() when it cannot wait.
 * No call here blocks a worker: no PQconnectdb(), PQreset(), PQcancel()
 * or waiting PQgetResult().
 *
 * A connection is in one of these states:
 *
 *	CLOSED		no PGconn; db_tick() makes it (while the pool's last
 *			attempt failed, one connection at a time, at most
 *			every DB_RETRY_MS).
 *	CONNECTING	PQconnectPoll() under way, until its deadline.
 *	IDLE		on the pool's idle list, its socket watched for
 *			reading: a server that closes it (a restart, a
 *			failover) is noticed at once and it is made again.
 *	BUSY		a call's statement in flight (conn->call).
 *	DRAINING	its call went away before the answer was in (the
 *			client left, a reload of the request): the answer is
 *			read to ReadyForQuery and dropped, then IDLE; closed
 *			if it has not come within the call's own bound.
 *
 * A call waits in its pool's queue, oldest first, until a connection is
 * handed to it: a connection that comes free (a call done, a connection
 * made) goes straight to the head of the queue, never back to a list that
 * the waiter must look at again, so no wake-up is lost. A call gives up at
 * its deadline, wherever it is: queued, it leaves the queue; sent, its
 * connection is closed under the statement a grace later (the server's
 * own statement_timeout and lock_timeout normally end it first).
 *
 * A call is done only when PostgreSQL has sent ReadyForQuery, that is when
 * the implicit transaction of the statement has committed: a row read
 * before that could still be rolled back, and a response built on it would
 * promise what the database does not hold.
 *
 * Kore reads a batch of events before it runs their handlers: a connection
 * closed by one handler may still have an event further down the batch.
 * A closed connection ignores events, and connections are only made again
 * from db_tick(), a timer, which Kore runs after the batch.
 */

#include <sys/types.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <netinet/in.h>
#include <arpa/inet.h>

#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "db.h"
#include "metrics.h"
#include "reload.h"
#include "settings.h"

#define CONN_CLOSED		0
#define CONN_CONNECTING		1
#define CONN_IDLE		2
#define CONN_BUSY		3
#define CONN_DRAINING		4

#define DB_PHASE_INIT		0
#define DB_PHASE_QUEUED		1	/* waiting for, or handed, a conn */
#define DB_PHASE_WAIT		2	/* sent, its answer being read */
#define DB_PHASE_ANSWERED	3	/* answer in, or the call given up */
#define DB_PHASE_DONE		4
#define DB_PHASE_FAILED		5

/* Between two attempts to connect while the database refuses. */
#define DB_RETRY_MS		250

/* A connection attempt's bound when the URL gives no connect_timeout. */
#define DB_CONNECT_TIMEOUT_MS	5000

/* The same failure is logged at most this often per pool. */
#define DB_LOG_INTERVAL_MS	10000

/* application_name of the connections, unless IDEM_DATABASE_URL names one. */
#define DB_APPLICATION_API	"idem-api"
#define DB_APPLICATION_PROVIDER	"idem-fake-provider"

/* Distinct statements prepared on each connection (a bit each). */
#define DB_STATEMENTS_MAX	64

/* Hosts of a multi-host URL, addresses per host name, and both. */
#define DB_HOSTS_MAX		8
#define DB_ADDRS_MAX		4
#define DB_TARGETS_MAX		16

/* Host names are resolved again at most this often. */
#define DB_RESOLVE_MS		1000

/*
 * A resolution still in flight after this long is forgotten and the names
 * asked again: the C library bounds its own (resolv.conf's timeout x
 * attempts per name server and query), far below this, so only a
 * resolution that will never report (its thread gone) gets here.
 */
#define DB_RESOLVE_STUCK_MS	(10 * 60 * 1000)

/* The dev build's tests shorten it (a resolution held past the bound). */
#define DB_RESOLVE_STUCK_ENV	"IDEM_TEST_RESOLVE_GIVE_UP_MS"

/* What a reload keeps: a tagged Kore allocation (as metrics.c's). */
#define DB_ANCHOR_TAG		0x69646462

/* libpq's message of an attempt's failure, kept while it walks on. */
#define DB_WALK_MSG_MAX		256

/* The pools' cause while no host name of the URL has an address. */
#define DB_WHY_UNRESOLVED	"unreachable (host name not resolved)"

/*
 * TCP keepalives and tcp_user_timeout on every connection, each unless the
 * URL sets its own: an idle connection to a host that vanished without a
 * reset is found dead within 5 + 3 x 1 = 8 s, and a connection whose
 * sent data goes unacknowledged for 8 s is closed by the kernel.
 */
static const struct {
	const char	*keyword;
	const char	*value;
} db_keepalives[] = {
	{ "keepalives",		"1" },
	{ "keepalives_idle",	"5" },
	{ "keepalives_interval", "1" },
	{ "keepalives_count",	"3" },
	{ "tcp_user_timeout",	"8000" },
};

#define DB_KEEPALIVES_N		(sizeof(db_keepalives) / sizeof(db_keepalives[0]))

#define CAUSE_NONE		0
#define CAUSE_UNREACHABLE	DB_ERROR_UNAVAILABLE
#define CAUSE_MISCONFIGURED	DB_ERROR_MISCONFIGURED

struct db_conn {
	/* First: Kore's epoll hands this struct back as the event's data. */
	struct kore_event	evt;
	struct db_pool		*pool;
	PGconn			*pg;
	int			state;
	int			events;
	int			flushing;
	int			doomed;
	int			errored;
	int			preparing;
	int			ran_prepared;
	u_int64_t		prepared;
	u_int32_t		prepared_epoch;
	u_int64_t		retry_at;
	struct db_call		*call;
	u_int64_t		deadline;

	/* The target it tries, and how many it tried in this attempt. */
	u_int32_t		target;
	u_int32_t		walked;

	/* The attempt's most telling failure so far (conn_connect_failed()). */
	int			walk_cause;
	char			walk_why[DB_CAUSE_MAX];
	char			walk_msg[DB_WALK_MSG_MAX];
	int			fresh;
	TAILQ_ENTRY(db_conn)	list;
};

/* A host of the URL: name (or socket, or address), address, port. */
struct db_host {
	char			*host;
	char			*hostaddr;
	char			*port;
	int			named;
	char			addrs[DB_ADDRS_MAX][INET6_ADDRSTRLEN];
	u_int32_t		naddrs;
};

/* What one connection attempt connects to: a host and one address. */
struct db_target {
	struct db_host		*host;
	const char		*addr;
};

/*
 * A resolution in flight (getaddrinfo_a()): the C library's threads write
 * into it until each request is done, so it is the C library's memory,
 * never freed while a request may still be written, and it outlives a
 * reload (db_anchor).
 */
struct db_resolve {
	u_int32_t		n;
	u_int64_t		started;
	struct addrinfo		hints;
	struct sigevent		sev;
	char			*names[DB_HOSTS_MAX];
	struct gaicb		cb[DB_HOSTS_MAX];
	struct gaicb		*list[DB_HOSTS_MAX];
};

/*
 * What a reload of the module keeps (its statics are gone, Kore's memory
 * stays): the resolution in flight, and the addresses each host name had
 * at its last successful resolution, so that a reload during a DNS outage
 * does not forget them. Checked against the build's layout (size) and
 * the process (a worker's own, never inherited).
 */
struct db_anchor {
	u_int32_t		size;
	u_int32_t		resolve_size;
	pid_t			pid;
	struct db_resolve	*resolving;
	struct {
		char		*name;
		u_int32_t	naddrs;
		char		addrs[DB_ADDRS_MAX][INET6_ADDRSTRLEN];
	} hosts[DB_HOSTS_MAX];
};

TAILQ_HEAD(db_conn_list, db_conn);
TAILQ_HEAD(db_call_list, db_call);

struct db_pool {
	const char		*name;
	u_int16_t		size;
	struct db_conn		*conns;
	struct db_conn_list	idle;
	struct db_call_list	waiting;

	/* The last attempt to connect failed: why, and when to try again. */
	int			failing;
	int			cause;
	char			why[DB_CAUSE_MAX];
	u_int64_t		retry_at;
	u_int64_t		logged_at;
};

static void	conn_start(struct db_conn *);
static void	conn_ready(void *, int);
static void	conn_connect_poll(struct db_conn *);
static void	conn_connect_failed(struct db_conn *, const char *);
static void	conn_watch(struct db_conn *, int);
static void	conn_give(struct db_conn *);
static void	conn_close(struct db_conn *);
static int	conn_alive(struct db_conn *);
static void	conn_read(struct db_conn *);
static void	conn_done(struct db_conn *);
static int	statement_id(const char *);
static int	call_send_query(struct db_call *, struct db_conn *,
		    const char *, int, const char **);
static void	conn_lost(struct db_conn *, const char *);
static void	conn_lost_unsent(struct db_conn *);
static void	conn_notice(void *, const PGresult *);
static int	pool_open_count(struct db_pool *);
static void	pool_fail_waiters(struct db_pool *);
static void	pool_log(struct db_pool *, const char *, const char *);
static void	db_tick(void *, u_int64_t);
static void	call_queue(struct db_call *, int);
static void	call_send(struct db_call *, const char *, int, const char **);
static void	call_unsent(struct db_call *, int, const char *);
static void	call_answer(struct db_call *, int);
static void	call_wake(struct db_call *);
static void	call_sleep(struct db_call *);
static int	call_settle(struct db_call *);
static int	call_fail(struct db_call *);
static int	call_has(struct db_call *, int);
static void	call_message(struct db_call *, const char *);
static int	call_classify(const char *, const PGresult *);
static int	result_stale(const PGresult *);
static int	conn_read_only(struct db_conn *);
static int	cause_classify(const char *, char *, size_t);
static void	dsn_build(const char *);
static u_int32_t	list_count(const char *);
static u_int32_t	hosts_check(const char *, const char *, const char *);
static char	*list_item(const char *, u_int32_t);
static char	*dup_n(const char *, size_t);
static void	hosts_parse(const char *, const char *, const char *);
static void	hosts_free(void);
static void	targets_build(void);
static char	*target_dsn(u_int32_t);
static void	anchor_attach(void);
static void	resolve_start(void);
static void	resolve_poll(void);
static int	resolve_abandon(struct db_resolve *);
static void	resolve_free(struct db_resolve *);
static void	dsn_append(struct kore_buf *, const char *, const char *);
static void	options_append(struct kore_buf *, const char *);

static struct db_pool		pools[DB_POOLS];
static struct kore_timer	*ticker = NULL;
static char			*dsn_base = NULL;
static struct db_host		hosts[DB_HOSTS_MAX];
static u_int32_t		nhosts = 0;
static u_int32_t		names = 0;
static struct db_target		targets[DB_TARGETS_MAX];
static u_int32_t		ntargets = 0;
static u_int32_t		target_good = 0;
static struct db_anchor		*anchor = NULL;
static u_int64_t		resolve_at = 0;
static u_int64_t		resolve_stuck_ms = DB_RESOLVE_STUCK_MS;
static u_int32_t		connect_timeout_ms = DB_CONNECT_TIMEOUT_MS;
static char			*statements[DB_STATEMENTS_MAX];
static int			nstatements = 0;
static u_int32_t		statements_epoch = 0;

static const char	*pool_names[DB_POOLS] = {
	[DB_POOL_REQUESTS] = "requests",
	[DB_POOL_HEALTH] = "health",
	[DB_POOL_AUTH] = "auth",
	[DB_POOL_JOBS] = "jobs",
};

/*
 * Reads IDEM_DATABASE_URL into the connection strings every connection of
 * this worker uses. Called when the module is loaded, before any pool is
 * opened.
 */
void
db_register(void)
{
	if (dsn_base == NULL)
		dsn_build(settings.database_url);

	/* Only a worker resolves: the parent's threads do not fork. */
	if (worker != NULL && anchor == NULL)
		anchor_attach();
}

/*
 * Opens a pool of n connections: made from here on, without waiting, and
 * served to calls as they come in. Opening a pool again does nothing.
 */
void
db_pool_open(int id, u_int16_t n)
{
	struct db_pool		*pool = &pools[id];
	u_int16_t		i;

	if (pool->size != 0 || n == 0)
		return;

	db_register();

	pool->name = pool_names[id];
	pool->size = n;
	pool->conns = kore_calloc(n, sizeof(*pool->conns));
	TAILQ_INIT(&pool->idle);
	TAILQ_INIT(&pool->waiting);

	/* Names are resolved off the loop; until then, nothing to start. */
	if (names > 0)
		resolve_start();

	for (i = 0; i < n; i++) {
		pool->conns[i].pool = pool;
		pool->conns[i].evt.type = KORE_TYPE_PGSQL_CONN;
		pool->conns[i].evt.handle = conn_ready;
		pool->conns[i].fresh = 1;
		if (ntargets > 0)
			conn_start(&pool->conns[i]);
	}

	if (ticker == NULL)
		ticker = kore_timer_add(db_tick, DB_TICK_MS, NULL, 0);
}

/*
 * Before the module is unloaded (a reload) or the worker stops: every
 * connection closed, every pool forgotten. A reload runs once the worker
 * holds no work (reload.c), so no call is in flight; a connection still
 * draining an abandoned call is closed, and the server ends its statement
 * (client_connection_check_interval).
 */
void
db_unload(void)
{
	struct db_pool		*pool;
	int			id;
	u_int16_t		i;

	if (ticker != NULL) {
		kore_timer_remove(ticker);
		ticker = NULL;
	}

	for (id = 0; id < DB_POOLS; id++) {
		pool = &pools[id];
		for (i = 0; i < pool->size; i++)
			conn_close(&pool->conns[i]);
		kore_free(pool->conns);
		memset(pool, 0, sizeof(*pool));
	}

	/*
	 * A resolution still in flight stays in the anchor, in the C
	 * library's hands: the reloaded image polls it (anchor_attach()).
	 */
	anchor = NULL;
	resolve_at = 0;
	hosts_free();

	for (id = 0; id < nstatements; id++) {
		kore_free(statements[id]);
		statements[id] = NULL;
	}
	nstatements = 0;
}

/*
 * Why the pool cannot serve: CAUSE_NONE (0) while its last connection
 * attempt succeeded, otherwise DB_ERROR_UNAVAILABLE or
 * DB_ERROR_MISCONFIGURED and, in why, the cause in a few words.
 */
int
db_pool_cause(int id, char *why, size_t len)
{
	struct db_pool		*pool = &pools[id];

	if (!pool->failing)
		return (CAUSE_NONE);

	(void)kore_strlcpy(why, pool->why, len);

	return (pool->cause);
}

void
db_call_init(struct db_call *c, struct http_request *req)
{
	db_call_init_pool(c, req, DB_POOL_REQUESTS, settings.db_timeout_ms);
}

/*
 * A call from another pool, with its own bound: /healthz (at most a second
 * whatever the pool does, never behind requests that wait for a lock), the
 * token lookups (never competing with paying clients for connections).
 */
void
db_call_init_pool(struct db_call *c, struct http_request *req, int pool,
    u_int32_t timeout_ms)
{
	memset(c, 0, sizeof(*c));
	c->req = req;
	c->pool = pool;
	c->timeout_ms = timeout_ms;
	if (pool == DB_POOL_HEALTH && c->timeout_ms > DB_HEALTH_TIMEOUT_MS)
		c->timeout_ms = DB_HEALTH_TIMEOUT_MS;
}

/*
 * A call of a background job, which polls db_call_step() from its timer.
 */
void
db_call_init_job(struct db_call *c)
{
	db_call_init_pool(c, NULL, DB_POOL_JOBS, settings.db_timeout_ms);
}

/*
 * The call is over for its owner, whatever its phase: a statement still in
 * flight has its answer read and dropped in the background (DRAINING), a
 * connection handed to it and not used goes to the next waiter.
 */
void
db_call_cleanup(struct db_call *c)
{
	struct db_pool		*pool = &pools[c->pool];
	struct db_conn		*conn;

	if (c->phase == DB_PHASE_QUEUED && c->conn == NULL)
		TAILQ_REMOVE(&pool->waiting, c, queue);

	if ((conn = c->conn) != NULL) {
		c->conn = NULL;
		conn->call = NULL;
		if (c->phase == DB_PHASE_WAIT) {
			conn->state = CONN_DRAINING;
			conn->deadline = c->deadline + DB_GRACE_MS;
		} else {
			conn_give(conn);
		}
	}

	if (c->result != NULL)
		PQclear(c->result);
	if (c->failed != NULL)
		PQclear(c->failed);
	kore_free(c->message);

	c->result = NULL;
	c->failed = NULL;
	c->message = NULL;
	c->phase = DB_PHASE_INIT;
}

/*
 * The call goes on under another owner, at dst, whatever its phase: the
 * statement in flight, the connection handed to it, its place in the
 * pool's queue and its answer are dst's from now on, and src is an
 * unused call. Nobody is woken for it any more: its new owner polls
 * db_call_step() (a lease flow whose client left, lease_handoff.c).
 */
void
db_call_move(struct db_call *dst, struct db_call *src)
{
	struct db_pool		*pool = &pools[src->pool];

	*dst = *src;
	dst->req = NULL;

	if (src->phase == DB_PHASE_QUEUED && src->conn == NULL) {
		TAILQ_INSERT_AFTER(&pool->waiting, src, dst, queue);
		TAILQ_REMOVE(&pool->waiting, src, queue);
	}

	if (dst->conn != NULL && dst->conn->call == src)
		dst->conn->call = dst;

	memset(src, 0, sizeof(*src));
	src->pool = dst->pool;
	src->phase = DB_PHASE_INIT;
}

/*
 * Runs the call one step on: DB_CALL_PENDING while it waits (a request is
 * put to sleep and woken when there is news), then DB_CALL_DONE with its
 * result, or DB_CALL_FAILED with c->error.
 */
int
db_call_step(struct db_call *c, const char *query, int nparams,
    const char **values)
{
	struct db_pool		*pool = &pools[c->pool];

	if (nparams > DB_PARAMS_MAX)
		fatal("%s: %d parameters", __func__, nparams);

	for (;;) {
		switch (c->phase) {
		case DB_PHASE_INIT:
			if (pool->size == 0)
				fatal("%s: pool %d is not open", __func__,
				    c->pool);
			c->deadline = kore_time_ms() + c->timeout_ms;

			/*
			 * No connection, and the last attempt failed: a refusal
			 * no retry changes is said at once; otherwise the next
			 * attempt is made on the next tick rather than after
			 * DB_RETRY_MS, and the call waits for it (a refused
			 * attempt fails it at once, a made one serves it).
			 */
			if (pool->failing && pool_open_count(pool) == 0) {
				/* Or no address: its name did not resolve. */
				if (pool->cause == CAUSE_MISCONFIGURED ||
				    ntargets == 0) {
					c->refused = 1;
					c->error = pool->cause;
					call_message(c, pool->why);
					return (call_fail(c));
				}
				pool->retry_at = 0;
			}

			call_queue(c, 0);
			break;
		case DB_PHASE_QUEUED:
			if (c->conn == NULL) {
				call_sleep(c);
				return (DB_CALL_PENDING);
			}
			/* Sent, queued again, or answered: looked at again. */
			call_send(c, query, nparams, values);
			break;
		case DB_PHASE_WAIT:
			call_sleep(c);
			return (DB_CALL_PENDING);
		case DB_PHASE_ANSWERED:
			return (call_settle(c));
		case DB_PHASE_DONE:
			return (DB_CALL_DONE);
		case DB_PHASE_FAILED:
			return (DB_CALL_FAILED);
		default:
			fatal("%s: unknown phase %d", __func__, c->phase);
		}
	}
}

/*
 * The call takes an idle connection, or waits for one in the pool's queue
 * (at its head when it had one already and lost it).
 */
static void
call_queue(struct db_call *c, int head)
{
	struct db_pool		*pool = &pools[c->pool];
	struct db_conn		*conn;

	c->phase = DB_PHASE_QUEUED;

	if ((conn = TAILQ_FIRST(&pool->idle)) != NULL) {
		TAILQ_REMOVE(&pool->idle, conn, list);
		conn->state = CONN_BUSY;
		conn->call = c;
		c->conn = conn;
		return;
	}

	if (head)
		TAILQ_INSERT_HEAD(&pool->waiting, c, queue);
	else
		TAILQ_INSERT_TAIL(&pool->waiting, c, queue);
}

/*
 * Sends the statement on the connection handed to the call. A connection
 * found dead before anything was sent (its server restarted while it was
 * idle, and the news arrived in this same turn of the loop) is closed and
 * the call goes back to the head of the queue for another: the first
 * writes after a restart do not fail for a connection that was already
 * gone.
 */
static void
call_send(struct db_call *c, const char *query, int nparams,
    const char **values)
{
	struct db_conn		*conn = c->conn;
	u_int64_t		now;

	/*
	 * Handed a connection just as its wait ran out (before db_tick()
	 * saw it): nothing is sent, so that no statement runs for a client
	 * that was, or is about to be, told 503.
	 */
	now = kore_time_ms();
	if (now >= c->deadline) {
		c->timed_out = 1;
		call_unsent(c, DB_ERROR_TIMEOUT,
		    "no database connection came free in time");
		return;
	}

	/*
	 * Its client left in the same turn of the event loop that handed it
	 * the connection: Kore frees the request only after this turn, so it
	 * would run a statement for nobody. The connection goes on to the
	 * next waiting call.
	 */
	if (c->req != NULL && !c->for_nobody && (c->req->owner == NULL ||
	    c->req->owner->state == CONN_STATE_DISCONNECTING)) {
		c->client_gone = 1;
		call_unsent(c, DB_ERROR_UNAVAILABLE,
		    "the client left before the statement was sent");
		return;
	}

	if (conn_alive(conn) && !call_send_query(c, conn, query, nparams,
	    values) && PQstatus(conn->pg) == CONNECTION_OK) {
		/* Refused before anything was sent: a bug here. */
		call_unsent(c, DB_ERROR_QUERY, PQerrorMessage(conn->pg));
		return;
	}

	if (PQstatus(conn->pg) != CONNECTION_OK || !PQisBusy(conn->pg)) {
		conn_lost_unsent(conn);
		return;
	}

	/*
	 * The answer is awaited as long as the server's own statement_timeout
	 * and lock_timeout let the statement run, from its first send (a
	 * statement's preparation included), and a grace: the connection is
	 * closed under a statement only when the server did not end it
	 * itself (a commit waiting for a standby, a hung server). A health
	 * check keeps the one bound it started with: a second in all.
	 */
	if (!c->sent && c->pool != DB_POOL_HEALTH)
		c->deadline = now + c->timeout_ms;
	c->sent = 1;
	c->phase = DB_PHASE_WAIT;
	switch (PQflush(conn->pg)) {
	case 0:
		conn_watch(conn, EPOLLIN);
		break;
	case 1:
		conn->flushing = 1;
		conn_watch(conn, EPOLLIN | EPOLLOUT);
		break;
	default:
		conn_read(conn);
		break;
	}
}

/*
 * The call ends without sending anything; the connection it was handed
 * goes on to the next waiting call.
 */
static void
call_unsent(struct db_call *c, int error, const char *why)
{
	struct db_conn		*conn = c->conn;

	call_message(c, why);
	c->conn = NULL;
	c->error = error;
	call_answer(c, DB_PHASE_ANSWERED);
	conn_give(conn);
}

/*
 * Each of the service's statements is prepared once per connection, by
 * name, the first time the connection runs it (one round trip more, then
 * none): PostgreSQL then neither parses nor plans the call again. A
 * statement past the registry's room is sent unprepared.
 */
static int
call_send_query(struct db_call *c, struct db_conn *conn, const char *query,
    int nparams, const char **values)
{
	char		name[32];
	int		id;

	conn->errored = 0;
	conn->preparing = -1;
	conn->ran_prepared = 0;

	if ((id = statement_id(query)) < 0) {
		return (PQsendQueryParams(conn->pg, query, nparams, NULL,
		    values, NULL, NULL, 0));
	}

	/* Statements of an older epoch are stale (see conn_done()). */
	if (conn->prepared_epoch != statements_epoch) {
		conn->prepared = 0;
		conn->prepared_epoch = statements_epoch;
	}

	(void)snprintf(name, sizeof(name), "idem_%u_%d", statements_epoch, id);
	if (conn->prepared & ((u_int64_t)1 << id)) {
		conn->ran_prepared = 1;
		return (PQsendQueryPrepared(conn->pg, name, nparams, values,
		    NULL, NULL, 0));
	}

	if (!PQsendPrepare(conn->pg, name, query, nparams, NULL))
		return (0);
	conn->preparing = id;

	return (1);
}

/*
 * The registry of statements: an id for each distinct text, the same in
 * every connection of the worker (its prepared name is idem_<id>).
 */
static int
statement_id(const char *query)
{
	int		i;

	for (i = 0; i < nstatements; i++) {
		if (!strcmp(statements[i], query))
			return (i);
	}

	if (nstatements == DB_STATEMENTS_MAX)
		return (-1);

	statements[nstatements] = kore_strdup(query);

	return (nstatements++);
}

/*
 * The answer is in (or the call was given up): the call's owner is woken
 * to settle it.
 */
static void
call_answer(struct db_call *c, int phase)
{
	c->phase = phase;
	call_wake(c);
}

static void
call_wake(struct db_call *c)
{
	if (c->req != NULL)
		http_request_wakeup(c->req);
}

static void
call_sleep(struct db_call *c)
{
	if (c->req != NULL)
		http_request_sleep(c->req);
}

/*
 * The answer read: done with its row, or failed with its class.
 */
static int
call_settle(struct db_call *c)
{
	const char	*detail;

	if (c->failed != NULL || c->error != 0) {
		if (c->failed != NULL) {
			detail = PQresultErrorField(c->failed,
			    PG_DIAG_MESSAGE_DETAIL);
			if (detail != NULL && !strcmp(detail, DB_KEY_TAKEN))
				c->key_taken = 1;
		}
		return (call_fail(c));
	}

	if (c->unconfirmed) {
		c->error = DB_ERROR_UNCONFIRMED;
		return (call_fail(c));
	}

	/* No answer to the call: what happened to it is not known. */
	if (c->result == NULL) {
		c->error = DB_ERROR_UNAVAILABLE;
		return (call_fail(c));
	}

	c->phase = DB_PHASE_DONE;

	return (DB_CALL_DONE);
}

/*
 * A failed call: its class (see db.h) from the SQLSTATE, unless the call
 * already knows it (a deadline, a lost connection, an unconfirmed
 * commit), and the server's own words in the log.
 */
static int
call_fail(struct db_call *c)
{
	const char	*state, *msg;
	size_t		len;

	state = NULL;
	if (c->failed != NULL) {
		state = PQresultErrorField(c->failed, PG_DIAG_SQLSTATE);
		if (c->message == NULL)
			call_message(c, PQresultErrorMessage(c->failed));
	}

	if (state != NULL)
		(void)kore_strlcpy(c->sqlstate, state, sizeof(c->sqlstate));

	if (c->error == 0)
		c->error = call_classify(state, c->failed);

	msg = c->message;
	if (msg == NULL || *msg == '\0')
		msg = "the connection was lost, libpq gave no reason";
	len = strlen(msg);
	while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
		len--;

	/*
	 * A duplicate that found its key committed by a concurrent first
	 * attempt is rolled back as expected, and its caller replays: not a
	 * database error. A call failed because its pool cannot connect is
	 * counted but not logged: the pool says why once per
	 * DB_LOG_INTERVAL_MS (pool_log()).
	 */
	if (!c->key_taken && !c->client_gone && !c->refused) {
		kore_log(c->error == DB_ERROR_MISCONFIGURED ? LOG_ERR :
		    LOG_NOTICE, "database call failed (%s): %.*s",
		    c->timed_out ? "timeout" : state != NULL ? state :
		    c->error == DB_ERROR_UNCONFIRMED ? "unconfirmed" :
		    "no sqlstate", (int)len, msg);
	}
	if (!c->key_taken && !c->client_gone)
		metrics_db_error();

	if (c->result != NULL) {
		PQclear(c->result);
		c->result = NULL;
	}

	c->phase = DB_PHASE_FAILED;

	return (DB_CALL_FAILED);
}

/*
 * A column of the call's first row. A call that returned no row (a key
 * deleted between two statements) or fewer columns reads as "", so that
 * no answer of the database can make a worker read past its result; the
 * caller checks db_call_rows() where no row is a possible answer.
 */
const char *
db_call_value(struct db_call *c, int col)
{
	if (!call_has(c, col))
		return ("");

	return (PQgetvalue(c->result, 0, col));
}

int
db_call_length(struct db_call *c, int col)
{
	if (!call_has(c, col))
		return (0);

	return (PQgetlength(c->result, 0, col));
}

/*
 * Waiting for a connection, its statement not sent yet: a later caller
 * may still take its answer as its own (/healthz's shared checks).
 */
int
db_call_boardable(struct db_call *c)
{
	return (c->phase == DB_PHASE_QUEUED && !c->sent);
}

/*
 * Its answer in (or the call given up), not yet settled: db_call_step()
 * settles it without sleeping or sending anything.
 */
int
db_call_answered(struct db_call *c)
{
	return (c->phase == DB_PHASE_ANSWERED);
}

int
db_call_null(struct db_call *c, int col)
{
	return (!call_has(c, col) || PQgetisnull(c->result, 0, col));
}

/*
 * A column of the first row by its name: the SQL functions' result
 * columns are read by name, never by position.
 */
const char *
db_call_field(struct db_call *c, const char *name)
{
	return (db_call_value(c, c->result != NULL ?
	    PQfnumber(c->result, name) : -1));
}

int
db_call_field_length(struct db_call *c, const char *name)
{
	return (db_call_length(c, c->result != NULL ?
	    PQfnumber(c->result, name) : -1));
}

int
db_call_rows(struct db_call *c)
{
	return (c->result == NULL ? 0 : PQntuples(c->result));
}

/*
 * The cause of a DB_ERROR_MISCONFIGURED call, in a few words.
 */
const char *
db_call_cause(struct db_call *c)
{
	if (c->error != DB_ERROR_MISCONFIGURED)
		return (NULL);

	if (c->sqlstate[0] != '\0')
		return ("schema not migrated");

	return (c->message != NULL ? c->message : "unknown");
}

static int
call_has(struct db_call *c, int col)
{
	if (c->result != NULL && PQntuples(c->result) > 0 && col >= 0 &&
	    col < PQnfields(c->result))
		return (1);

	kore_log(LOG_ERR, "database call: no column %d in its result (%d rows)",
	    col, c->result != NULL ? PQntuples(c->result) : 0);

	return (0);
}

static void
call_message(struct db_call *c, const char *msg)
{
	kore_free(c->message);
	c->message = kore_strdup(msg != NULL ? msg : "");
}

/*
 * Which failures are worth a retry: no SQLSTATE (a lost connection), the
 * connection, resource and shutdown classes, a statement or lock wait
 * cancelled by the session's timeouts, a serialization failure or deadlock
 * (the transaction was rolled back), and a write that reached a node that
 * is no longer the primary. A function or table that is not there is a
 * schema never migrated: no retry helps.
 */
static int
call_classify(const char *state, const PGresult *res)
{
	if (state == NULL || !strncmp(state, "08", 2) ||
	    !strncmp(state, "57P", 3) || !strncmp(state, "53", 2))
		return (DB_ERROR_UNAVAILABLE);

	if (!strcmp(state, "57014") || !strcmp(state, "55P03") ||
	    !strcmp(state, "25P03"))
		return (DB_ERROR_TIMEOUT);

	if (!strcmp(state, "40001") || !strcmp(state, "40P01"))
		return (DB_ERROR_CONFLICT);

	if (!strcmp(state, "25006"))
		return (DB_ERROR_READ_ONLY);

	/* A prepared statement stale twice over: nothing ran. */
	if (res != NULL && result_stale(res))
		return (DB_ERROR_UNAVAILABLE);

	if (!strcmp(state, "42883") || !strcmp(state, "42P01") ||
	    !strcmp(state, "3F000"))
		return (DB_ERROR_MISCONFIGURED);

	return (DB_ERROR_QUERY);
}

/*
 * A prepared statement the server no longer runs as prepared: its plan
 * would change its result type (the plan cache's 0A000, told from any
 * other "feature not supported" by the function that raised it, which no
 * lc_messages translates), or it is gone (26000).
 */
static int
result_stale(const PGresult *res)
{
	const char	*state, *func;

	if ((state = PQresultErrorField(res, PG_DIAG_SQLSTATE)) == NULL)
		return (0);

	if (!strcmp(state, "26000"))
		return (1);

	func = PQresultErrorField(res, PG_DIAG_SOURCE_FUNCTION);

	return (!strcmp(state, "0A000") && func != NULL &&
	    !strcmp(func, "RevalidateCachedQuery"));
}

/*
 * The session does not take writes: a hot standby, or a node whose
 * default is read-only (both reported by the server, PostgreSQL 14+).
 */
static int
conn_read_only(struct db_conn *conn)
{
	const char	*v;

	if ((v = PQparameterStatus(conn->pg, "in_hot_standby")) != NULL &&
	    !strcmp(v, "on"))
		return (1);

	v = PQparameterStatus(conn->pg, "default_transaction_read_only");

	return (v != NULL && !strcmp(v, "on"));
}

/*
 * Starts making the connection; its socket is watched from here on.
 */
static void
conn_start(struct db_conn *conn)
{
	static const char	*keywords[] = { "dbname", NULL };
	const char		*values[2];
	char			*dsn;

	/* No address yet (its name not resolved): db_tick() starts it. */
	if (ntargets == 0)
		return;

	/* A new attempt starts where the last connection was made. */
	if (conn->fresh) {
		conn->fresh = 0;
		conn->walked = 0;
		conn->target = target_good;
	}
	conn->target %= ntargets;

	dsn = target_dsn(conn->target);
	values[0] = dsn;
	values[1] = NULL;

	conn->state = CONN_CONNECTING;
	conn->events = 0;
	conn->flushing = 0;
	conn->doomed = 0;
	conn->preparing = -1;
	conn->prepared = 0;
	conn->deadline = kore_time_ms() + connect_timeout_ms;

	conn->pg = PQconnectStartParams(keywords, values, 1);
	kore_free(dsn);
	if (conn->pg == NULL)
		fatal("%s: out of memory", __func__);

	if (PQstatus(conn->pg) == CONNECTION_BAD) {
		conn_connect_failed(conn, PQerrorMessage(conn->pg));
		return;
	}

	conn_watch(conn, EPOLLOUT);
}

/*
 * Kore's event loop: the connection's socket is ready.
 */
static void
conn_ready(void *arg, int error)
{
	struct db_conn		*conn = arg;
	int			flags;

	flags = conn->evt.flags;
	conn->evt.flags = 0;

	switch (conn->state) {
	case CONN_CONNECTING:
		conn_connect_poll(conn);
		break;
	case CONN_IDLE:
		if (!conn_alive(conn))
			conn_lost(conn, "closed by the server while idle");
		break;
	case CONN_BUSY:
		/*
		 * Handed to a call that has sent nothing yet (or whose
		 * statement was just prepared): news from the server now is
		 * the end of the session, and the call takes another
		 * connection.
		 */
		if (conn->call->phase == DB_PHASE_QUEUED) {
			if (!conn_alive(conn))
				conn_lost_unsent(conn);
			break;
		}
		/* FALLTHROUGH */
	case CONN_DRAINING:
		if (conn->flushing && (flags & KORE_EVENT_WRITE)) {
			switch (PQflush(conn->pg)) {
			case 0:
				conn->flushing = 0;
				conn_watch(conn, EPOLLIN);
				break;
			case 1:
				break;
			default:
				/* Broken: conn_read() finds out. */
				conn->flushing = 0;
				flags |= KORE_EVENT_READ;
				break;
			}
		}
		if ((flags & KORE_EVENT_READ) || error)
			conn_read(conn);
		break;
	default:
		/* Closed earlier in this batch of events. */
		break;
	}
}

static void
conn_connect_poll(struct db_conn *conn)
{
	struct db_pool		*pool = conn->pool;
	PostgresPollingStatusType	st;

	st = PQconnectPoll(conn->pg);
	switch (st) {
	case PGRES_POLLING_READING:
		/* libpq may have moved on to another host's socket. */
		conn->events = 0;
		conn_watch(conn, EPOLLIN);
		break;
	case PGRES_POLLING_WRITING:
		conn->events = 0;
		conn_watch(conn, EPOLLOUT);
		break;
	case PGRES_POLLING_OK:
		if (PQsetnonblocking(conn->pg, 1) == -1) {
			conn_connect_failed(conn, PQerrorMessage(conn->pg));
			break;
		}
		(void)PQsetNoticeReceiver(conn->pg, conn_notice, conn);
		if (pool->failing) {
			kore_log(LOG_NOTICE, "pool %s: the database accepts "
			    "connections again", pool->name);
		}
		pool->failing = 0;
		pool->cause = CAUSE_NONE;
		pool->why[0] = '\0';
		target_good = conn->target;
		conn->walked = 0;
		conn->events = 0;
		conn_watch(conn, EPOLLIN);
		conn_give(conn);
		break;
	default:
		conn_connect_failed(conn, PQerrorMessage(conn->pg));
		break;
	}
}

/*
 * An attempt to connect failed at its target: the connection tries the
 * next one at once, until it has tried them all (each at most
 * connect_timeout). Then the pool remembers why (the most telling of
 * its failures: a refusal no retry changes, or an unreachable server),
 * tries again later, starting with the next target, fails its waiting
 * calls at once when it has no connection left to serve them, and host
 * names are resolved again.
 */
static void
conn_connect_failed(struct db_conn *conn, const char *msg)
{
	struct db_pool		*pool = conn->pool;
	char			why[DB_CAUSE_MAX];
	int			cause;

	cause = cause_classify(msg, why, sizeof(why));

	/*
	 * The attempt's cause is its most telling failure, not its last: a
	 * refusal no retry changes (a missing database, a wrong password)
	 * at one address outranks another address that did not answer.
	 */
	if (conn->walked == 0 || (cause == CAUSE_MISCONFIGURED &&
	    conn->walk_cause != CAUSE_MISCONFIGURED)) {
		conn->walk_cause = cause;
		(void)kore_strlcpy(conn->walk_why, why, sizeof(conn->walk_why));
		(void)kore_strlcpy(conn->walk_msg, msg, sizeof(conn->walk_msg));
	}

	/* New connections start past a target that failed. */
	if (target_good == conn->target % ntargets)
		target_good = (conn->target + 1) % ntargets;
	conn->target++;
	if (++conn->walked < ntargets) {
		conn_close(conn);
		conn_start(conn);
		return;
	}
	conn->walked = 0;
	cause = conn->walk_cause;
	(void)kore_strlcpy(why, conn->walk_why, sizeof(why));
	msg = conn->walk_msg;
	resolve_start();

	if (!pool->failing || pool->cause != cause ||
	    strcmp(pool->why, why))
		pool->logged_at = 0;

	pool->failing = 1;
	pool->cause = cause;
	(void)kore_strlcpy(pool->why, why, sizeof(pool->why));
	pool->retry_at = kore_time_ms() + DB_RETRY_MS;

	/* msg may be libpq's, freed with the connection. */
	pool_log(pool, why, msg);
	conn_close(conn);

	if (pool_open_count(pool) == 0)
		pool_fail_waiters(pool);
}

/*
 * The server's refusals no retry changes, and its lack of connection
 * slots, in its own words (matched in English, lc_messages' default: the
 * server speaks before the session's settings apply).
 */
static int
cause_classify(const char *msg, char *why, size_t len)
{
	if (strstr(msg, "database \"") != NULL &&
	    strstr(msg, "does not exist") != NULL) {
		(void)kore_strlcpy(why, "no such database", len);
		return (CAUSE_MISCONFIGURED);
	}

	if (strstr(msg, "authentication failed") != NULL ||
	    strstr(msg, "no pg_hba.conf entry") != NULL ||
	    (strstr(msg, "role \"") != NULL &&
	    strstr(msg, "does not exist") != NULL) ||
	    strstr(msg, "password") != NULL) {
		(void)kore_strlcpy(why, "authentication failed", len);
		return (CAUSE_MISCONFIGURED);
	}

	/*
	 * SQLSTATE 53300, too_many_connections: the server answers, but has
	 * no slot left. A slot may free up: a retry can succeed.
	 */
	if (strstr(msg, "too many clients already") != NULL ||
	    strstr(msg, "remaining connection slots are reserved") != NULL) {
		(void)kore_strlcpy(why,
		    "out of connection slots (max_connections)", len);
		return (CAUSE_UNREACHABLE);
	}

	if (strstr(msg, "too many connections for ") != NULL) {
		(void)kore_strlcpy(why, "out of connection slots (the role's "
		    "or the database's connection limit)", len);
		return (CAUSE_UNREACHABLE);
	}

	(void)kore_strlcpy(why, "unreachable", len);

	return (CAUSE_UNREACHABLE);
}

static void
pool_log(struct db_pool *pool, const char *why, const char *msg)
{
	u_int64_t	now;
	size_t		len;

	now = kore_time_ms();
	if (pool->logged_at != 0 && now - pool->logged_at < DB_LOG_INTERVAL_MS)
		return;
	pool->logged_at = now;

	/* libpq's message on one line. */
	len = strlen(msg);
	while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
		len--;

	kore_log(pool->cause == CAUSE_MISCONFIGURED ? LOG_ERR : LOG_NOTICE,
	    "pool %s: cannot connect to the database (%s): %.*s",
	    pool->name, why, (int)len, msg);
}

/*
 * Its connections that are made or being made.
 */
static int
pool_open_count(struct db_pool *pool)
{
	u_int16_t	i;
	int		n;

	n = 0;
	for (i = 0; i < pool->size; i++) {
		if (pool->conns[i].state != CONN_CLOSED)
			n++;
	}

	return (n);
}

static void
pool_fail_waiters(struct db_pool *pool)
{
	struct db_call		*c;

	while ((c = TAILQ_FIRST(&pool->waiting)) != NULL) {
		TAILQ_REMOVE(&pool->waiting, c, queue);
		c->refused = 1;
		c->error = pool->cause == CAUSE_MISCONFIGURED ?
		    DB_ERROR_MISCONFIGURED : DB_ERROR_UNAVAILABLE;
		call_message(c, pool->why);
		call_answer(c, DB_PHASE_ANSWERED);
	}
}

/*
 * Watches the connection's socket for these events (level-triggered).
 * libpq may give a connection another socket while it connects; events
 * is then reset first, and Kore adds the new one.
 */
static void
conn_watch(struct db_conn *conn, int events)
{
	int		fd;

	events |= EPOLLRDHUP;
	if (conn->events == events)
		return;

	if ((fd = PQsocket(conn->pg)) < 0)
		fatal("%s: connection without a socket", __func__);

	kore_platform_event_schedule(fd, events, 0, conn);
	conn->events = events;
}

/*
 * A made connection comes free: to the oldest waiting call, or idle.
 */
static void
conn_give(struct db_conn *conn)
{
	struct db_pool		*pool = conn->pool;
	struct db_call		*c;

	conn->call = NULL;
	conn->flushing = 0;
	conn->preparing = -1;
	conn->errored = 0;

	if ((c = TAILQ_FIRST(&pool->waiting)) != NULL) {
		TAILQ_REMOVE(&pool->waiting, c, queue);
		conn->state = CONN_BUSY;
		conn->call = c;
		c->conn = conn;
		call_wake(c);
		return;
	}

	conn->state = CONN_IDLE;
	TAILQ_INSERT_TAIL(&pool->idle, conn, list);
}

/*
 * Closes the connection, whatever it was doing: PQfinish() in
 * non-blocking mode, whose close() also takes the socket out of epoll.
 * db_tick() makes it again.
 */
static void
conn_close(struct db_conn *conn)
{
	if (conn->state == CONN_IDLE)
		TAILQ_REMOVE(&conn->pool->idle, conn, list);

	if (conn->pg != NULL) {
		PQfinish(conn->pg);
		conn->pg = NULL;
	}

	conn->state = CONN_CLOSED;
	conn->events = 0;
	conn->flushing = 0;
	conn->call = NULL;
	conn->evt.flags = 0;
}

/*
 * Reads what the server sent an idle connection, without waiting: a
 * connection the server closed (a restart, a failover, a terminated
 * backend) is found here, by the end of its stream or by the FATAL
 * message the server sends before it (libpq hands that to the notice
 * receiver: conn_notice()).
 */
static int
conn_alive(struct db_conn *conn)
{
	if (PQstatus(conn->pg) != CONNECTION_OK || !PQconsumeInput(conn->pg))
		return (0);

	/* Parses what came in: an idle connection's FATAL is a notice. */
	(void)PQisBusy(conn->pg);

	return (PQstatus(conn->pg) == CONNECTION_OK && !conn->doomed &&
	    PQtransactionStatus(conn->pg) == PQTRANS_IDLE);
}

/*
 * A connection that was made is gone: made again by db_tick().
 */
static void
conn_lost(struct db_conn *conn, const char *how)
{
	struct db_pool		*pool = conn->pool;

	kore_log(LOG_NOTICE, "pool %s: a database connection was %s; making "
	    "it again", pool->name, how);
	conn_close(conn);
	conn->fresh = 1;
}

/*
 * The connection handed to a call is gone before the call sent anything:
 * the call goes back to the head of its pool's queue (or takes an idle
 * connection), and its owner is woken to look again.
 */
static void
conn_lost_unsent(struct db_conn *conn)
{
	struct db_call		*c = conn->call;

	c->conn = NULL;
	conn->call = NULL;
	conn_lost(conn, "found closed before use");
	call_queue(c, 1);
	call_wake(c);
}

/*
 * Reads the statement's answer as far as it has come: its first row set
 * (or error) is kept in the call, the rest dropped; ReadyForQuery ends the
 * call and the connection comes free. A connection that broke on the way
 * ends its call as unavailable (a commit's outcome is then unknown: the
 * client's retry with the same key settles it).
 */
static void
conn_read(struct db_conn *conn)
{
	struct db_call		*c;
	PGresult		*res;
	ExecStatusType		st;

	if (!PQconsumeInput(conn->pg) || PQstatus(conn->pg) != CONNECTION_OK) {
		if ((c = conn->call) != NULL) {
			c->conn = NULL;
			call_message(c, PQerrorMessage(conn->pg));
			if (c->error == 0)
				c->error = DB_ERROR_UNAVAILABLE;
			call_answer(c, DB_PHASE_ANSWERED);
		}
		conn_lost(conn, "lost during a statement");
		return;
	}

	while (!PQisBusy(conn->pg)) {
		if ((res = PQgetResult(conn->pg)) == NULL) {
			conn_done(conn);
			return;
		}

		c = conn->call;
		st = PQresultStatus(res);
		if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK)
			conn->errored = 1;
		if (c == NULL || conn->preparing >= 0) {
			/* A drained answer, or a statement's preparation. */
			if (c != NULL && conn->errored && c->failed == NULL)
				c->failed = res;
			else
				PQclear(res);
		} else if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
			if (c->result == NULL && c->failed == NULL)
				c->result = res;
			else
				PQclear(res);
		} else if (c->failed == NULL) {
			c->failed = res;
		} else {
			PQclear(res);
		}
	}
}

/*
 * The connection sent ReadyForQuery: its command is over. A statement
 * prepared for the call is now run (the call keeps the connection); any
 * other call has its answer; the connection comes free.
 */
static void
conn_done(struct db_conn *conn)
{
	struct db_call		*c = conn->call;
	const char		*state;

	if (conn->preparing >= 0 && !conn->errored)
		conn->prepared |= (u_int64_t)1 << conn->preparing;
	if (conn->preparing >= 0 && !conn->errored && c != NULL) {
		conn->preparing = -1;
		c->phase = DB_PHASE_QUEUED;
		call_wake(c);
		return;
	}
	conn->preparing = -1;

	if (c == NULL) {
		conn_give(conn);
		return;
	}

	c->conn = NULL;
	state = c->failed != NULL ?
	    PQresultErrorField(c->failed, PG_DIAG_SQLSTATE) : NULL;

	/*
	 * A prepared statement the server no longer runs as prepared (a
	 * migration changed a function's result type: "cached plan must not
	 * change result type"; or it is gone): nothing ran. Every
	 * connection's statements are stale then: a new epoch names new ones,
	 * prepared again on each connection's next use, and the call runs
	 * again, at once, on this connection.
	 */
	if (state != NULL && conn->ran_prepared && result_stale(c->failed) &&
	    c->replans++ == 0) {
		kore_log(LOG_NOTICE, "pool %s: prepared statements are stale "
		    "(%s); preparing them again", conn->pool->name, state);
		statements_epoch++;
		PQclear(c->failed);
		c->failed = NULL;
		c->conn = conn;
		c->phase = DB_PHASE_QUEUED;
		call_wake(c);
		return;
	}

	c->read_only = conn_read_only(conn);
	call_answer(c, DB_PHASE_ANSWERED);

	/*
	 * A node that no longer takes writes (a primary demoted without a
	 * restart, a standby) would refuse every write on this connection: it
	 * is made again, and libpq finds the host that takes writes
	 * (target_session_attrs=read-write). The health check's connection
	 * is made again as soon as it finds its node read-only, so that the
	 * next check looks at the node as it is then.
	 */
	if (state != NULL && !strcmp(state, "25006"))
		conn_lost(conn, "refused a write (read-only)");
	else if (c->read_only && c->pool == DB_POOL_HEALTH)
		conn_lost(conn, "to a read-only node (health check)");
	else
		conn_give(conn);
}

/*
 * A commit whose wait for the synchronous standby was cancelled (by a
 * cancel, a failover, a shutdown) has happened here and may not have on
 * the standby: a failover can lose it. PostgreSQL says so only in a
 * warning, with no SQLSTATE of its own (01000, or 57P01 at a shutdown);
 * it is told by the function that raised it, SyncRepWaitForLSN(), which
 * no lc_messages translates. Such a call is never answered as a success.
 */
static void
conn_notice(void *arg, const PGresult *res)
{
	struct db_conn		*conn = arg;
	const char		*msg, *func, *severity;

	/* The server ends the session (a shutdown, a terminated backend). */
	severity = PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
	if (severity != NULL && (!strcmp(severity, "FATAL") ||
	    !strcmp(severity, "PANIC")))
		conn->doomed = 1;

	if (conn->call == NULL || conn->call->phase != DB_PHASE_WAIT)
		return;

	msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	func = PQresultErrorField(res, PG_DIAG_SOURCE_FUNCTION);

	if (severity != NULL && !strcmp(severity, "WARNING") &&
	    func != NULL && !strcmp(func, "SyncRepWaitForLSN")) {
		conn->call->unconfirmed = 1;
		kore_log(LOG_NOTICE, "the commit was not confirmed by the "
		    "standby: %s", msg != NULL ? msg : "(no message)");
	}
}

/*
 * Every DB_TICK_MS: calls past their deadline give up, overdue connection
 * attempts and drains are closed, and closed connections are made again.
 */
static void
db_tick(void *arg, u_int64_t unused)
{
	struct db_pool		*pool;
	struct db_conn		*conn;
	struct db_call		*c, *next;
	u_int64_t		now;
	int			id, connecting;
	u_int16_t		i;

	now = kore_time_ms();

	resolve_poll();
	if (ntargets == 0)
		resolve_start();

	for (id = 0; id < DB_POOLS; id++) {
		pool = &pools[id];

		for (c = TAILQ_FIRST(&pool->waiting); c != NULL; c = next) {
			next = TAILQ_NEXT(c, queue);
			if (now < c->deadline)
				continue;
			TAILQ_REMOVE(&pool->waiting, c, queue);
			c->timed_out = 1;
			c->error = DB_ERROR_TIMEOUT;
			call_message(c, "no database connection came free in "
			    "time");
			call_answer(c, DB_PHASE_ANSWERED);
		}

		connecting = 0;
		for (i = 0; i < pool->size; i++) {
			conn = &pool->conns[i];
			switch (conn->state) {
			case CONN_CONNECTING:
				if (now >= conn->deadline) {
					conn_connect_failed(conn, "the server "
					    "did not answer the connection in "
					    "time");
				} else {
					connecting++;
				}
				break;
			case CONN_BUSY:
				c = conn->call;
				if (c == NULL || c->phase != DB_PHASE_WAIT ||
				    now < c->deadline + DB_GRACE_MS)
					break;
				/*
				 * No answer in time: the connection is closed
				 * under the statement. The server notices
				 * (client_connection_check_interval) or its
				 * own timeouts end it.
				 */
				c->conn = NULL;
				c->timed_out = 1;
				c->error = DB_ERROR_TIMEOUT;
				call_message(c, "no answer from the database "
				    "in time; connection closed");
				call_answer(c, DB_PHASE_ANSWERED);
				conn_lost(conn, "closed with no answer in time");
				/*
				 * Its backend may still wait (a commit waiting
				 * for a standby ignores its client's going): the
				 * slot is made again only after another bound.
				 */
				conn->retry_at = now + settings.db_timeout_ms;
				break;
			case CONN_DRAINING:
				if (now < conn->deadline)
					break;
				conn_lost(conn, "closed while draining");
				/* As above: its backend may still be there. */
				conn->retry_at = now + settings.db_timeout_ms;
				break;
			default:
				break;
			}
		}

		for (i = 0; i < pool->size; i++) {
			conn = &pool->conns[i];
			if (conn->state != CONN_CLOSED ||
			    now < conn->retry_at || ntargets == 0)
				continue;
			/* While refused: one attempt at a time, spaced. */
			if (pool->failing &&
			    (connecting > 0 || now < pool->retry_at))
				break;
			conn_start(conn);
			if (conn->state == CONN_CONNECTING)
				connecting++;
		}
	}
}

/*
 * The connection string every attempt shares, with the session settings
 * the design needs, on every connection whatever the server's or the
 * role's defaults:
 * - the bounds of IDEM_DB_TIMEOUT_MS on statements, lock waits and idle
 *   transactions;
 * - READ COMMITTED, under which a write that waited for a row lock (an
 *   upsert of a busy account, a FOR UPDATE) goes on with the row's latest
 *   version (under REPEATABLE READ each such wait would end in a
 *   serialization failure, and a busy account in 503s);
 * - synchronous_commit on, so that a commit waits for the synchronous
 *   standby whenever one is named (a role's default of "local" would
 *   acknowledge what a failover loses);
 * - client_connection_check_interval, so that a backend whose client
 *   closed the connection (a call given up) stops its statement;
 * - idem.public_url, the base of the type URLs of the problems the SQL
 *   saves (idem_problem()), so that they are the C's (problem.c).
 * Settings the operator gave in "options" come first; these win.
 * TCP keepalives and tcp_user_timeout (db_keepalives) are set, each unless
 * the URL gives its own.
 *
 * The URL's hosts (host, hostaddr and port, one list each) are kept
 * apart: each attempt connects to one address (hosts_target()), and
 * each connection walks the list itself (conn_connect_failed()).
 */
static void
dsn_build(const char *url)
{
	PQconninfoOption	*opts, *o;
	struct kore_buf		buf;
	char			settings_opts[512], *err;
	const char		*user, *host, *hostaddr, *port;
	int			named;
	u_int32_t		given;
	size_t			k;
	long			t;

	err = NULL;
	if ((opts = PQconninfoParse(url, &err)) == NULL) {
		fatal("IDEM_DATABASE_URL cannot be parsed: %s",
		    err != NULL ? err : "out of memory");
	}

	(void)snprintf(settings_opts, sizeof(settings_opts),
	    "-c statement_timeout=%u -c lock_timeout=%u "
	    "-c idle_in_transaction_session_timeout=%u "
	    "-c default_transaction_isolation=read\\ committed "
	    "-c synchronous_commit=on "
	    "-c client_connection_check_interval=1000 "
	    "-c idem.public_url=",
	    settings.db_timeout_ms, settings.db_timeout_ms,
	    settings.db_timeout_ms);

	kore_buf_init(&buf, 256);
	user = host = hostaddr = port = NULL;
	named = 0;
	given = 0;
	for (o = opts; o->keyword != NULL; o++) {
		if (o->val == NULL || *o->val == '\0')
			continue;
		if (!strcmp(o->keyword, "host")) {
			host = o->val;
			continue;
		}
		if (!strcmp(o->keyword, "hostaddr")) {
			hostaddr = o->val;
			continue;
		}
		if (!strcmp(o->keyword, "port")) {
			port = o->val;
			continue;
		}
		if (!strcmp(o->keyword, "options")) {
			user = o->val;
			continue;
		}
		if (!strcmp(o->keyword, "application_name"))
			named = 1;
		for (k = 0; k < DB_KEEPALIVES_N; k++) {
			if (!strcmp(o->keyword, db_keepalives[k].keyword))
				given |= 1 << k;
		}
		if (!strcmp(o->keyword, "connect_timeout")) {
			t = strtol(o->val, NULL, 10);
			/* libpq's own floor: 2 s. */
			if (t > 0)
				connect_timeout_ms = (u_int32_t)(t < 2 ? 2 : t)
				    * 1000;
		}
		dsn_append(&buf, o->keyword, o->val);
	}

	/* The service's connections are named, unless the URL names them. */
	if (!named) {
		dsn_append(&buf, "application_name",
		    kore_server_lookup("api") != NULL ? DB_APPLICATION_API :
		    DB_APPLICATION_PROVIDER);
	}

	for (k = 0; k < DB_KEEPALIVES_N; k++) {
		if (!(given & (1 << k))) {
			dsn_append(&buf, db_keepalives[k].keyword,
			    db_keepalives[k].value);
		}
	}

	kore_buf_appendf(&buf, "options='");
	if (user != NULL) {
		dsn_append(&buf, NULL, user);
		kore_buf_appendf(&buf, " ");
	}
	dsn_append(&buf, NULL, settings_opts);
	options_append(&buf, settings.public_url);
	kore_buf_appendf(&buf, "' ");

	dsn_base = kore_strdup(kore_buf_stringify(&buf, NULL));
	kore_buf_cleanup(&buf);

	hosts_parse(host, hostaddr, port);
	targets_build();

	PQconninfoFree(opts);
}

/*
 * In the parent, before anything connects: a URL whose lists do not match
 * refuses to start (hosts_check()).
 */
void
db_url_check(void)
{
	PQconninfoOption	*opts, *o;
	const char		*host, *hostaddr, *port;
	char			*err;

	err = NULL;
	if ((opts = PQconninfoParse(settings.database_url, &err)) == NULL) {
		fatal("IDEM_DATABASE_URL cannot be parsed: %s",
		    err != NULL ? err : "out of memory");
	}

	host = hostaddr = port = NULL;
	for (o = opts; o->keyword != NULL; o++) {
		if (o->val == NULL || *o->val == '\0')
			continue;
		if (!strcmp(o->keyword, "host"))
			host = o->val;
		else if (!strcmp(o->keyword, "hostaddr"))
			hostaddr = o->val;
		else if (!strcmp(o->keyword, "port"))
			port = o->val;
	}
	(void)hosts_check(host, hostaddr, port);

	PQconninfoFree(opts);
}

/*
 * The number of hosts of the URL's lists. As libpq: one hostaddr per
 * host, and one port per host or one for all; refused rather than taken
 * silently (list_item() would give every host past the list the list's
 * last item), and so are more hosts than are used.
 */
static u_int32_t
hosts_check(const char *host, const char *hostaddr, const char *port)
{
	u_int32_t	n;

	n = list_count(host != NULL ? host : hostaddr);
	if (hostaddr != NULL && list_count(hostaddr) != n) {
		fatal("IDEM_DATABASE_URL: %u hostaddr values for %u hosts",
		    list_count(hostaddr), n);
	}
	if (port != NULL && list_count(port) != 1 && list_count(port) != n) {
		fatal("IDEM_DATABASE_URL: %u ports for %u hosts (give one "
		    "port, or one per host)", list_count(port), n);
	}
	if (n > DB_HOSTS_MAX) {
		fatal("IDEM_DATABASE_URL: %u hosts for at most %d", n,
		    DB_HOSTS_MAX);
	}

	return (n);
}

/*
 * How many elements a comma-separated list has (1 without a list).
 */
static u_int32_t
list_count(const char *list)
{
	const char	*p;
	u_int32_t	n;

	n = 1;
	if (list == NULL)
		return (n);

	for (p = list; *p != '\0'; p++) {
		if (*p == ',')
			n++;
	}

	return (n);
}

/*
 * The k-th element of a comma-separated list (the last one when the list
 * is shorter: a single port serves every host), NULL without a list.
 */
static char *
list_item(const char *list, u_int32_t k)
{
	const char	*p, *end;
	u_int32_t	i;

	if (list == NULL)
		return (NULL);

	p = list;
	for (i = 0; i < k; i++) {
		if ((end = strchr(p, ',')) == NULL)
			break;
		p = end + 1;
	}

	if ((end = strchr(p, ',')) == NULL)
		end = p + strlen(p);

	return (dup_n(p, (size_t)(end - p)));
}

static char *
dup_n(const char *s, size_t len)
{
	char		*copy;

	copy = kore_malloc(len + 1);
	memcpy(copy, s, len);
	copy[len] = '\0';

	return (copy);
}

/*
 * The URL's hosts: a host name that is neither an address nor a socket
 * directory, and has no hostaddr of its own, is resolved off the event
 * loop (resolve_start()).
 */
static void
hosts_parse(const char *host, const char *hostaddr, const char *port)
{
	struct db_host		*h;
	struct in6_addr		a6;
	struct in_addr		a4;
	u_int32_t		n, i;

	n = hosts_check(host, hostaddr, port);

	for (i = 0; i < n; i++) {
		h = &hosts[i];
		memset(h, 0, sizeof(*h));
		h->host = list_item(host, i);
		h->hostaddr = list_item(hostaddr, i);
		h->port = list_item(port, i);
		if (h->host != NULL && h->host[0] == '\0') {
			kore_free(h->host);
			h->host = NULL;
		}
		if (h->hostaddr != NULL && h->hostaddr[0] == '\0') {
			kore_free(h->hostaddr);
			h->hostaddr = NULL;
		}
		h->named = h->host != NULL && h->hostaddr == NULL &&
		    h->host[0] != '/' && h->host[0] != '@' &&
		    inet_pton(AF_INET, h->host, &a4) != 1 &&
		    inet_pton(AF_INET6, h->host, &a6) != 1;
		if (h->named)
			names++;
	}
	nhosts = n;
}

/*
 * The addresses attempts connect to, in the URL's order: a host given
 * by address (or socket) once, a named one once per address its last
 * successful resolution gave (none before the first).
 */
static void
targets_build(void)
{
	struct db_host		*h;
	u_int32_t		i, k;

	ntargets = 0;
	for (i = 0; i < nhosts; i++) {
		h = &hosts[i];
		if (!h->named) {
			targets[ntargets].host = h;
			targets[ntargets].addr = h->hostaddr;
			ntargets++;
			continue;
		}
		for (k = 0; k < h->naddrs && ntargets < DB_TARGETS_MAX; k++) {
			targets[ntargets].host = h;
			targets[ntargets].addr = h->addrs[k];
			ntargets++;
		}
	}

	if (target_good >= ntargets)
		target_good = 0;
}

/*
 * The connection string of an attempt at target k: one host, one
 * address, one port. libpq keeps the host name for TLS, its checks and
 * .pgpass, and connects to the address without resolving anything.
 */
static char *
target_dsn(u_int32_t k)
{
	struct db_target	*t = &targets[k];
	struct kore_buf		buf;
	char			*dsn;

	kore_buf_init(&buf, 512);
	kore_buf_appendf(&buf, "%s", dsn_base);
	if (t->host->host != NULL)
		dsn_append(&buf, "host", t->host->host);
	if (t->addr != NULL)
		dsn_append(&buf, "hostaddr", t->addr);
	if (t->host->port != NULL)
		dsn_append(&buf, "port", t->host->port);

	dsn = kore_strdup(kore_buf_stringify(&buf, NULL));
	kore_buf_cleanup(&buf);

	return (dsn);
}

static void
hosts_free(void)
{
	struct db_host		*h;
	u_int32_t		i;

	for (i = 0; i < nhosts; i++) {
		h = &hosts[i];
		kore_free(h->host);
		kore_free(h->hostaddr);
		kore_free(h->port);
		memset(h, 0, sizeof(*h));
	}
	nhosts = 0;
	names = 0;
	ntargets = 0;
	target_good = 0;
	kore_free(dsn_base);
	dsn_base = NULL;
}

/*
 * The anchor this worker's earlier images left (a reload), or a new one.
 * Each host name takes the addresses it had, if the URL still names it
 * at that place. An anchor of a build laid out otherwise, or inherited
 * from another process, is left as it is (its resolution may still be
 * written by the C library) and a new one made.
 */
static void
anchor_attach(void)
{
	struct db_anchor	*a;
	struct db_host		*h;
	u_int32_t		i;
#if defined(DEV_ROUTES)
	const char		*env;

	if ((env = getenv(DB_RESOLVE_STUCK_ENV)) != NULL &&
	    strtoull(env, NULL, 10) > 0)
		resolve_stuck_ms = strtoull(env, NULL, 10);
#endif

	a = kore_mem_lookup(DB_ANCHOR_TAG);
	if (a != NULL && (a->size != sizeof(*a) ||
	    a->resolve_size != sizeof(struct db_resolve) ||
	    a->pid != getpid())) {
		kore_mem_untag(a);
		a = NULL;
	}

	if (a == NULL) {
		a = kore_malloc_tagged(sizeof(*a), DB_ANCHOR_TAG);
		memset(a, 0, sizeof(*a));
		a->size = sizeof(*a);
		a->resolve_size = sizeof(struct db_resolve);
		a->pid = getpid();
	}
	anchor = a;

	for (i = 0; i < nhosts; i++) {
		h = &hosts[i];
		if (!h->named || a->hosts[i].name == NULL ||
		    strcmp(a->hosts[i].name, h->host))
			continue;
		memcpy(h->addrs, a->hosts[i].addrs, sizeof(h->addrs));
		h->naddrs = a->hosts[i].naddrs;
	}
	targets_build();
}

/*
 * Resolves the URL's host names off the event loop, with the C library's
 * asynchronous getaddrinfo_a(): its own threads run getaddrinfo() (the C
 * library's code, not the module's: a reload may unload the module while
 * they run) and the worker looks for the answer from db_tick(), with
 * gai_error(). One resolution at a time, started at most every
 * DB_RESOLVE_MS: when the worker starts, while no name has an address,
 * and when a connection failed at every address it had. A reload does
 * not wait for it: the resolution stays in the anchor and the new image
 * polls it.
 */
static void
resolve_start(void)
{
	struct db_resolve	*r;
	u_int32_t		i, n;
	int			err;

	if (anchor == NULL || anchor->resolving != NULL || names == 0 ||
	    kore_time_ms() < resolve_at)
		return;

	resolve_at = kore_time_ms() + DB_RESOLVE_MS;

	if ((r = calloc(1, sizeof(*r))) == NULL)
		fatal("%s: out of memory", __func__);
	r->n = nhosts;
	r->started = kore_time_ms();
	r->hints.ai_family = AF_UNSPEC;
	r->hints.ai_socktype = SOCK_STREAM;
	r->sev.sigev_notify = SIGEV_NONE;

	n = 0;
	for (i = 0; i < nhosts; i++) {
		if (!hosts[i].named)
			continue;
		if ((r->names[i] = strdup(hosts[i].host)) == NULL)
			fatal("%s: out of memory", __func__);
		r->cb[i].ar_name = r->names[i];
		r->cb[i].ar_request = &r->hints;
		r->list[n++] = &r->cb[i];
	}

	if ((err = getaddrinfo_a(GAI_NOWAIT, r->list, (int)n,
	    &r->sev)) != 0) {
		/*
		 * EAI_AGAIN or EAI_MEMORY: none of them was queued (the C
		 * library takes them all or none). Tried again later.
		 */
		kore_log(LOG_ERR, "cannot start the database host name "
		    "resolution: %s", gai_strerror(err));
		resolve_free(r);
		return;
	}

	anchor->resolving = r;
}

/*
 * From db_tick(): the resolution's answer, once all its names are in. A
 * name that resolved takes its new addresses (kept in the anchor too);
 * one that did not keeps those it had. With no address at all, every
 * pool fails its waiting calls and says why.
 */
static void
resolve_poll(void)
{
	struct db_resolve	*r;
	struct db_host		*h;
	struct db_pool		*pool;
	struct addrinfo		*ai;
	const void		*src;
	char			msg[DB_CAUSE_MAX], addr[INET6_ADDRSTRLEN];
	u_int32_t		i, k, n;
	int			id, err, dup;

	if (anchor == NULL || (r = anchor->resolving) == NULL)
		return;

	for (i = 0; i < r->n; i++) {
		if (r->names[i] != NULL &&
		    gai_error(&r->cb[i]) == EAI_INPROGRESS)
			break;
	}
	if (i < r->n) {
		if (kore_time_ms() - r->started < resolve_stuck_ms)
			return;
		kore_log(LOG_ERR, "the database host name resolution has not "
		    "reported in %llu ms: asked again",
		    (unsigned long long)resolve_stuck_ms);
		anchor->resolving = NULL;
		if (resolve_abandon(r))
			resolve_free(r);
		return;
	}
	anchor->resolving = NULL;

	/* The C library's thread wrote the result before its status. */
	__atomic_thread_fence(__ATOMIC_ACQUIRE);

	msg[0] = '\0';
	for (i = 0; i < r->n && i < nhosts; i++) {
		h = &hosts[i];
		if (r->names[i] == NULL || !h->named ||
		    strcmp(r->names[i], h->host))
			continue;
		if ((err = gai_error(&r->cb[i])) != 0) {
			(void)snprintf(msg, sizeof(msg), "%s: %s", h->host,
			    gai_strerror(err));
			continue;
		}

		n = 0;
		for (ai = r->cb[i].ar_result; ai != NULL && n < DB_ADDRS_MAX;
		    ai = ai->ai_next) {
			if (ai->ai_family == AF_INET) {
				src = &((struct sockaddr_in *)
				    (void *)ai->ai_addr)->sin_addr;
			} else if (ai->ai_family == AF_INET6) {
				src = &((struct sockaddr_in6 *)
				    (void *)ai->ai_addr)->sin6_addr;
			} else {
				continue;
			}
			if (inet_ntop(ai->ai_family, src, addr,
			    sizeof(addr)) == NULL)
				continue;
			dup = 0;
			for (k = 0; k < n; k++) {
				if (!strcmp(h->addrs[k], addr))
					dup = 1;
			}
			if (dup)
				continue;
			(void)kore_strlcpy(h->addrs[n], addr,
			    sizeof(h->addrs[n]));
			n++;
		}
		if (n == 0) {
			(void)snprintf(msg, sizeof(msg), "%s: %s", h->host,
			    gai_strerror(EAI_NONAME));
			continue;
		}
		h->naddrs = n;

		kore_free(anchor->hosts[i].name);
		anchor->hosts[i].name = kore_strdup(h->host);
		memcpy(anchor->hosts[i].addrs, h->addrs, sizeof(h->addrs));
		anchor->hosts[i].naddrs = n;
	}
	resolve_free(r);

	targets_build();
	if (msg[0] != '\0')
		kore_log(LOG_NOTICE, "database host name not resolved: %s", msg);
	if (ntargets > 0)
		return;

	for (id = 0; id < DB_POOLS; id++) {
		pool = &pools[id];
		if (pool->size == 0)
			continue;
		if (!pool->failing || pool->cause != CAUSE_UNREACHABLE ||
		    strcmp(pool->why, DB_WHY_UNRESOLVED))
			pool->logged_at = 0;
		pool->failing = 1;
		pool->cause = CAUSE_UNREACHABLE;
		(void)kore_strlcpy(pool->why, DB_WHY_UNRESOLVED,
		    sizeof(pool->why));
		pool_log(pool, DB_WHY_UNRESOLVED, msg);
		if (pool_open_count(pool) == 0)
			pool_fail_waiters(pool);
	}
}

/*
 * A resolution given up: the requests the C library has not started are
 * cancelled. True when none is left running and r may be freed; false
 * when one is still running: its thread may yet write into r, which is
 * then left to it (a few hundred bytes, and only for a resolution that
 * never reports).
 */
static int
resolve_abandon(struct db_resolve *r)
{
	u_int32_t	i;
	int		freeable;

	freeable = 1;
	for (i = 0; i < r->n; i++) {
		if (r->names[i] == NULL)
			continue;
		if (gai_cancel(&r->cb[i]) == EAI_NOTCANCELED)
			freeable = 0;
	}

	return (freeable);
}

/*
 * A resolution whose requests are all done or cancelled: its results
 * and itself.
 */
static void
resolve_free(struct db_resolve *r)
{
	u_int32_t	i;

	for (i = 0; i < r->n; i++) {
		if (r->cb[i].ar_result != NULL)
			freeaddrinfo(r->cb[i].ar_result);
		free(r->names[i]);
	}
	free(r);
}

/*
 * A value inside "options", where a space would end it: spaces and
 * backslashes take a backslash, then the whole is escaped for the quoted
 * connection string like any value (dsn_append()).
 */
static void
options_append(struct kore_buf *buf, const char *value)
{
	struct kore_buf		opt;
	const char		*p;

	kore_buf_init(&opt, 128);
	for (p = value; *p != '\0'; p++) {
		if (*p == ' ' || *p == '\\')
			kore_buf_append(&opt, "\\", 1);
		kore_buf_append(&opt, p, 1);
	}

	dsn_append(buf, NULL, kore_buf_stringify(&opt, NULL));
	kore_buf_cleanup(&opt);
}

/*
 * keyword='value' with quotes and backslashes escaped, or with no keyword
 * the escaped value alone.
 */
static void
dsn_append(struct kore_buf *buf, const char *keyword, const char *value)
{
	const char	*p;

	if (keyword != NULL)
		kore_buf_appendf(buf, "%s='", keyword);

	for (p = value; *p != '\0'; p++) {
		if (*p == '\'' || *p == '\\')
			kore_buf_append(buf, "\\", 1);
		kore_buf_append(buf, p, 1);
	}

	if (keyword != NULL)
		kore_buf_append(buf, "' ", 2);
}
