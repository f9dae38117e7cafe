/*
 * Asynchronous calls of SQL functions through Kore's pgsql layer.
 *
 * A call is done only when PostgreSQL has sent ReadyForQuery, that is when
 * the implicit transaction of the statement has committed: a row read
 * before that could still be rolled back, and a response built on it would
 * promise what the database does not hold.
 *
 * Every wait is bounded by IDEM_DB_TIMEOUT_MS: PostgreSQL cancels a
 * statement or a lock wait that takes longer (the session settings below),
 * a request queued for a pooled connection gives up after it, and a call
 * whose answer has not come a little later (a commit waiting for a standby
 * that does not confirm, a server that stopped answering) has its
 * connection closed under it. Each is answered as a retryable 503; a
 * commit whose answer was lost has an unknown outcome, which the client's
 * retry with the same key settles.
 */

#include <sys/types.h>
#include <sys/socket.h>

#include <stdio.h>
#include <string.h>

#include "db.h"
#include "metrics.h"
#include "settings.h"

#define DB_PHASE_SETUP		0
#define DB_PHASE_WAIT		1
#define DB_PHASE_DONE		2
#define DB_PHASE_FAILED		3

/* How much later than the server's own timeout the client gives up. */
#define DB_GRACE_MS		500

/* /healthz answers within a second (with the grace), whatever the pool does. */
#define DB_HEALTH_TIMEOUT_MS	(1000 - DB_GRACE_MS)

/*
 * The calls of this worker queued for a pooled connection, oldest first:
 * the same calls as in Kore's queue, which this module cannot reach. Kore
 * 4.1 wakes a queued request when a connection is given back, but not when
 * it frees one itself (an error on the socket of a connection with a query
 * in flight: the database went away), nor when the request it woke for a
 * connection is freed before it runs (its client left): the pool then has
 * room and nobody is woken. This list wakes them then (queue_wake()).
 * Empty whenever the worker holds no work, so a reload finds it empty.
 */
TAILQ_HEAD(db_call_list, db_call);

static struct db_call_list	queued = TAILQ_HEAD_INITIALIZER(queued);

static int	call_fail(struct db_call *);
static int	call_conflict(struct db_call *);
static void	call_forget_failed(struct db_call *);
static int	call_has(struct db_call *, int);
static void	call_release(struct db_call *);
static void	call_check_connection(struct db_call *);
static void	call_drop_connection(struct db_call *);
static void	job_callback(struct kore_pgsql *, void *);
static void	call_arm(struct db_call *, u_int32_t);
static void	call_disarm(struct db_call *);
static void	call_deadline(void *, u_int64_t);
static void	call_abort(struct db_call *);
static void	call_shutdown(struct db_call *);
static void	call_notice(void *, const PGresult *);
static void	call_notices_restore(struct db_call *);
static void	queue_join(struct db_call *);
static void	queue_leave(struct db_call *);
static void	queue_wake(const char *);
static void	queue_woken(struct kore_pgsql *, void *);
static void	queue_bind(struct db_call *, struct http_request *);
static void	queue_requeue(struct db_call *);
static int	call_classify(const char *);
static char	*session_dsn(const char *);
static void	dsn_append(struct kore_buf *, const char *, const char *);
static void	options_append(struct kore_buf *, const char *);

void
db_register(void)
{
	char		*dsn;
	u_int16_t	max;

	dsn = session_dsn(settings.database_url);

	/* Registered again on a module reload, which is harmless. */
	(void)kore_pgsql_register(DB_NAME, dsn);
	(void)kore_pgsql_register(DB_NAME_HEALTH, dsn);

	/*
	 * The jobs poll their calls rather than sleep in Kore's queue, and a
	 * call set up again while queued would be queued twice: their pool
	 * has a connection for each, whatever pgsql_conn_max says (Kore sizes
	 * a pool from it when the pool is registered; 0 is no limit).
	 */
	max = pgsql_conn_max;
	if (pgsql_conn_max != 0 && pgsql_conn_max < DB_JOBS_CONN_MIN)
		pgsql_conn_max = DB_JOBS_CONN_MIN;
	(void)kore_pgsql_register(DB_NAME_JOBS, dsn);
	pgsql_conn_max = max;

	kore_free(dsn);
}

/*
 * Opens n connections of a pool (DB_POOL_OPEN_UNLIMITED where
 * pgsql_conn_max is 0, no limit) when a worker starts, before it serves.
 * Kore 4.1 makes a connection with a blocking PQconnectdb() in the event
 * loop the first time its pool needs one: a burst on a fresh worker made
 * it open a whole pool in a row, and everything else the worker had to do
 * (a /healthz) waited for all of them, 2.4 s on a loaded machine
 * (tests/http/59_cold_pool.py). Made here, they are only made again in
 * the loop after a connection was lost.
 *
 * A connection that cannot be made (the database refuses, or does not
 * answer within connect_timeout) ends the opening for every pool of the
 * worker: the rest are made when needed, and a database that does not
 * answer holds the worker's start for one connect only.
 *
 * Each connection given back wakes Kore's queue of waiting calls, which
 * is empty here: at a worker's start, and at a reload, which loads the
 * new image only once the worker holds no work (reload.c).
 */
void
db_pool_open(const char *name, u_int16_t n)
{
	struct kore_pgsql	*held;
	const char		*err;
	u_int16_t		i, got;
	static int		failed = 0;

	if (n == 0)
		n = DB_POOL_OPEN_UNLIMITED;
	if (failed)
		return;

	held = kore_calloc(n, sizeof(*held));
	for (got = 0; got < n; got++) {
		kore_pgsql_init(&held[got]);
		if (kore_pgsql_setup(&held[got], name, KORE_PGSQL_SYNC))
			continue;

		/* Full already (a reload) is no news. */
		err = held[got].error != NULL ? held[got].error : "";
		if (strcmp(err, "no available connection")) {
			failed = 1;
			kore_log(LOG_NOTICE, "pool %s: %u of %u connections "
			    "opened at start, the rest when needed: %.*s",
			    name, got, n, (int)strcspn(err, "\n"), err);
		}
		kore_pgsql_cleanup(&held[got]);
		break;
	}

	/* Given back to Kore's pool: free, idle, made. */
	for (i = 0; i < got; i++)
		kore_pgsql_cleanup(&held[i]);
	kore_free(held);
}

void
db_call_init(struct db_call *c, struct http_request *req)
{
	memset(c, 0, sizeof(*c));
	c->dbname = DB_NAME;
	c->timeout_ms = settings.db_timeout_ms;
	kore_pgsql_init(&c->sql);
	queue_bind(c, req);
}

/*
 * A health check: its own pool, so that it never queues behind requests
 * that wait for a lock, and at most a second.
 */
void
db_call_init_health(struct db_call *c, struct http_request *req)
{
	db_call_init(c, req);
	c->dbname = DB_NAME_HEALTH;
	if (c->timeout_ms > DB_HEALTH_TIMEOUT_MS)
		c->timeout_ms = DB_HEALTH_TIMEOUT_MS;
}

/*
 * A call of a background job, which polls db_call_step() from a timer
 * rather than waiting for a callback: Kore 4.1 does not call back when a
 * connection is lost. A job makes one call at a time from its own pool,
 * so it is never queued for a connection.
 */
void
db_call_init_job(struct db_call *c)
{
	memset(c, 0, sizeof(*c));
	c->dbname = DB_NAME_JOBS;
	c->timeout_ms = settings.db_timeout_ms;
	kore_pgsql_init(&c->sql);
	kore_pgsql_bind_callback(&c->sql, job_callback, NULL);
}

void
db_call_cleanup(struct db_call *c)
{
	call_disarm(c);
	call_forget_failed(c);

	if (c->result != NULL) {
		PQclear(c->result);
		c->result = NULL;
	}

	call_release(c);
}

int
db_call_step(struct db_call *c, const char *query, int nparams,
    const char **values)
{
	int		i, spare, lengths[DB_PARAMS_MAX], formats[DB_PARAMS_MAX];

	if (nparams > DB_PARAMS_MAX)
		fatal("%s: %d parameters", __func__, nparams);

	for (;;) {
		switch (c->phase) {
		case DB_PHASE_SETUP:
			if (c->timed_out) {
				kore_log(LOG_NOTICE, "no database connection "
				    "came free within %u ms", c->timeout_ms);
				c->error = DB_ERROR_TIMEOUT;
				return (call_fail(c));
			}

			/*
			 * Woken twice, by Kore and by queue_wake(): two
			 * connections came free for it, it takes one.
			 */
			spare = c->woken && c->kore_woken;
			c->kore_woken = 0;
			if (c->woken)
				queue_requeue(c);
			queue_leave(c);

			if (!kore_pgsql_setup(&c->sql, c->dbname,
			    KORE_PGSQL_ASYNC)) {
				/* Queued for a free connection: woken later. */
				if (c->sql.state == KORE_PGSQL_STATE_INIT) {
					queue_join(c);
					if (c->timer == NULL)
						call_arm(c, c->timeout_ms);
					return (DB_CALL_PENDING);
				}
				/*
				 * No connection could be made (the server
				 * refuses them): the room in the pool is still
				 * there for the next queued call, which fails
				 * as fast or gets a connection (and the spare
				 * room of a call woken twice, for the one after).
				 */
				queue_wake(c->dbname);
				if (spare)
					queue_wake(c->dbname);
				return (call_fail(c));
			}

			if (spare)
				queue_wake(c->dbname);

			call_disarm(c);
			call_check_connection(c);
			c->notices = PQsetNoticeReceiver(c->sql.conn->db,
			    call_notice, c);
			call_arm(c, c->timeout_ms + DB_GRACE_MS);

			for (i = 0; i < nparams; i++) {
				lengths[i] = values[i] ? strlen(values[i]) : 0;
				formats[i] = 0;
			}

			c->phase = DB_PHASE_WAIT;
			if (!kore_pgsql_query_param_fields(&c->sql, query, 0,
			    nparams, values, lengths, formats))
				return (call_fail(c));
			return (DB_CALL_PENDING);
		case DB_PHASE_WAIT:
			switch (c->sql.state) {
			case KORE_PGSQL_STATE_WAIT:
				if (c->timed_out) {
					call_abort(c);
					return (call_fail(c));
				}
				return (DB_CALL_PENDING);
			case KORE_PGSQL_STATE_RESULT:
				if (c->result == NULL) {
					c->result = c->sql.result;
					c->sql.result = NULL;
				}
				kore_pgsql_continue(&c->sql);
				break;
			case KORE_PGSQL_STATE_ERROR:
				/*
				 * Kore freed the connection (an error on its
				 * socket): room in the pool that Kore does not
				 * tell the queue about.
				 */
				if (c->sql.conn == NULL)
					queue_wake(c->dbname);
				if (c->sql.conn != NULL && call_conflict(c)) {
					kore_pgsql_continue(&c->sql);
					break;
				}
				return (call_fail(c));
			case KORE_PGSQL_STATE_COMPLETE:
				if (c->failed != NULL)
					return (call_fail(c));
				if (c->unconfirmed) {
					c->error = DB_ERROR_UNCONFIRMED;
					return (call_fail(c));
				}
				/*
				 * The connection went back to the pool with no
				 * answer to the call: what happened to it is not
				 * known, so it is worth a retry, not a 500.
				 */
				if (c->result == NULL) {
					kore_log(LOG_ERR, "%s: the call ended "
					    "without an answer (%s)", __func__,
					    c->sql.error != NULL ? c->sql.error :
					    "no error");
					metrics_db_error();
					call_disarm(c);
					c->error = DB_ERROR_UNAVAILABLE;
					c->phase = DB_PHASE_FAILED;
					return (DB_CALL_FAILED);
				}
				call_disarm(c);
				c->phase = DB_PHASE_DONE;
				return (DB_CALL_DONE);
			case KORE_PGSQL_STATE_DONE:
				/*
				 * The statement's messages are all in: the
				 * connection goes back to the pool with
				 * libpq's own notice receiver, never with
				 * one into this call (or this module image).
				 */
				call_notices_restore(c);
				kore_pgsql_continue(&c->sql);
				break;
			default:
				kore_pgsql_continue(&c->sql);
				break;
			}
			break;
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

int
db_call_rows(struct db_call *c)
{
	return (c->result == NULL ? 0 : PQntuples(c->result));
}

/*
 * A failed call: its class (see db.h) from the SQLSTATE, unless the call
 * already knows it (a deadline, an unconfirmed commit), and libpq's own
 * words in the log.
 */
static int
call_fail(struct db_call *c)
{
	const PGresult	*res;
	const char	*state, *detail, *msg;
	size_t		len;

	res = c->failed != NULL ? c->failed : c->sql.result;
	state = detail = NULL;
	if (res != NULL) {
		state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);
	}

	if (state != NULL)
		(void)kore_strlcpy(c->sqlstate, state, sizeof(c->sqlstate));

	if (c->error == 0)
		c->error = call_classify(state);

	msg = c->failed != NULL ? c->failed_msg : c->sql.error;
	if ((msg == NULL || *msg == '\0') && c->sql.conn != NULL)
		msg = PQerrorMessage(c->sql.conn->db);
	if (msg == NULL || *msg == '\0')
		msg = "the connection was lost, libpq gave no reason";
	len = strlen(msg);
	while (len > 0 && (msg[len - 1] == '\n' || msg[len - 1] == ' '))
		len--;

	/*
	 * A duplicate that found its key committed by a concurrent first
	 * attempt (tx_execute() says so in the detail) is rolled back as
	 * expected, and its caller replays: not a database error.
	 */
	if (c->error != DB_ERROR_CONFLICT || detail == NULL ||
	    strcmp(detail, DB_KEY_TAKEN)) {
		kore_log(LOG_NOTICE, "database call failed (%s): %.*s",
		    c->timed_out ? "timeout" : state != NULL ?
		    state : c->error == DB_ERROR_UNCONFIRMED ? "unconfirmed" :
		    "no sqlstate", (int)len, msg);
		metrics_db_error();
	} else {
		c->key_taken = 1;
	}

	call_forget_failed(c);
	call_disarm(c);

	if (c->result != NULL) {
		PQclear(c->result);
		c->result = NULL;
	}

	if (c->error == DB_ERROR_READ_ONLY)
		call_drop_connection(c);

	call_release(c);
	c->phase = DB_PHASE_FAILED;

	return (DB_CALL_FAILED);
}

/*
 * A statement rolled back by a deadlock or a serialization failure (its
 * caller may run it again) is kept, and the rest of its answer read, up to
 * the server's ReadyForQuery: then Kore takes the connection back idle.
 * Released in its error state, Kore would first send a cancel for it, a
 * blocking connection to the server for a statement already over.
 */
static int
call_conflict(struct db_call *c)
{
	const char	*state;

	if (c->failed != NULL || c->sql.result == NULL)
		return (0);

	state = PQresultErrorField(c->sql.result, PG_DIAG_SQLSTATE);
	if (state == NULL || call_classify(state) != DB_ERROR_CONFLICT)
		return (0);

	c->failed = c->sql.result;
	c->sql.result = NULL;
	c->failed_msg = kore_strdup(c->sql.error != NULL ? c->sql.error : "");

	return (1);
}

static void
call_forget_failed(struct db_call *c)
{
	if (c->failed != NULL) {
		PQclear(c->failed);
		c->failed = NULL;
	}

	kore_free(c->failed_msg);
	c->failed_msg = NULL;
}

/*
 * Gives the connection back to Kore's pool. When libpq has already closed
 * the socket of a lost connection, Kore would ask epoll to forget fd -1 and
 * die of the error (and try to cancel the query on it); closing the socket
 * already took it out of epoll, so tell Kore the query is not scheduled.
 *
 * A call given up after it was woken for a connection that came free and
 * before it ran (its client left in the same turn of the event loop, or
 * its deadline passed just before): that connection would stay unused
 * while the rest of the queue sleeps on, as Kore wakes nobody else for it.
 * The next queued call is woken in its place, once for each wake it had.
 * (Kore's queue is one for every pool: a connection of another pool given
 * back may have woken it, and the call woken in its place then finds no
 * room and queues again, at the end.)
 */
static void
call_release(struct db_call *c)
{
	int		wakes;

	wakes = c->woken + c->kore_woken;
	c->woken = 0;
	c->kore_woken = 0;

	queue_leave(c);
	call_notices_restore(c);

	if (c->sql.conn != NULL && PQsocket(c->sql.conn->db) < 0)
		c->sql.flags &= ~KORE_PGSQL_SCHEDULED;

	kore_pgsql_cleanup(&c->sql);

	while (wakes-- > 0)
		queue_wake(c->dbname);
}

/*
 * Kore returns a connection whose backend died to its pool, where every
 * later query on it would fail. Reading what the server sent to the idle
 * connection (libpq's socket does not block) notices a backend that was
 * terminated or restarted; such a connection is reconnected before use.
 */
static void
call_check_connection(struct db_call *c)
{
	PGconn		*conn;

	conn = c->sql.conn->db;
	if (PQstatus(conn) == CONNECTION_OK && PQconsumeInput(conn) &&
	    PQstatus(conn) == CONNECTION_OK)
		return;

	kore_log(LOG_NOTICE, "reconnecting a broken database connection");
	PQreset(conn);
}

/*
 * A connection to a node that no longer takes writes (a primary demoted
 * without a restart, a standby) would refuse every write for as long as it
 * stays in Kore's pool. Its socket is shut down, so that the check above
 * makes it again before its next use: libpq then tries every host of the
 * connection string and keeps the one that takes writes
 * (target_session_attrs=read-write).
 */
static void
call_drop_connection(struct db_call *c)
{
	if (c->sql.conn == NULL)
		return;

	kore_log(LOG_NOTICE, "the database refused a write: dropping the "
	    "connection to find the primary again");

	call_shutdown(c);
}

static void
job_callback(struct kore_pgsql *sql, void *arg)
{
	/* Jobs poll the state of their call; nothing to do here. */
}

/*
 * Which failures are worth a retry: no SQLSTATE (a refused connection, a
 * dead backend, a full pool), the connection, resource and shutdown
 * classes, a statement or lock wait cancelled by the session's timeouts,
 * a serialization failure or deadlock (the transaction was rolled back),
 * and a write that reached a node that is no longer the primary.
 */
static int
call_classify(const char *state)
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

	return (DB_ERROR_QUERY);
}

static void
call_arm(struct db_call *c, u_int32_t ms)
{
	call_disarm(c);
	c->timer = kore_timer_add(call_deadline, ms, c, KORE_TIMER_ONESHOT);
}

static void
call_disarm(struct db_call *c)
{
	if (c->timer != NULL) {
		kore_timer_remove(c->timer);
		c->timer = NULL;
	}
}

/*
 * The deadline passed: the request is woken to give up (a job sees it on
 * its next poll).
 */
static void
call_deadline(void *arg, u_int64_t now)
{
	struct db_call		*c = arg;

	/* Kore frees a one-shot timer after this callback. */
	c->timer = NULL;

#if !defined(KORE_NO_HTTP)
	/*
	 * Queued for a connection, and already woken by Kore's pgsql layer,
	 * which wakes one waiter per connection that comes free: this request
	 * takes that connection. Giving up now would leave it unused while
	 * the rest of the queue sleeps on.
	 */
	if (c->phase == DB_PHASE_SETUP && c->sql.req != NULL &&
	    !(c->sql.req->flags & HTTP_REQUEST_SLEEPING))
		return;
#endif

	c->timed_out = 1;

#if !defined(KORE_NO_HTTP)
	if (c->sql.req != NULL)
		http_request_wakeup(c->sql.req);
#endif
}

/*
 * No answer in time: the connection is closed under the query, without
 * Kore's blocking cancel (which would hang the worker on a server that no
 * longer answers). The server notices on its own or with its timeouts;
 * the pooled connection is reconnected before its next use.
 */
static void
call_abort(struct db_call *c)
{
	kore_log(LOG_NOTICE, "no answer from the database within %u ms; "
	    "closing the connection", c->timeout_ms + DB_GRACE_MS);

	c->error = DB_ERROR_TIMEOUT;
	call_shutdown(c);
}

/*
 * Shuts the socket of the call's connection down under Kore: whatever is
 * in flight on it fails, and the connection is made again before its next
 * use (call_check_connection()).
 */
static void
call_shutdown(struct db_call *c)
{
	int		fd;

	fd = PQsocket(c->sql.conn->db);
	if (fd >= 0) {
		if (c->sql.flags & KORE_PGSQL_SCHEDULED)
			kore_platform_disable_read(fd);
		(void)shutdown(fd, SHUT_RDWR);
	}
	c->sql.flags &= ~KORE_PGSQL_SCHEDULED;
}

/*
 * A commit whose wait for the synchronous standby was cancelled (by a
 * cancel, a failover, a shutdown) has happened here and may not have on
 * the standby: a failover can lose it. PostgreSQL says so only in a
 * warning; such a call is never answered as a success. The server's
 * messages are matched in English, its default (lc_messages).
 */
static void
call_notice(void *arg, const PGresult *res)
{
	struct db_call		*c = arg;
	const char		*msg, *detail;

	msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	detail = PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL);

	if ((msg != NULL && strstr(msg, "synchronous replication") != NULL) ||
	    (detail != NULL && strstr(detail, "committed locally") != NULL)) {
		c->unconfirmed = 1;
		kore_log(LOG_NOTICE, "the commit was not confirmed by the "
		    "standby: %s", msg != NULL ? msg : detail);
	}
}

/*
 * The connection string with the session settings the design needs, on
 * every connection whatever the server's or the role's defaults: the
 * bounds of IDEM_DB_TIMEOUT_MS, READ COMMITTED, under which a write that
 * waited for a row lock (an upsert of a busy account, a FOR UPDATE) goes on
 * with the row's latest version (under REPEATABLE READ each such wait
 * would end in a serialization failure, and a busy account in 503s), and
 * idem.public_url, the base of the
 * type URLs of the problems the SQL saves (idem_problem()), so that they
 * are the C's (problem.c). Settings the operator gave in "options" come
 * first; these win.
 */
static char *
session_dsn(const char *url)
{
	PQconninfoOption	*opts, *o;
	struct kore_buf		buf;
	char			*err, settings_opts[512], *dsn;
	const char		*user;

	err = NULL;
	if ((opts = PQconninfoParse(url, &err)) == NULL) {
		fatal("IDEM_DATABASE_URL cannot be parsed: %s",
		    err != NULL ? err : "out of memory");
	}

	(void)snprintf(settings_opts, sizeof(settings_opts),
	    "-c statement_timeout=%u -c lock_timeout=%u "
	    "-c idle_in_transaction_session_timeout=%u "
	    "-c default_transaction_isolation=read\\ committed "
	    "-c idem.public_url=",
	    settings.db_timeout_ms, settings.db_timeout_ms,
	    settings.db_timeout_ms);

	kore_buf_init(&buf, 256);
	user = NULL;
	for (o = opts; o->keyword != NULL; o++) {
		if (o->val == NULL || *o->val == '\0')
			continue;
		if (!strcmp(o->keyword, "options")) {
			user = o->val;
			continue;
		}
		dsn_append(&buf, o->keyword, o->val);
	}

	if (user != NULL) {
		kore_buf_appendf(&buf, "options='");
		dsn_append(&buf, NULL, user);
		kore_buf_appendf(&buf, " ");
	} else {
		kore_buf_appendf(&buf, "options='");
	}
	dsn_append(&buf, NULL, settings_opts);
	options_append(&buf, settings.public_url);
	kore_buf_appendf(&buf, "'");

	PQconninfoFree(opts);
	dsn = kore_strdup(kore_buf_stringify(&buf, NULL));
	kore_buf_cleanup(&buf);

	return (dsn);
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

static void
call_notices_restore(struct db_call *c)
{
	if (c->sql.conn != NULL && c->notices != NULL)
		(void)PQsetNoticeReceiver(c->sql.conn->db, c->notices, NULL);
	c->notices = NULL;
}

static void
queue_join(struct db_call *c)
{
	if (c->queued)
		return;

	TAILQ_INSERT_TAIL(&queued, c, queue);
	c->queued = 1;
}

static void
queue_leave(struct db_call *c)
{
	if (!c->queued)
		return;

	TAILQ_REMOVE(&queued, c, queue);
	c->queued = 0;
}

/*
 * Room in a pool that Kore wakes nobody for: the oldest request queued
 * for that pool that still sleeps (one that Kore has woken already takes
 * the connection it was woken for) is woken to try again.
 */
static void
queue_wake(const char *dbname)
{
#if !defined(KORE_NO_HTTP)
	struct db_call		*q;

	TAILQ_FOREACH(q, &queued, queue) {
		/* cppcheck-suppress uninitvar */
		if (strcmp(q->dbname, dbname) || q->sql.req == NULL ||
		    !(q->sql.req->flags & HTTP_REQUEST_SLEEPING))
			continue;

		queue_leave(q);
		q->woken = 1;
		http_request_wakeup(q->sql.req);
		return;
	}
#endif
}

/*
 * A call woken by queue_wake() is still in Kore's queue, where Kore would
 * later wake it for a connection it no longer waits for: it leaves that
 * queue (kore_pgsql_cleanup() takes it out, and it holds nothing else)
 * before it tries again, and joins it anew if the pool is still full.
 */
static void
queue_requeue(struct db_call *c)
{
#if !defined(KORE_NO_HTTP)
	struct http_request	*req = c->sql.req;

	kore_pgsql_cleanup(&c->sql);
	kore_pgsql_init(&c->sql);
	queue_bind(c, req);
#endif
	c->woken = 0;
}

/*
 * A request's call, with a callback that tells when Kore wakes it from its
 * queue: Kore 4.1 calls it there (not when it drops a call whose request
 * is being freed), and after each event of the call's connection, which
 * this callback ignores: only a woken queued call has no connection and
 * nothing sent yet. Set beside the request, where kore_pgsql_bind_callback()
 * would refuse it.
 */
static void
queue_bind(struct db_call *c, struct http_request *req)
{
	kore_pgsql_bind_request(&c->sql, req);
	c->sql.cb = queue_woken;
	c->sql.arg = c;
}

static void
queue_woken(struct kore_pgsql *sql, void *arg)
{
	struct db_call		*c = arg;

	/* Queued, or woken by queue_wake() and still in Kore's queue. */
	if ((c->queued || c->woken) && sql->conn == NULL &&
	    sql->state == KORE_PGSQL_STATE_INIT)
		c->kore_woken = 1;
}
