/*
 * Late operations (issue 28, item 6): an operation the provider made for
 * a key that is not the key's settled outcome. A charge sent under a
 * generation the key later gave up can still appear at the provider after
 * the listing that gave it up (a provider's list proves nothing about the
 * next minutes); a key may also be finished by a refusal, or by another
 * attempt's operation, while this attempt's was made.
 *
 * Found by any listing of the key's generations (lease.c: listed() reads
 * the whole page; a success that is not the outcome is late), by a fenced
 * settle of a success the key did not save (lease.c: late_settled()), and
 * by the late scan below, which lists each key that went past its first
 * generation once more, IDEM_LATE_SCAN_AFTER_SECONDS after it was
 * finished. Each is recorded once, by its provider id, in late_operations
 * (sql/042_late_operations.sql: late_operation_record(), which never
 * touches the key's saved outcome), logged at error and counted in
 * idem_late_operations_total when first recorded. docs/operations.md, "A
 * late charge", is the runbook.
 */

#include <sys/types.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <kore/kore.h>

#include "jobs.h"
#include "lease.h"
#include "metrics.h"
#include "reload.h"
#include "settings.h"

#define LATE_RECORD_SQL							\
	"SELECT recorded, settled_id, key_status FROM "			\
	"late_operation_record($1, $2, $3, $4, $5::int, $6, $7::bigint, $8)"

#define LATE_CLAIM_SQL							\
	"SELECT client_id, idem_key, operation, request, generation, "	\
	"taken_at, settled_id FROM late_scan_claim($1::int, $2::text[])"

/* How often the records in flight are polled (a job's poll, jobs.c). */
#define LATE_POLL_MS		20

/* One late operation on its way to late_operations. */
struct late_record {
	char			client_id[AUTH_CLIENT_ID_MAX + 1];
	char			key[IDEM_KEY_MAX + 1];
	char			operation[64];
	char			provider_key[LEASE_PROVIDER_KEY_MAX];
	char			id[PROVIDER_ID_MAX + 1];
	char			generation[16];
	char			amount[32];
	const char		*noun;
	const char		*found_by;
	struct db_call		db;
	int			db_active;
	TAILQ_ENTRY(late_record) list;
};

TAILQ_HEAD(late_list, late_record);

static void	late_tick(void *, u_int64_t);
static int	late_record_step(struct late_record *);
static int	late_scan_run(struct job *);
static int	late_scan_start(struct job *);
static void	late_scan_end(struct job *);

static struct late_list		records = TAILQ_HEAD_INITIALIZER(records);
static struct kore_timer	*timer = NULL;

static const struct job_step	late_steps[] = {
	{ "list a finished key's generations once more", late_scan_run },
};

struct job	late_job = {
	.name = "late scan",
	.steps = late_steps,
	.nsteps = sizeof(late_steps) / sizeof(late_steps[0]),
	.end = late_scan_end,
};

/*
 * A late operation seen for the flow's key: provider key and generation
 * it was made under, its provider id, its amount if known, and what
 * found it (reconcile, settle, scan). Recorded in the background, on a
 * connection of the request pool; the worker's reload waits for it.
 */
void
lease_late_found(const struct lease_flow *f, const char *provider_key,
    u_int32_t generation, const char *id, const int64_t *amount,
    const char *found_by)
{
	const struct lease_attempt	*a = &f->attempt;
	struct late_record		*r;

	r = kore_calloc(1, sizeof(*r));
	(void)kore_strlcpy(r->client_id, a->client_id, sizeof(r->client_id));
	(void)kore_strlcpy(r->key, a->key, sizeof(r->key));
	(void)kore_strlcpy(r->operation, f->operation, sizeof(r->operation));
	(void)kore_strlcpy(r->provider_key, provider_key,
	    sizeof(r->provider_key));
	(void)kore_strlcpy(r->id, id, sizeof(r->id));
	(void)snprintf(r->generation, sizeof(r->generation), "%u", generation);
	if (amount != NULL) {
		(void)snprintf(r->amount, sizeof(r->amount), "%" PRId64,
		    *amount);
	}
	r->noun = a->call->noun;
	r->found_by = found_by;

	reload_hold();
	TAILQ_INSERT_TAIL(&records, r, list);
	if (timer == NULL) {
		timer = kore_timer_add(late_tick, 0, NULL,
		    KORE_TIMER_ONESHOT);
	}
}

static void
late_tick(void *arg, u_int64_t now)
{
	struct late_record	*r, *next;

	/* Kore frees a one-shot timer after this callback. */
	timer = NULL;

	for (r = TAILQ_FIRST(&records); r != NULL; r = next) {
		next = TAILQ_NEXT(r, list);
		if (!late_record_step(r))
			continue;

		TAILQ_REMOVE(&records, r, list);
		if (r->db_active)
			db_call_cleanup(&r->db);
		kore_free(r);
		reload_release();
	}

	if (!TAILQ_EMPTY(&records)) {
		timer = kore_timer_add(late_tick, LATE_POLL_MS, NULL,
		    KORE_TIMER_ONESHOT);
	}
}

/* True once the record is written, found recorded before, or failed. */
static int
late_record_step(struct late_record *r)
{
	const char	*params[8];
	const char	*settled;

	if (!r->db_active) {
		db_call_init(&r->db, NULL);
		r->db_active = 1;
	}

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->operation;
	params[3] = r->provider_key;
	params[4] = r->generation;
	params[5] = r->id;
	params[6] = r->amount[0] != '\0' ? r->amount : NULL;
	params[7] = r->found_by;

	switch (db_call_step(&r->db, LATE_RECORD_SQL, 8, params)) {
	case DB_CALL_PENDING:
		return (0);
	case DB_CALL_FAILED:
		/* Not recorded: the log line is all there is of it. */
		metrics_count(COUNTER_LATE_OPERATIONS, 1);
		kore_log(LOG_ERR, "late operation: the provider made %s (a "
		    "%s) for %s:%s under %s (generation %s, found by %s), "
		    "which is not the key's outcome; NOT recorded in "
		    "late_operations (the database call failed): see "
		    "docs/operations.md, A late charge", r->id, r->noun,
		    r->client_id, r->key, r->provider_key, r->generation,
		    r->found_by);
		return (1);
	default:
		break;
	}

	if (db_call_rows(&r->db) != 1 ||
	    strcmp(db_call_field(&r->db, "recorded"), "t"))
		return (1);

	settled = db_call_field(&r->db, "settled_id");
	metrics_count(COUNTER_LATE_OPERATIONS, 1);
	kore_log(LOG_ERR, "late operation: the provider made %s (a %s) for "
	    "%s:%s under %s (generation %s, amount %s, found by %s); the key "
	    "(%s) saved %s%s; recorded in late_operations: refund it or book "
	    "it (docs/operations.md, A late charge)", r->id, r->noun,
	    r->client_id, r->key, r->provider_key, r->generation,
	    r->amount[0] != '\0' ? r->amount : "unknown", r->found_by,
	    db_call_field(&r->db, "key_status"),
	    *settled != '\0' ? "the operation " : "no operation",
	    settled);

	return (1);
}

/*
 * The late scan: one queued finished key per run, listed to its last
 * page; the round goes on with the next key until none is due.
 */
static int
late_scan_run(struct job *job)
{
	struct lease_flow	*f;
	int			ret;

	if (job->arg == NULL && (ret = late_scan_start(job)) != JOB_NEXT)
		return (ret);

	f = job->arg;
	switch (lease_late_list(f)) {
	case LEASE_WAIT:
	case LEASE_NEXT:
		return (JOB_WAIT);
	case LEASE_FAILED:
		kore_log(LOG_ERR, "late scan: could not list the provider's "
		    "%ss of %s:%s (generations 1 to %u): %s; list it with "
		    "scripts/idemctl key", f->attempt.call->noun,
		    f->attempt.client_id, f->attempt.key, f->attempt.generation,
		    f->attempt.pcall.log);
		break;
	default:
		kore_log(LOG_NOTICE, "late scan: listed %s:%s (generations 1 "
		    "to %u)", f->attempt.client_id, f->attempt.key,
		    f->attempt.generation);
		break;
	}

	late_scan_end(job);
	return (JOB_AGAIN);
}

/*
 * Takes the next key off the queue: JOB_NEXT with its flow in job->arg,
 * JOB_DONE when none is due, JOB_WAIT while the database answers.
 */
static int
late_scan_start(struct job *job)
{
	const struct idem_operation	*op;
	struct lease_flow		*f;
	struct kore_buf			ops;
	const char			*params[2], *name;
	char				after[16];
	size_t				i;
	int				ret;

	(void)snprintf(after, sizeof(after), "%u",
	    settings.late_scan_after_seconds);

	/* The lease operations of this build: a key of another is not its. */
	kore_buf_init(&ops, 128);
	kore_buf_append(&ops, "{", 1);
	for (i = 0; i < idem_nroutes; i++) {
		if (idem_routes[i].op->call == NULL)
			continue;
		kore_buf_appendf(&ops, "%s%s", ops.offset > 1 ? "," : "",
		    idem_routes[i].op->name);
	}
	kore_buf_append(&ops, "}", 1);

	params[0] = after;
	params[1] = kore_buf_stringify(&ops, NULL);
	ret = job_query(job, LATE_CLAIM_SQL, 2, params);
	kore_buf_cleanup(&ops);
	if (ret != JOB_NEXT)
		return (ret);

	if (db_call_rows(&job->db) == 0)
		return (JOB_DONE);

	name = db_call_field(&job->db, "operation");
	if ((op = lease_operation(name)) == NULL)
		fatal("late scan took %s:%s of '%s', which this build does "
		    "not run", db_call_field(&job->db, "client_id"),
		    db_call_field(&job->db, "idem_key"), name);

	f = kore_calloc(1, sizeof(*f));
	lease_flow_init(f, LEASE_RECONCILE, NULL, &job->db, &job->db_active);
	f->op = op;
	f->late_scan = 1;
	(void)kore_strlcpy(f->operation, name, sizeof(f->operation));
	(void)kore_strlcpy(f->settled, db_call_field(&job->db, "settled_id"),
	    sizeof(f->settled));
	lease_attempt_init(&f->attempt, op->call, name,
	    db_call_field(&job->db, "client_id"),
	    db_call_field(&job->db, "idem_key"), "0",
	    (u_int32_t)strtoul(db_call_field(&job->db, "generation"), NULL,
	    10));
	f->taken_at = (int64_t)strtod(db_call_field(&job->db, "taken_at"),
	    NULL);
	/*
	 * Up to now: a late operation is listed after the key's last answer
	 * (Stripe's list by time asks created[lte] of the window's end).
	 */
	f->reconcile_until = 0;
	f->window_end = (int64_t)time(NULL) + LEASE_CLOCK_SLACK;
	kore_buf_append(&f->request, db_call_field(&job->db, "request"),
	    db_call_field_length(&job->db, "request"));
	job->arg = f;
	job_db_reset(job);

	return (JOB_NEXT);
}

/*
 * The end of a key, or of a round that stopped for a reload: the flow's
 * provider call and buffers are freed here.
 */
static void
late_scan_end(struct job *job)
{
	struct lease_flow	*f = job->arg;

	if (f == NULL)
		return;

	lease_flow_cleanup(f);
	kore_free(f);
	job->arg = NULL;
}
