/*
 * Recovery of abandoned payments: a payment still in_progress
 * IDEM_RECOVERY_AFTER_SECONDS after its lease ended (its worker died, or
 * its provider call failed, and the client never retried) is taken over as
 * a retry would take it, charged with the same derived key (the provider
 * answers with the charge it made, or makes it), and completed, so that a
 * later retry gets the real result and the ledger matches the provider.
 * An attempt that gets no outcome (the provider fails, or still processes
 * the key) puts the payment off: IDEM_RECOVERY_BACKOFF_SECONDS, doubled
 * after each such attempt, at most IDEM_RECOVERY_BACKOFF_MAX_SECONDS.
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include "auth.h"
#include "idem.h"
#include "jobs.h"
#include "metrics.h"
#include "payments.h"
#include "provider_answer.h"
#include "provider_client.h"
#include "settings.h"

#define RELEASE_SQL							\
	"SELECT released, attempts, wait_seconds FROM "			\
	"payment_recover_release($1, $2, $3::bigint, $4::int, $5::int)"

#define CLAIM_SQL							\
	"SELECT client_id, idem_key, lease_id, amount, currency, "	\
	"recipient FROM payment_recover_claim($1::int, $2::int, $3::int)"

struct recovery {
	char			client_id[AUTH_CLIENT_ID_MAX + 1];
	char			key[IDEM_KEY_MAX + 1];
	char			lease_id[24];
	char			amount[24];
	char			currency[4];
	char			recipient[IDEM_ID_MAX + 1];
	struct provider_call		call;
	int				calling;
	const struct provider_answer	*answer;
};

static int	recovery_claim(struct job *);
static int	recovery_take(struct job *);
static int	recovery_charge(struct job *);
static int	recovery_settle(struct job *);
static int	recovery_finish(struct job *);
static void	recovery_end(struct job *);

static const struct job_step	recovery_steps[] = {
	{ "claim an abandoned payment", recovery_claim },
	{ "take it", recovery_take },
	{ "charge with the derived key", recovery_charge },
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
	if (current.calling) {
		provider_call_cleanup(&current.call);
		current.calling = 0;
	}

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
	struct recovery		*r = &current;

	if (db_call_rows(&job->db) == 0)
		return (JOB_DONE);

	memset(r, 0, sizeof(*r));
	(void)kore_strlcpy(r->client_id, db_call_value(&job->db, 0),
	    sizeof(r->client_id));
	(void)kore_strlcpy(r->key, db_call_value(&job->db, 1), sizeof(r->key));
	(void)kore_strlcpy(r->lease_id, db_call_value(&job->db, 2),
	    sizeof(r->lease_id));
	(void)kore_strlcpy(r->amount, db_call_value(&job->db, 3),
	    sizeof(r->amount));
	(void)kore_strlcpy(r->currency, db_call_value(&job->db, 4),
	    sizeof(r->currency));
	(void)kore_strlcpy(r->recipient, db_call_value(&job->db, 5),
	    sizeof(r->recipient));
	job_db_reset(job);

	kore_log(LOG_NOTICE, "recovery: taking over abandoned payment %s:%s "
	    "with lease %s", r->client_id, r->key, r->lease_id);

	return (JOB_NEXT);
}

static int
recovery_charge(struct job *job)
{
	struct recovery		*r = &current;
	struct kore_buf		body;
	const char		*json;
	char			key[AUTH_CLIENT_ID_MAX + IDEM_KEY_MAX + 2];
	size_t			len;

	if (!r->calling) {
		payment_derived_key(key, sizeof(key), r->client_id, r->key);
		kore_buf_init(&body, 128);
		payment_provider_body(&body, r->amount, r->currency,
		    r->recipient);
		json = kore_buf_stringify(&body, &len);
		provider_call_start(&r->call, key, json, len);
		kore_buf_cleanup(&body);
		r->calling = 1;
	}

	if (!r->call.done)
		return (JOB_WAIT);

	r->answer = provider_answer_classify(&r->call);

	return (JOB_NEXT);
}

/*
 * A charge or a refusal is completed as a client's attempt would; any
 * other answer releases the payment and backs the job off it.
 */
static int
recovery_settle(struct job *job)
{
	struct recovery		*r = &current;
	struct payment_settle	s;
	char			base[16], cap[16];
	int			ret;

	payment_settle_init(&s, &r->call, r->answer, r->client_id, r->key,
	    r->lease_id);

	if (!provider_answer_saved(r->answer)) {
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
	payment_settle_cleanup(&s);

	return (ret);
}

static int
recovery_finish(struct job *job)
{
	struct recovery		*r = &current;

	if (provider_answer_saved(r->answer)) {
		if (!strcmp(db_call_value(&job->db, 0), "completed")) {
			metrics_count(COUNTER_PAYMENTS_RECOVERED, 1);
			kore_log(LOG_NOTICE, "recovery: payment %s:%s completed "
			    "with status %s", r->client_id, r->key,
			    db_call_value(&job->db, 1));
		} else {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "recovery: payment %s:%s was taken "
			    "over meanwhile (now %s); not written", r->client_id,
			    r->key, db_call_rows(&job->db) == 1 ?
			    db_call_value(&job->db, 3) : "gone");
		}
	} else if (!strcmp(db_call_value(&job->db, 0), "t")) {
		kore_log(LOG_NOTICE, "recovery: payment %s:%s not finished (%s); "
		    "attempt %s, the next in %s s", r->client_id, r->key,
		    r->call.detail, db_call_value(&job->db, 1),
		    db_call_value(&job->db, 2));
	} else {
		metrics_count(COUNTER_LEASE_FENCED, 1);
		kore_log(LOG_NOTICE, "recovery: payment %s:%s was taken over "
		    "meanwhile; not released", r->client_id, r->key);
	}

	provider_call_cleanup(&r->call);
	r->calling = 0;
	job_db_reset(job);

	/* The next abandoned payment, if any. */
	return (JOB_AGAIN);
}

/*
 * A round that stopped on a database error, or for a reload, leaves its
 * provider call behind: freed here, before the module's statics can go.
 */
static void
recovery_end(struct job *job)
{
	if (current.calling) {
		provider_call_cleanup(&current.call);
		current.calling = 0;
	}
}
