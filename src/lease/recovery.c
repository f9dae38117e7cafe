/*
 * Recovery of abandoned keys of every lease operation: a key still
 * in_progress IDEM_RECOVERY_AFTER_SECONDS after its lease ended (its
 * worker died, or its provider call failed, and the client never retried)
 * is taken over as a retry would take it, sent to the provider again with
 * the same derived key (the provider answers with what it did, or does
 * it), and settled like a client's attempt, so that a later retry gets the
 * real result and the ledger matches the provider. An attempt without an
 * outcome backs the job off that key (doubling, capped).
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include "jobs.h"
#include "lease.h"
#include "metrics.h"
#include "settings.h"

#define CLAIM_SQL							\
	"SELECT client_id, idem_key, lease_id, operation, request FROM "	\
	"lease_recover_claim($1::int, $2::int, $3::int)"

#define RELEASE_SQL							\
	"SELECT released, attempts, wait_seconds FROM "			\
	"lease_recover_release($1, $2, $3::bigint, $4::int, $5::int)"

struct recovery {
	struct lease_attempt	attempt;
	struct kore_buf		request;
	int			active;
};

static int	recovery_claim(struct job *);
static int	recovery_take(struct job *);
static int	recovery_call(struct job *);
static int	recovery_settle(struct job *);
static int	recovery_finish(struct job *);
static void	recovery_reset(void);
static void	recovery_end(struct job *);

static const struct job_step	recovery_steps[] = {
	{ "claim an abandoned key", recovery_claim },
	{ "take it", recovery_take },
	{ "call the provider with the derived key", recovery_call },
	{ "complete or release", recovery_settle },
	{ "finish", recovery_finish },
};

struct job	recovery_job = {
	.name = "recovery",
	.steps = recovery_steps,
	.nsteps = sizeof(recovery_steps) / sizeof(recovery_steps[0]),
	.end = recovery_end,
};

static struct recovery	current;

static int
recovery_claim(struct job *job)
{
	const char	*params[3];
	char		after[16], lease[16], call[16];

	/* A round that stopped on a database error left its call behind. */
	recovery_reset();

	(void)snprintf(after, sizeof(after), "%u",
	    settings.recovery_after_seconds);
	(void)snprintf(lease, sizeof(lease), "%u", settings.lease_seconds);
	(void)snprintf(call, sizeof(call), "%u", settings.provider_timeout_ms);

	params[0] = after;
	params[1] = lease;
	params[2] = call;

	return (job_query(job, CLAIM_SQL, 3, params));
}

static int
recovery_take(struct job *job)
{
	struct recovery			*r = &current;
	const struct idem_operation	*op;
	const char			*name;

	if (db_call_rows(&job->db) == 0)
		return (JOB_DONE);

	name = db_call_field(&job->db, "operation");
	if ((op = lease_operation(name)) == NULL) {
		/* The SQL recovers only registered lease operations. */
		kore_log(LOG_ERR, "recovery: no lease operation '%s'", name);
		return (JOB_DONE);
	}

	memset(&r->attempt, 0, sizeof(r->attempt));
	lease_attempt_init(&r->attempt, op->call,
	    db_call_field(&job->db, "client_id"),
	    db_call_field(&job->db, "idem_key"),
	    db_call_field(&job->db, "lease_id"));
	kore_buf_init(&r->request, 256);
	kore_buf_append(&r->request, db_call_field(&job->db, "request"),
	    db_call_field_length(&job->db, "request"));
	r->active = 1;

	/* Before the reset: name points into the row. */
	kore_log(LOG_NOTICE, "recovery: taking over abandoned %s %s:%s with "
	    "lease %s", name, r->attempt.client_id, r->attempt.key,
	    r->attempt.lease_id);
	job_db_reset(job);

	return (JOB_NEXT);
}

static int
recovery_call(struct job *job)
{
	struct recovery		*r = &current;

	if (!lease_attempt_call(&r->attempt, (const char *)r->request.data,
	    r->request.offset, NULL))
		return (JOB_WAIT);

	return (JOB_NEXT);
}

/*
 * A success or a refusal is completed as a client's attempt would; any
 * other answer releases the key and backs the job off it.
 */
static int
recovery_settle(struct job *job)
{
	struct recovery		*r = &current;
	struct lease_settle	s;
	char			base[16], cap[16];
	int			ret;

	lease_settle_init(&s, &r->attempt);

	if (!provider_answer_saved(r->attempt.answer)) {
		(void)snprintf(base, sizeof(base), "%u",
		    settings.recovery_backoff_seconds);
		(void)snprintf(cap, sizeof(cap), "%u",
		    settings.recovery_backoff_max_seconds);
		s.params[3] = base;
		s.params[4] = cap;
		s.nparams = 5;
		s.sql = RELEASE_SQL;
	}

	ret = job_query(job, s.sql, s.nparams, s.params);
	lease_settle_cleanup(&s);

	return (ret);
}

static int
recovery_finish(struct job *job)
{
	struct lease_attempt	*a = &current.attempt;

	if (provider_answer_saved(a->answer)) {
		if (!strcmp(db_call_field(&job->db, "outcome"), "completed")) {
			metrics_count(COUNTER_PAYMENTS_RECOVERED, 1);
			kore_log(LOG_NOTICE, "recovery: %s:%s completed with "
			    "status %s", a->client_id, a->key,
			    db_call_field(&job->db, "status_code"));
		} else {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "recovery: %s:%s was taken over "
			    "meanwhile (now %s); not written", a->client_id,
			    a->key, db_call_rows(&job->db) == 1 ?
			    db_call_field(&job->db, "status") : "gone");
		}
	} else if (!strcmp(db_call_field(&job->db, "released"), "t")) {
		kore_log(LOG_NOTICE, "recovery: %s:%s not finished (%s); "
		    "attempt %s, the next in %s s", a->client_id, a->key,
		    a->pcall.detail, db_call_field(&job->db, "attempts"),
		    db_call_field(&job->db, "wait_seconds"));
	} else {
		metrics_count(COUNTER_LEASE_FENCED, 1);
		kore_log(LOG_NOTICE, "recovery: %s:%s was taken over "
		    "meanwhile; not released", a->client_id, a->key);
	}

	recovery_reset();
	job_db_reset(job);

	/* The next abandoned key, if any. */
	return (JOB_AGAIN);
}

static void
recovery_reset(void)
{
	struct recovery		*r = &current;

	if (!r->active)
		return;

	lease_attempt_cleanup(&r->attempt);
	kore_buf_cleanup(&r->request);
	r->active = 0;
}

/*
 * A round that stopped on a database error, or between items for a
 * reload, leaves its provider call behind: freed here, before the
 * module's statics can go.
 */
static void
recovery_end(struct job *job)
{
	recovery_reset();
}
