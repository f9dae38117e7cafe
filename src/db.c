/*
 * Asynchronous calls of SQL functions through Kore's pgsql layer.
 *
 * A call is done only when PostgreSQL has sent ReadyForQuery, that is when
 * the implicit transaction of the statement has committed: a row read
 * before that could still be rolled back, and a response built on it would
 * promise what the database does not hold.
 */

#include <sys/types.h>

#include <string.h>

#include "db.h"
#include "metrics.h"
#include "settings.h"

#define DB_PHASE_SETUP		0
#define DB_PHASE_WAIT		1
#define DB_PHASE_DONE		2
#define DB_PHASE_FAILED		3

static int	call_fail(struct db_call *);
static int	call_has(struct db_call *, int);
static void	call_release(struct db_call *);
static void	call_check_connection(struct db_call *);
static void	job_callback(struct kore_pgsql *, void *);

void
db_register(void)
{
	/* Registered again on a module reload, which is harmless. */
	(void)kore_pgsql_register(DB_NAME, settings.database_url);
	(void)kore_pgsql_register(DB_NAME_JOBS, settings.database_url);
}

void
db_call_init(struct db_call *c, struct http_request *req)
{
	memset(c, 0, sizeof(*c));
	c->dbname = DB_NAME;
	kore_pgsql_init(&c->sql);
	kore_pgsql_bind_request(&c->sql, req);
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
	kore_pgsql_init(&c->sql);
	kore_pgsql_bind_callback(&c->sql, job_callback, NULL);
}

void
db_call_cleanup(struct db_call *c)
{
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
	int		i, lengths[DB_PARAMS_MAX], formats[DB_PARAMS_MAX];

	if (nparams > DB_PARAMS_MAX)
		fatal("%s: %d parameters", __func__, nparams);

	for (;;) {
		switch (c->phase) {
		case DB_PHASE_SETUP:
			if (!kore_pgsql_setup(&c->sql, c->dbname,
			    KORE_PGSQL_ASYNC)) {
				/* Queued for a free connection: woken later. */
				if (c->sql.state == KORE_PGSQL_STATE_INIT)
					return (DB_CALL_PENDING);
				return (call_fail(c));
			}

			call_check_connection(c);

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
				return (DB_CALL_PENDING);
			case KORE_PGSQL_STATE_RESULT:
				if (c->result == NULL) {
					c->result = c->sql.result;
					c->sql.result = NULL;
				}
				kore_pgsql_continue(&c->sql);
				break;
			case KORE_PGSQL_STATE_ERROR:
				return (call_fail(c));
			case KORE_PGSQL_STATE_COMPLETE:
				if (c->result == NULL) {
					kore_log(LOG_ERR, "%s: no result row",
					    __func__);
					c->error = DB_ERROR_QUERY;
					c->phase = DB_PHASE_FAILED;
					return (DB_CALL_FAILED);
				}
				c->phase = DB_PHASE_DONE;
				return (DB_CALL_DONE);
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
 * Errors without an SQLSTATE (a refused connection, a dead backend, a full
 * pool) and the connection and shutdown classes mean the database cannot
 * serve now; anything else is a fault in the query.
 */
static int
call_fail(struct db_call *c)
{
	const char	*state;

	state = NULL;
	if (c->sql.result != NULL)
		state = PQresultErrorField(c->sql.result, PG_DIAG_SQLSTATE);

	if (state != NULL)
		(void)kore_strlcpy(c->sqlstate, state, sizeof(c->sqlstate));

	if (state == NULL || !strncmp(state, "08", 2) ||
	    !strncmp(state, "57P", 3) || !strncmp(state, "53", 2))
		c->error = DB_ERROR_UNAVAILABLE;
	else
		c->error = DB_ERROR_QUERY;

	kore_log(LOG_NOTICE, "database call failed (%s): %s",
	    state != NULL ? state : "no sqlstate",
	    c->sql.error != NULL ? c->sql.error : "unknown error");

	metrics_db_error();

	if (c->result != NULL) {
		PQclear(c->result);
		c->result = NULL;
	}

	call_release(c);
	c->phase = DB_PHASE_FAILED;

	return (DB_CALL_FAILED);
}

/*
 * Gives the connection back to Kore's pool. When libpq has already closed
 * the socket of a lost connection, Kore would ask epoll to forget fd -1 and
 * die of the error (and try to cancel the query on it); closing the socket
 * already took it out of epoll, so tell Kore the query is not scheduled.
 */
static void
call_release(struct db_call *c)
{
	if (c->sql.conn != NULL && PQsocket(c->sql.conn->db) < 0)
		c->sql.flags &= ~KORE_PGSQL_SCHEDULED;

	kore_pgsql_cleanup(&c->sql);
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

static void
job_callback(struct kore_pgsql *sql, void *arg)
{
	/* Jobs poll the state of their call; nothing to do here. */
}
