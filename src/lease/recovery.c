/*
 * Recovery of abandoned keys of every lease operation: a key still
 * in_progress IDEM_RECOVERY_AFTER_SECONDS after its lease ended (its
 * worker died, or its provider call failed, and the client never retried)
 * is claimed as a retry would take it and run through the same flow as a
 * client's attempt (lease.c): reconciled first if its last answer was
 * indeterminate, sent to the provider with its derived key (the provider
 * answers with what it did, or does it), and settled, so that a later
 * retry gets the real result and the ledger matches the provider. An
 * attempt without an outcome backs the job off that key (doubling,
 * capped). A key of an operation this build does not know is not claimed:
 * it is left to an instance that knows it.
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include "jobs.h"
#include "lease.h"
#include "metrics.h"
#include "settings.h"

static int	recovery_run(struct job *);
static void	recovery_report(struct lease_flow *);
static void	recovery_end(struct job *);

static const struct job_step	recovery_steps[] = {
	{ "run the lease flow for an abandoned key", recovery_run },
};

struct job	recovery_job = {
	.name = "recovery",
	.steps = recovery_steps,
	.nsteps = sizeof(recovery_steps) / sizeof(recovery_steps[0]),
	.end = recovery_end,
};

/*
 * One abandoned key per run, from claim to settle or release; the round
 * goes on with the next key until none is due.
 */
static int
recovery_run(struct job *job)
{
	struct lease_flow	*f = job->arg;
	int			end;

	if (f == NULL) {
		f = kore_calloc(1, sizeof(*f));
		lease_flow_init(f, LEASE_CLAIM, NULL, &job->db,
		    &job->db_active);
		job->arg = f;
	}

	switch (lease_flow_run(f)) {
	case LEASE_WAIT:
		return (JOB_WAIT);
	case LEASE_FAILED:
		if (!job->db.refused) {
			kore_log(LOG_NOTICE, "recovery: database call failed "
			    "in '%s'; retrying in %lu s",
			    lease_state_name(f->state),
			    (unsigned long)(job->interval_ms / 1000));
		}
		return (JOB_DONE);
	default:
		break;
	}

	recovery_report(f);
	end = f->end;
	recovery_end(job);

	/* The next abandoned key, if any. */
	return (end == LEASE_END_NOTHING ? JOB_DONE : JOB_AGAIN);
}

static void
recovery_report(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;

	switch (f->end) {
	case LEASE_END_SETTLED:
		if (db_call_rows(f->db) == 1 &&
		    !strcmp(db_call_field(f->db, "outcome"), "completed")) {
			metrics_count(COUNTER_PAYMENTS_RECOVERED, 1);
			kore_log(LOG_NOTICE, "recovery: %s:%s completed with "
			    "status %s", a->client_id, a->key,
			    db_call_field(f->db, "status_code"));
		} else {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "recovery: %s:%s was taken over "
			    "meanwhile (now %s); not written", a->client_id,
			    a->key, db_call_rows(f->db) == 1 ?
			    db_call_field(f->db, "status") : "gone");
		}
		break;
	case LEASE_END_RELEASED:
		if (!strcmp(db_call_field(f->db, "released"), "t")) {
			kore_log(LOG_NOTICE, "recovery: %s:%s not finished "
			    "(%s); attempt %s, the next in %s s", a->client_id,
			    a->key, a->answer->what,
			    db_call_field(f->db, "attempts"),
			    db_call_field(f->db, "wait_seconds"));
		} else {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "recovery: %s:%s was taken over "
			    "meanwhile; not released", a->client_id, a->key);
		}
		break;
	case LEASE_END_FENCED:
		metrics_count(COUNTER_LEASE_FENCED, 1);
		kore_log(LOG_NOTICE, "recovery: %s:%s was taken over before "
		    "its next generation", a->client_id, a->key);
		break;
	default:
		break;
	}
}

/*
 * The end of a key, or of a round that stopped on a database error or for
 * a reload: the flow's provider call and buffers are freed here.
 */
static void
recovery_end(struct job *job)
{
	struct lease_flow	*f = job->arg;

	if (f == NULL)
		return;

	lease_flow_cleanup(f);
	kore_free(f);
	job->arg = NULL;
}
