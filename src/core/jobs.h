/*
 * Background jobs of the API, run by worker 1 only: each is a table of
 * named steps, polled by one timer, started every interval.
 */

#ifndef __H_JOBS_H
#define __H_JOBS_H

#include <kore/kore.h>

#include "db.h"

/* What a step returns. */
#define JOB_WAIT	1	/* call again on the next poll */
#define JOB_NEXT	2	/* go on with the next step now; it reads job->db */
#define JOB_AGAIN	3	/* go back to the first step now */
#define JOB_DONE	4	/* finished until the next interval */

struct job;

struct job_step {
	const char	*name;
	int		(*run)(struct job *);
};

struct job {
	const char		*name;
	const struct job_step	*steps;
	size_t			nsteps;
	u_int64_t		interval_ms;
	void			(*end)(struct job *);

	/* What a round keeps between its polls, freed by end(). */
	void			*arg;

	size_t			step;
	int			running;
	u_int64_t		next_run;
	struct db_call		db;
	int			db_active;
};

void	jobs_start(void);
void	jobs_stop(void);
int	job_query(struct job *, const char *, int, const char **);
void	job_db_reset(struct job *);

extern struct job	cleanup_job;
extern struct job	recovery_job;
extern struct job	standby_job;
extern struct job	late_job;

#endif
