/*
 * The driver of the background jobs. A job runs its steps in order; a step
 * that waits (for the database, for the provider) is polled again on the
 * next tick. Every instance of the API runs the jobs in its worker 1; the
 * SQL they call skips rows another instance has locked, so two instances
 * never work on the same row.
 */

#include <sys/types.h>

#include <kore/kore.h>

#include "jobs.h"
#include "reload.h"
#include "replay_cache.h"
#include "settings.h"

#define JOBS_POLL_MS		20

static void	jobs_tick(void *, u_int64_t);
static void	job_run(struct job *, u_int64_t);
static void	job_end(struct job *, u_int64_t);

static struct job		*jobs[] = {
	&cleanup_job, &recovery_job, &standby_job, &late_job
};

static struct kore_timer	*timer = NULL;

void
jobs_start(void)
{
	if (worker == NULL || worker->id != 1 || timer != NULL)
		return;

	cleanup_job.interval_ms =
	    (u_int64_t)settings.cleanup_interval_seconds * 1000;
	recovery_job.interval_ms =
	    (u_int64_t)settings.recovery_interval_seconds * 1000;
	standby_job.interval_ms = REPLAY_CACHE_STANDBY_MS;
	late_job.interval_ms =
	    (u_int64_t)settings.recovery_interval_seconds * 1000;

	/* A connection for each job: a job never waits for another. */
	db_pool_open(DB_POOL_JOBS, sizeof(jobs) / sizeof(jobs[0]));
	timer = kore_timer_add(jobs_tick, JOBS_POLL_MS, NULL, 0);
}

void
jobs_stop(void)
{
	if (timer != NULL) {
		kore_timer_remove(timer);
		timer = NULL;
	}
}

/*
 * The step's one database call; JOB_NEXT once its row is in job->db.
 */
int
job_query(struct job *job, const char *query, int nparams,
    const char **params)
{
	if (!job->db_active) {
		db_call_init_job(&job->db);
		job->db_active = 1;
	}

	switch (db_call_step(&job->db, query, nparams, params)) {
	case DB_CALL_PENDING:
		return (JOB_WAIT);
	case DB_CALL_FAILED:
		/* A pool that cannot connect says so itself (db.c). */
		if (!job->db.refused) {
			kore_log(LOG_NOTICE, "%s: database call failed; "
			    "retrying in %lu s", job->name,
			    (unsigned long)(job->interval_ms / 1000));
		}
		return (JOB_DONE);
	default:
		return (JOB_NEXT);
	}
}

void
job_db_reset(struct job *job)
{
	if (job->db_active) {
		db_call_cleanup(&job->db);
		job->db_active = 0;
	}
}

static void
jobs_tick(void *arg, u_int64_t now)
{
	size_t		i;

	for (i = 0; i < sizeof(jobs) / sizeof(jobs[0]); i++)
		job_run(jobs[i], now);
}

static void
job_run(struct job *job, u_int64_t now)
{
	int		r;

	if (!job->running) {
		if (now < job->next_run || reload_pending())
			return;
		/* A round holds the worker: a reload waits for its end. */
		reload_hold();
		job->running = 1;
		job->step = 0;
	}

	for (;;) {
		r = job->steps[job->step].run(job);
		switch (r) {
		case JOB_WAIT:
			return;
		case JOB_NEXT:
			/* The next step reads job->db, then resets it. */
			job->step++;
			if (job->step < job->nsteps)
				break;
			/* FALLTHROUGH */
		case JOB_AGAIN:
			job_db_reset(job);
			job->step = 0;
			/*
			 * A round holds the worker's reload: with one
			 * pending, it ends between two items, and the next
			 * round (of the new code) goes on at once.
			 */
			if (reload_pending()) {
				job_end(job, now);
				return;
			}
			break;
		case JOB_DONE:
			job_db_reset(job);
			job_end(job, now + job->interval_ms);
			return;
		default:
			fatal("%s: step %s returned %d", job->name,
			    job->steps[job->step].name, r);
		}
	}
}

/*
 * The end of a round: what the job keeps between its steps is freed (the
 * module's statics, which a reload drops), and the worker is released.
 */
static void
job_end(struct job *job, u_int64_t next)
{
	job->running = 0;
	job->next_run = next;

	if (job->end != NULL)
		job->end(job);

	reload_release();
}
