/*
 * Cleanup, shared by both strategies: every IDEM_CLEANUP_INTERVAL_SECONDS,
 * finished keys older than IDEM_RETENTION_SECONDS are deleted in batches of
 * IDEM_CLEANUP_BATCH, each its own short transaction. A retry after that is
 * a new operation.
 */

#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>

#include "jobs.h"
#include "metrics.h"
#include "settings.h"

#define CLEANUP_SQL	"SELECT idempotency_cleanup($1::int, $2::int)"

static int	cleanup_delete(struct job *);
static int	cleanup_count(struct job *);

static const struct job_step	cleanup_steps[] = {
	{ "delete a batch", cleanup_delete },
	{ "count it", cleanup_count },
};

struct job	cleanup_job = {
	.name = "cleanup",
	.steps = cleanup_steps,
	.nsteps = sizeof(cleanup_steps) / sizeof(cleanup_steps[0]),
};

static int
cleanup_delete(struct job *job)
{
	const char	*params[2];
	char		retention[16], batch[16];

	(void)snprintf(retention, sizeof(retention), "%u",
	    settings.retention_seconds);
	(void)snprintf(batch, sizeof(batch), "%u", settings.cleanup_batch);

	params[0] = retention;
	params[1] = batch;

	return (job_query(job, CLEANUP_SQL, 2, params));
}

static int
cleanup_count(struct job *job)
{
	long		deleted;

	deleted = strtol(db_call_value(&job->db, 0), NULL, 10);
	job_db_reset(job);

	if (deleted > 0) {
		metrics_count(COUNTER_CLEANUP_DELETED, (u_int64_t)deleted);
		kore_log(LOG_INFO, "cleanup: deleted %ld finished keys", deleted);
	}

	/* A full batch means there may be more. */
	return (deleted == (long)settings.cleanup_batch ? JOB_AGAIN : JOB_DONE);
}
