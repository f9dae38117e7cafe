/*
 * The transactional strategy: the key row and the business rows are
 * written in ONE PostgreSQL transaction, by one call of tx_execute() (see
 * sql/002_transactional.sql), which runs the operation's own SQL function,
 * registered under the operation's name, and writes the key with its
 * answer. A concurrent duplicate waits inside PostgreSQL on the key's
 * unique index; when the first commits, the duplicate's transaction is
 * rolled back (SQLSTATE 40001) and the call is run again here, which
 * replays the first one's saved response: no in_progress state, no lease,
 * no 409.
 *
 *   authenticate -> admit -> execute (tx_execute) -> respond
 *
 * An operation of this strategy is its table (name, fields) and its SQL
 * function; nothing of it is written here.
 */

#include <sys/types.h>

#include <stdlib.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "replay_cache.h"
#include "settings.h"
#include "transactional.h"

#define TX_RUN_SQL							\
	"SELECT outcome, status_code, response, age_ms, standby FROM "	\
	"tx_execute($1, $2, $3, $4, $5::jsonb)"

/*
 * Calls run again after a rollback for a conflict: a concurrent first
 * attempt took the key (the next call replays it), a deadlock or
 * serialization failure of the business writes, or a unique violation of
 * a business table that a concurrent duplicate wrote first (the next call
 * replays, or fails again if the violation is real). A call run again has
 * its own IDEM_DB_TIMEOUT_MS, as PostgreSQL's statement and lock timeouts
 * do: a shorter deadline here would shut the connection under a call the
 * server lets finish. It is run only while the request is within
 * IDEM_DB_TIMEOUT_MS of its start, but always after a taken key, whose run
 * replays at once.
 */
#define TX_CONFLICT_RETRIES	2

#define TX_STATE_EXECUTE	IDEM_STATE_STRATEGY
#define TX_STATE_RESPOND	(IDEM_STATE_STRATEGY + 1)

static int	tx_call(struct http_request *);
static int	tx_rerun(struct idem_request *);
static int	tx_respond(struct http_request *);

static struct http_state	tx_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(tx_call),
	KORE_HTTP_STATE(tx_respond),
};

int
transactional_run(struct http_request *req)
{
	return (http_state_run(tx_states,
	    sizeof(tx_states) / sizeof(tx_states[0]), req));
}

static int
tx_call(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[5];

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->op->name;
	params[3] = r->fingerprint;
	params[4] = (const char *)r->request.data;

	return (idem_execute_rerun(req, TX_STATE_RESPOND, TX_RUN_SQL, 5, params,
	    tx_rerun));
}

/*
 * Whether a failed call is run again: rolled back by a conflict, with
 * tries and time left. Nothing of it stayed.
 */
static int
tx_rerun(struct idem_request *r)
{
	u_int64_t	spent;

	if (r->conflict_retries >= TX_CONFLICT_RETRIES)
		return (0);

	if (r->db.error != DB_ERROR_CONFLICT && strcmp(r->db.sqlstate, "23505"))
		return (0);

	spent = kore_time_ms() - r->started;
	if (!r->db.key_taken && spent >= settings.db_timeout_ms)
		return (0);

	r->conflict_retries++;
	idem_db_reset(r);

	return (1);
}

/*
 * The key is done, in this transaction's commit or an earlier one: its
 * answer is kept for the retries this worker may get (replay_cache.c),
 * unless it was first used for another request.
 */
static int
tx_respond(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*age;

	if (strcmp(db_call_field(&r->db, "outcome"), "mismatch") &&
	    (age = db_call_field(&r->db, "age_ms")) != NULL) {
		replay_cache_put(r, (int)strtol(db_call_field(&r->db,
		    "status_code"), NULL, 10), db_call_field(&r->db,
		    "response"), (size_t)db_call_field_length(&r->db,
		    "response"), strtoull(age, NULL, 10),
		    !strcmp(db_call_field(&r->db, "standby"), "t"));
	}

	return (idem_respond_outcome(req));
}
