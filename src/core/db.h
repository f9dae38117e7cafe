/*
 * The service's PostgreSQL connections, owned by this module and driven by
 * Kore's event loop with libpq's asynchronous API: pools by purpose, one
 * FIFO wait queue per pool, and one asynchronous call of a SQL function
 * on behalf of a request or a job. Nothing here ever waits on the
 * database: a worker only waits in its event loop.
 */

#ifndef __H_DB_H
#define __H_DB_H

#include <sys/queue.h>

#include <kore/kore.h>
#include <kore/http.h>

#include <libpq-fe.h>

/*
 * The pools of a worker. Each has a fixed number of connections, made when
 * the pool is opened and made again whenever one is lost; no traffic can
 * make a worker hold more (docs/operations.md: The database layer).
 */
#define DB_POOL_REQUESTS	0	/* pgsql_conn_max (16 when 0) */
#define DB_POOL_HEALTH		1	/* 1: /healthz never waits behind work */
#define DB_POOL_AUTH		2	/* DB_AUTH_CONNS: bearer token lookups */
#define DB_POOL_JOBS		3	/* one per job, in worker 1 only */
#define DB_POOLS		4

#define DB_AUTH_CONNS		2

/* The request connections of a pool whose pgsql_conn_max is 0 (no limit). */
#define DB_REQUESTS_UNLIMITED	16

#define DB_CALL_PENDING		1
#define DB_CALL_DONE		2
#define DB_CALL_FAILED		3

/*
 * How a failed call failed. All but DB_ERROR_QUERY and
 * DB_ERROR_MISCONFIGURED are worth a retry with the same key: nothing was
 * committed, or what was is not confirmed and a retry replays it or does
 * it once.
 */
#define DB_ERROR_UNAVAILABLE	1	/* no connection, server going away */
#define DB_ERROR_QUERY		2	/* a fault in the query: a bug */
#define DB_ERROR_TIMEOUT	3	/* past IDEM_DB_TIMEOUT_MS */
#define DB_ERROR_CONFLICT	4	/* serialization failure, deadlock */
#define DB_ERROR_UNCONFIRMED	5	/* committed locally, not replicated */
#define DB_ERROR_READ_ONLY	6	/* reached a node that is not primary */
#define DB_ERROR_MISCONFIGURED	7	/* no such database, bad password, ... */

#define DB_PARAMS_MAX		12

/* Retry-After of a refusal an operator must fix (database-misconfigured). */
#define DB_MISCONFIGURED_RETRY	"30"

/* How much later than the server's own timeout the client gives up. */
#define DB_GRACE_MS		500

/* The timer that runs deadlines and makes connections. */
#define DB_TICK_MS		50

/*
 * /healthz answers within a second whatever the database does: its bound,
 * the grace, and two steps of the deadline timer.
 */
#define DB_HEALTH_TIMEOUT_MS	(1000 - DB_GRACE_MS - 2 * DB_TICK_MS)

/* The longest cause db_pool_cause() gives. */
#define DB_CAUSE_MAX		160

/*
 * The detail of the 40001 tx_execute() raises when a concurrent first
 * attempt committed the key (sql/002_transactional.sql).
 */
#define DB_KEY_TAKEN		"idem:key-taken"

struct db_conn;

struct db_call {
	int			pool;
	int			phase;
	struct http_request	*req;
	struct db_conn		*conn;

	/* Past it the call gives up (its answer: the grace after it). */
	u_int64_t		deadline;
	u_int32_t		timeout_ms;

	PGresult		*result;
	PGresult		*failed;
	char			*message;
	int			error;
	char			sqlstate[6];
	int			key_taken;

	/*
	 * Sent even when its client has left (a lease settle or release
	 * after the provider answered: the outcome must be saved).
	 */
	int			for_nobody;
	int			client_gone;
	int			refused;
	int			replans;
	int			sent;
	int			timed_out;
	int			unconfirmed;
	int			read_only;	/* the node takes no writes */

	TAILQ_ENTRY(db_call)	queue;
};

void		db_register(void);
void		db_url_check(void);
void		db_pool_open(int, u_int16_t);
void		db_unload(void);
int		db_pool_cause(int, char *, size_t);
void		db_call_init(struct db_call *, struct http_request *);
void		db_call_init_pool(struct db_call *, struct http_request *,
		    int, u_int32_t);
void		db_call_init_job(struct db_call *);
void		db_call_cleanup(struct db_call *);
void		db_call_move(struct db_call *, struct db_call *);
int		db_call_step(struct db_call *, const char *, int,
		    const char **);
const char	*db_call_value(struct db_call *, int);
int		db_call_length(struct db_call *, int);
int		db_call_null(struct db_call *, int);
int		db_call_boardable(struct db_call *);
int		db_call_answered(struct db_call *);
const char	*db_call_field(struct db_call *, const char *);
int		db_call_field_length(struct db_call *, const char *);
int		db_call_rows(struct db_call *);
const char	*db_call_cause(struct db_call *);

#endif
