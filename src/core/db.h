/*
 * One asynchronous call of a SQL function on behalf of a request: take a
 * pooled connection, send the query with bound parameters, and keep its
 * single result row once PostgreSQL has committed.
 */

#ifndef __H_DB_H
#define __H_DB_H

#include <kore/kore.h>
#include <kore/http.h>
#include <kore/pgsql.h>

/* Requests, background jobs and health checks draw from separate pools. */
#define DB_NAME			"db"
#define DB_NAME_JOBS		"jobs"
#define DB_NAME_HEALTH		"health"

/* The jobs of a worker (cleanup, recovery, standby), each one call at once. */
#define DB_JOBS_CONN_MIN	3

/* The request connections a worker opens at start when the pool has no limit. */
#define DB_POOL_OPEN_UNLIMITED	16

#define DB_CALL_PENDING		1
#define DB_CALL_DONE		2
#define DB_CALL_FAILED		3

/*
 * How a failed call failed. All but DB_ERROR_QUERY are worth a retry with
 * the same key: nothing was committed, or what was is not confirmed and a
 * retry replays it or does it once.
 */
#define DB_ERROR_UNAVAILABLE	1	/* no connection, server going away */
#define DB_ERROR_QUERY		2	/* a fault in the query: a bug */
#define DB_ERROR_TIMEOUT	3	/* past IDEM_DB_TIMEOUT_MS */
#define DB_ERROR_CONFLICT	4	/* serialization failure, deadlock */
#define DB_ERROR_UNCONFIRMED	5	/* committed locally, not replicated */
#define DB_ERROR_READ_ONLY	6	/* reached a node that is not primary */

#define DB_PARAMS_MAX		12

/*
 * The detail of the 40001 tx_execute() raises when a concurrent first
 * attempt committed the key (sql/002_transactional.sql).
 */
#define DB_KEY_TAKEN		"idem:key-taken"

struct db_call {
	struct kore_pgsql	sql;
	const char		*dbname;
	PGresult		*result;
	int			phase;
	int			error;
	char			sqlstate[6];

	/* The bound on waiting for a connection, then for the answer. */
	u_int32_t		timeout_ms;
	struct kore_timer	*timer;
	int			timed_out;

	/*
	 * A statement rolled back by a conflict, kept while the rest of its
	 * answer is read (call_conflict()).
	 */
	PGresult		*failed;
	char			*failed_msg;
	int			key_taken;

	/* A warning that the commit was not confirmed by the standby. */
	int			unconfirmed;
	PQnoticeReceiver	notices;

	/*
	 * Queued for a pooled connection (db.c's own list, beside Kore's
	 * queue); woken from it by db.c (woken) or by Kore for a connection
	 * given back (kore_woken), and not yet run since.
	 */
	TAILQ_ENTRY(db_call)	queue;
	int			queued;
	int			woken;
	int			kore_woken;
};

void		db_register(void);
void		db_pool_open(const char *, u_int16_t);
void		db_call_init(struct db_call *, struct http_request *);
void		db_call_init_job(struct db_call *);
void		db_call_init_health(struct db_call *, struct http_request *);
void		db_call_cleanup(struct db_call *);
int		db_call_step(struct db_call *, const char *, int,
		    const char **);
const char	*db_call_value(struct db_call *, int);
int		db_call_length(struct db_call *, int);
int		db_call_null(struct db_call *, int);
const char	*db_call_field(struct db_call *, const char *);
int		db_call_field_length(struct db_call *, const char *);
int		db_call_rows(struct db_call *);

#endif
