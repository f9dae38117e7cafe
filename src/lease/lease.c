/*
 * The lease strategy, for an operation outside this database (a charge, a
 * refund at a payment provider). The key is taken first, as an
 * in_progress row with a lease and a fencing token; the provider is called
 * with a key derived from the client's; the outcome is saved only while
 * the lease is still this attempt's. SQL: sql/003_lease.sql.
 *
 * One flow of named states, run by a client's request and by the recovery
 * job alike (lease_states below; a new step is one row):
 *
 *   reserve (a request) | claim (the job)
 *     -> decide -> [reconcile -> generation] -> call
 *     -> settle (complete) | release
 *
 * reconcile runs when the key's last answer was indeterminate (a 5xx the
 * provider keeps under the key and replays, as Stripe does): the provider
 * is asked whether an operation of the key exists, matched on the derived
 * key it was sent as metadata; if one does, it is the outcome (settle); if
 * none does, the key moves to the next generation of its derived key
 * (<client>~<n>:<key>, provider_key()) under the lease, and that is sent.
 * What each provider answer does is its provider's table (provider.c). No
 * database connection or transaction is held during a provider call.
 */

#include <sys/types.h>

#include <openssl/rand.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "lease.h"
#include "metrics.h"
#include "problem.h"
#include "replay_cache.h"
#include "settings.h"

#define LEASE_RESERVE_SQL						\
	"SELECT outcome, lease_id, status_code, response, retry_after, "	\
	"request, generation, reconcile, taken_at, reconcile_until, "	\
	"age_ms, standby, settling, generation_age FROM "		\
	"lease_reserve_v2($1, $2, $3, $4, $5::jsonb, $6::int, $7::int)"

#define LEASE_CLAIM_SQL							\
	"SELECT client_id, idem_key, lease_id, operation, request, "	\
	"generation, reconcile, taken_at, reconcile_until, generation_age "	\
	"FROM lease_recover_claim_v2($1::int, $2::int, $3::int, $4::text[])"

#define LEASE_GENERATION_SQL						\
	"SELECT lease_generation($1, $2, $3::bigint, $4::int, $5::int, "	\
	"$6::int, $7::int) AS generation"

#define LEASE_COMPLETE_SQL						\
	"SELECT outcome, status_code, response, status FROM "		\
	"lease_complete($1, $2, $3::bigint, $4, $5::int, $6)"

#define LEASE_RELEASE_SQL						\
	"SELECT released, attempts, wait_seconds FROM lease_release($1, "	\
	"$2, $3::bigint, $4::boolean, $5::int, $6::int, $7::int)"

#define LEASE_NOW_SQL							\
	"SELECT outcome, status_code, response, status FROM lease_now($1, "	\
	"$2)"

#define LEASE_CURSOR_SQL						\
	"SELECT after, window_end FROM lease_reconcile_cursor($1, $2, "	\
	"$3::bigint, $4::int)"

#define LEASE_CURSOR_SAVE_SQL						\
	"SELECT lease_reconcile_save($1, $2, $3::bigint, $4::int, $5, "	\
	"$6::bigint) AS saved"

/*
 * A reconciliation reads at most this many pages of 100 of a list per
 * attempt; the next attempt goes on from where it stopped.
 */
#define RECONCILE_PAGES_MAX	100

/*
 * A listing by creation time starts this long before the key was taken:
 * the provider's clock is not ours.
 */
#define RECONCILE_CLOCK_SLACK	LEASE_CLOCK_SLACK

/* What a list said. */
#define LISTED_NONE		1
#define LISTED_FOUND		2
#define LISTED_PENDING		3
#define LISTED_MORE		4
#define LISTED_FAILED		5

/* The request path's states (http_state_run). */
#define LEASE_STATE_FLOW	IDEM_STATE_STRATEGY
#define LEASE_STATE_RESPOND	(IDEM_STATE_STRATEGY + 1)

struct lease_state {
	const char	*name;
	int		(*run)(struct lease_flow *);
};

static int	flow_reserve(struct lease_flow *);
static int	flow_claim(struct lease_flow *);
static int	flow_decide(struct lease_flow *);
static int	flow_reconcile(struct lease_flow *);
static int	flow_generation(struct lease_flow *);
static int	flow_call(struct lease_flow *);
static int	flow_settle(struct lease_flow *);
static int	flow_release(struct lease_flow *);
static int	flow_now(struct lease_flow *);
static int	flow_query(struct lease_flow *, const char *, int,
		    const char **);
static void	flow_db_reset(struct lease_flow *);
static int	listed(struct lease_flow *);
static int	reconcile_stop(struct lease_flow *, int);
static void	list_path(struct kore_buf *, struct lease_flow *);
static int	generation_of(const struct lease_attempt *, const char *,
		    size_t, struct json_value *);
static int	generation_parse(const char *, size_t, u_int64_t *);
static int	key_fits(const struct lease_attempt *);
static void	late_listed(struct lease_flow *, struct json_value *,
		    struct json_value *, struct json_value *);
static void	late_settled(struct lease_flow *);

static int	lease_flow_step(struct http_request *);
static int	lease_respond(struct http_request *);
static int	lease_respond_answered(struct http_request *);
static int	lease_respond_released(struct http_request *);
static int	lease_respond_unsaved(struct http_request *);
static int	lease_respond_fenced(struct http_request *);
static void	lease_request_free(struct idem_request *);
static void	provider_key(const struct lease_attempt *, u_int32_t, char *,
		    size_t);

static const struct lease_state	lease_states[LEASE_STATES] = {
	[LEASE_RESERVE] = { "reserve: take the key", flow_reserve },
	[LEASE_CLAIM] = { "claim an abandoned key", flow_claim },
	[LEASE_DECIDE] = { "decide from the key's row", flow_decide },
	[LEASE_RECONCILE] = { "reconcile: ask the provider whether the "
	    "operation exists", flow_reconcile },
	[LEASE_GENERATION] = { "take the next generation of the derived key",
	    flow_generation },
	[LEASE_CALL] = { "call the provider", flow_call },
	[LEASE_SETTLE] = { "settle: save the outcome", flow_settle },
	[LEASE_RELEASE] = { "release the lease", flow_release },
	[LEASE_NOW] = { "fenced: read what the key holds now", flow_now },
};

static struct http_state	lease_http_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(lease_flow_step),
	KORE_HTTP_STATE(lease_respond),
};

int
lease_run(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (r->lease == NULL) {
		r->lease = kore_calloc(1, sizeof(*r->lease));
		r->strategy_free = lease_request_free;
	}

	return (http_state_run(lease_http_states,
	    sizeof(lease_http_states) / sizeof(lease_http_states[0]), req));
}

/*
 * The operation's problem for a refusal of the provider: the provider's
 * table names a payment's (card-declined, payment-rejected), which an
 * operation maps to its own.
 */
int
lease_problem(const struct lease_attempt *a)
{
	switch (a->answer->problem) {
	case PROBLEM_CARD_DECLINED:
		return (a->call->declined);
	case PROBLEM_PAYMENT_REJECTED:
		return (a->call->rejected);
	default:
		return (a->answer->problem);
	}
}

const char *
lease_state_name(int state)
{
	return (lease_states[state].name);
}

/*
 * A flow starting at state (LEASE_RESERVE for a request, LEASE_CLAIM for
 * the job), with the database call it runs its statements on.
 */
void
lease_flow_init(struct lease_flow *f, int state, struct http_request *req,
    struct db_call *db, int *db_active)
{
	memset(f, 0, sizeof(*f));
	f->state = state;
	f->req = req;
	f->db = db;
	f->db_active = db_active;
	kore_buf_init(&f->request, 256);
}

/*
 * Runs the flow's states until one waits or the flow ends. A state
 * returns LEASE_NEXT once it moved f->state.
 */
int
lease_flow_run(struct lease_flow *f)
{
	int		ret;

	for (;;) {
		if (f->state < 0 || f->state >= LEASE_STATES)
			fatal("%s: no state %d", __func__, f->state);
		ret = lease_states[f->state].run(f);
		if (ret != LEASE_NEXT)
			return (ret);
	}
}

void
lease_flow_cleanup(struct lease_flow *f)
{
	lease_attempt_cleanup(&f->attempt);
	kore_buf_cleanup(&f->request);
}

void
lease_attempt_init(struct lease_attempt *a, const struct lease_call *call,
    const char *operation, const char *client, const char *key,
    const char *lease, u_int32_t generation)
{
	a->call = call;
	if (call->provider_op != NULL)
		operation = call->provider_op;
	if ((a->op = provider_op(operation)) == NULL)
		fatal("%s: provider %s has no call for %s", __func__,
		    provider->kind, operation);
	(void)kore_strlcpy(a->client_id, client, sizeof(a->client_id));
	(void)kore_strlcpy(a->key, key, sizeof(a->key));
	(void)kore_strlcpy(a->lease_id, lease, sizeof(a->lease_id));
	a->generation = generation > 0 ? generation : 1;
}

/*
 * Calls the provider with the saved request as the provider takes it;
 * true once the answer is in and classified. A request sleeps until
 * then, a job polls.
 */
int
lease_attempt_call(struct lease_attempt *a, const char *request,
    size_t len, struct http_request *req)
{
	struct json_value	*v;
	struct kore_buf		body;
	char			err[JSON_ERROR_LEN];

	if (!a->calling) {
		provider_key(a, a->generation, a->provider_key,
		    sizeof(a->provider_key));
		v = json_parse((const u_int8_t *)request, len, err,
		    sizeof(err));
		kore_buf_init(&body, 256);
		provider_body(&body, a->op, v, a->provider_key, a->client_id,
		    a->generation);
		json_free(v);
		a->pcall.req = req;
		provider_call_start(&a->pcall, a->op->path, a->provider_key,
		    (const char *)body.data, body.offset);
		kore_buf_cleanup(&body);
		a->calling = 1;
	}

	if (!a->pcall.done)
		return (0);

	a->answer = provider_answer_classify(provider, &a->pcall, a->op->id,
	    a->call->noun);
	if (provider_answer_logged_error(a->answer)) {
		kore_log(LOG_ERR, "provider %s: %s for %s:%s (key %s): status "
		    "%ld, %s", provider->kind, a->answer->what, a->client_id,
		    a->key, a->provider_key, a->pcall.status, a->pcall.log);
	} else if (!provider_answer_saved(a->answer)) {
		kore_log(LOG_NOTICE, "provider call for %s:%s (key %s) not "
		    "finished: %s (%s%s%s)", a->client_id, a->key,
		    a->provider_key, a->pcall.detail, a->answer->what,
		    a->pcall.log[0] ? ": " : "", a->pcall.log);
	}

	return (1);
}

void
lease_attempt_cleanup(struct lease_attempt *a)
{
	if (a->calling) {
		provider_call_cleanup(&a->pcall);
		a->calling = 0;
	}
}

/*
 * The lease operation of a key's operation name (the recovery job finds
 * what to call for a key it claims).
 */
const struct idem_operation *
lease_operation(const char *name)
{
	size_t		i;

	for (i = 0; i < idem_nroutes; i++) {
		if (idem_routes[i].op->call != NULL &&
		    !strcmp(idem_routes[i].op->name, name))
			return (idem_routes[i].op);
	}

	return (NULL);
}

/* reserve: a client's request takes the key (or is answered from it). */
static int
flow_reserve(struct lease_flow *f)
{
	struct idem_request	*r = http_state_get(f->req);
	const char		*params[7];
	char			lease[16], call[16];
	int			ret;

	(void)snprintf(lease, sizeof(lease), "%u", settings.lease_seconds);
	(void)snprintf(call, sizeof(call), "%u", settings.provider_timeout_ms);

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->op->name;
	params[3] = r->fingerprint;
	params[4] = (const char *)r->request.data;
	params[5] = lease;
	params[6] = call;

	f->op = r->op;
	(void)kore_strlcpy(f->operation, r->op->name, sizeof(f->operation));
	if (f->stmt_started == 0)
		f->stmt_started = kore_time_ms();

	if ((ret = flow_query(f, LEASE_RESERVE_SQL, 7, params)) != LEASE_NEXT)
		return (ret);

	f->state = LEASE_DECIDE;
	return (LEASE_NEXT);
}

/* claim: the recovery job takes the abandoned key due longest. */
static int
flow_claim(struct lease_flow *f)
{
	struct kore_buf	ops;
	const char	*params[4];
	char		after[16], lease[16], call[16];
	size_t		i;
	int		ret;

	(void)snprintf(after, sizeof(after), "%u",
	    settings.recovery_after_seconds);
	(void)snprintf(lease, sizeof(lease), "%u", settings.lease_seconds);
	(void)snprintf(call, sizeof(call), "%u", settings.provider_timeout_ms);

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
	params[1] = lease;
	params[2] = call;
	params[3] = kore_buf_stringify(&ops, NULL);
	if (f->stmt_started == 0)
		f->stmt_started = kore_time_ms();

	ret = flow_query(f, LEASE_CLAIM_SQL, 4, params);
	kore_buf_cleanup(&ops);
	if (ret != LEASE_NEXT)
		return (ret);

	f->state = LEASE_DECIDE;
	return (LEASE_NEXT);
}

/*
 * decide: what the row says. A request's key that is not this attempt's
 * to run (replayed, in flight, a mismatch, refused by the admit) ends the
 * flow with the row for lease_respond(); a taken key goes on to the
 * provider, or to its reconciliation first.
 */
static int
flow_decide(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	struct idem_request	*r;
	const char		*outcome, *name, *client, *key;
	u_int32_t		stale;

	if (db_call_rows(f->db) == 0) {
		f->end = f->req != NULL ? LEASE_END_ANSWERED :
		    LEASE_END_NOTHING;
		return (LEASE_DONE);
	}

	outcome = "claimed";
	if (f->req != NULL) {
		outcome = db_call_field(f->db, "outcome");
		if (strcmp(outcome, "reserved") &&
		    strcmp(outcome, "taken_over")) {
			f->end = LEASE_END_ANSWERED;
			return (LEASE_DONE);
		}
		r = http_state_get(f->req);
		client = r->client_id;
		key = r->key;
	} else {
		name = db_call_field(f->db, "operation");
		(void)kore_strlcpy(f->operation, name, sizeof(f->operation));
		client = db_call_field(f->db, "client_id");
		key = db_call_field(f->db, "idem_key");
		f->op = lease_operation(name);
	}

	/* lease_recover_claim_v2() returns only this build's lease operations. */
	if (f->op == NULL)
		fatal("recovery claimed %s:%s of '%s', which this build does not "
		    "run", client, key, f->operation);

	lease_attempt_init(a, f->op->call, f->operation, client, key,
	    db_call_field(f->db, "lease_id"),
	    (u_int32_t)strtoul(db_call_field(f->db, "generation"), NULL, 10));
	f->reconcile = !strcmp(db_call_field(f->db, "reconcile"), "t");
	f->taken_at = (int64_t)strtod(db_call_field(f->db, "taken_at"), NULL);
	f->reconcile_until = (int64_t)strtod(db_call_field(f->db,
	    "reconcile_until"), NULL);
	f->lease_ends = f->stmt_started +
	    (u_int64_t)settings.lease_seconds * 1000;
	f->stmt_started = 0;

	/*
	 * A generation first sent longer ago than the provider keeps keys
	 * (less a margin) is never sent again: the provider may have
	 * forgotten it, and would take it as new. It is listed first.
	 */
	stale = provider_key_stale_seconds();
	f->stale = stale > 0 && !a->call->fresh_key &&
	    strtod(db_call_field(f->db, "generation_age"), NULL) >=
	    (double)stale;

	/* What the provider is sent: the request as the key row keeps it. */
	kore_buf_reset(&f->request);
	kore_buf_append(&f->request, db_call_field(f->db, "request"),
	    db_call_field_length(f->db, "request"));

	if (!strcmp(outcome, "taken_over")) {
		metrics_count(COUNTER_LEASE_TAKEOVERS, 1);
		kore_log(LOG_NOTICE, "took over %s:%s with lease %s",
		    a->client_id, a->key, a->lease_id);
	} else if (f->req == NULL) {
		kore_log(LOG_NOTICE, "recovery: taking over abandoned %s %s:%s "
		    "with lease %s", f->operation, a->client_id, a->key,
		    a->lease_id);
	}

	flow_db_reset(f);
	f->state = f->reconcile || f->stale ? LEASE_RECONCILE : LEASE_CALL;

	return (LEASE_NEXT);
}

/*
 * reconcile: the key's last answer was indeterminate. The provider's list
 * is read (paged) for an operation sent under any generation of the key:
 * one that succeeded is the outcome; one still pending is a 409; none
 * moves the key to its next generation. A list that cannot be read leaves
 * the key as it is (released, still to reconcile): never a guess.
 *
 * An attempt reads at most RECONCILE_PAGES_MAX pages, and none past its
 * lease. Where it stops paging, the cursor (the last item of the last
 * page read) and the window it read are kept in the key's row
 * (lease_reconcile_save(), fenced by the lease), and the next attempt of
 * the same generation reads them first (lease_reconcile_cursor()) and
 * goes on from there with the same window, instead of page 1: on a busy
 * account every attempt reads further, and the reconciliation ends. The
 * pages before the cursor need no second reading: what is listed there
 * has been read, and what the provider makes later is newer (listed
 * before page 1, outside the window) or is no longer this key's, which
 * the settle window is for. A reconciliation that finds none clears the
 * cursor before the generation moves; lease_reconcile_cursor() answers
 * only the cursor of the key's generation.
 */
static int
flow_reconcile(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	struct kore_buf		path;
	const char		*params[6], *after;
	char			gen[16], end[32];
	int			ret;

	(void)snprintf(gen, sizeof(gen), "%u", a->generation);
	params[0] = a->client_id;
	params[1] = a->key;
	params[2] = a->lease_id;
	params[3] = gen;

	/* Stopped: the cursor saved (or cleared), then where it goes. */
	if (f->cursor_then != 0) {
		(void)snprintf(end, sizeof(end), "%lld",
		    (long long)f->window_end);
		params[4] = f->after[0] != '\0' ? f->after : NULL;
		params[5] = end;
		if ((ret = flow_query(f, LEASE_CURSOR_SAVE_SQL, 6, params)) !=
		    LEASE_NEXT)
			return (ret);
		flow_db_reset(f);
		f->state = f->cursor_then;
		f->cursor_then = 0;
		f->cursor_read = 0;
		f->cursor_kept = 0;
		f->after[0] = '\0';
		return (LEASE_NEXT);
	}

	/* The first page: where an earlier attempt stopped, if one did. */
	if (!f->cursor_read) {
		if ((ret = flow_query(f, LEASE_CURSOR_SQL, 4, params)) !=
		    LEASE_NEXT)
			return (ret);
		/*
		 * Up to now: a listing comes after the settle window, and
		 * every generation sent so far (a later one's charge too,
		 * made after the last indeterminate answer) is in it.
		 */
		f->window_end = (int64_t)time(NULL) + RECONCILE_CLOCK_SLACK;
		f->after[0] = '\0';
		if (db_call_rows(f->db) == 1 && !db_call_null(f->db, 0)) {
			after = db_call_field(f->db, "after");
			if (strlen(after) < sizeof(f->after) &&
			    !db_call_null(f->db, 1)) {
				(void)kore_strlcpy(f->after, after,
				    sizeof(f->after));
				f->window_end = (int64_t)strtod(db_call_field(
				    f->db, "window_end"), NULL);
				f->cursor_kept = 1;
				kore_log(LOG_NOTICE, "reconciling %s:%s "
				    "(generation %u) from where an earlier "
				    "attempt stopped, after %s", a->client_id,
				    a->key, a->generation, f->after);
			}
		}
		flow_db_reset(f);
		f->cursor_read = 1;
		f->pages = 0;
	}

	/*
	 * A page is asked for only while a whole provider call still fits
	 * in the lease: past it another attempt may hold the key.
	 */
	if (!a->calling && kore_time_ms() +
	    settings.provider_timeout_ms >= f->lease_ends) {
		kore_log(LOG_ERR, "could not reconcile %s:%s (generation %u) "
		    "within its lease (%d pages read)%s%s", a->client_id,
		    a->key, a->generation, f->pages, f->after[0] != '\0' ?
		    "; the next attempt goes on after " : "", f->after);
		a->answer = &provider_answer_unresolved;
		(void)snprintf(a->pcall.detail, sizeof(a->pcall.detail),
		    "the payment provider could not be asked in time whether "
		    "this %s was made", a->call->noun);
		return (reconcile_stop(f, LEASE_RELEASE));
	}

	if (!a->calling) {
		kore_buf_init(&path, 256);
		list_path(&path, f);
		a->pcall.req = f->req;
		provider_call_get(&a->pcall, kore_buf_stringify(&path, NULL));
		kore_buf_cleanup(&path);
		a->calling = 1;
	}

	if (!a->pcall.done)
		return (LEASE_WAIT);

	ret = listed(f);
	lease_attempt_cleanup(a);

	switch (ret) {
	case LISTED_FOUND:
		kore_log(LOG_NOTICE, "reconciled %s:%s: the provider has %s "
		    "under generation %u", a->client_id, a->key, a->pcall.id,
		    a->generation);
		a->answer = &provider_answer_reconciled;
		return (reconcile_stop(f, LEASE_SETTLE));
	case LISTED_PENDING:
		a->answer = &provider_answer_pending;
		(void)snprintf(a->pcall.detail, sizeof(a->pcall.detail),
		    "the provider is still processing this %s", a->call->noun);
		a->pcall.retry_after = 1;
		return (reconcile_stop(f, LEASE_RELEASE));
	case LISTED_MORE:
		if (++f->pages < RECONCILE_PAGES_MAX)
			return (LEASE_NEXT);
		/* FALLTHROUGH */
	case LISTED_FAILED:
		kore_log(LOG_ERR, "could not reconcile %s:%s (generation %u): "
		    "%s (%d pages read)%s%s", a->client_id, a->key,
		    a->generation, f->pages >= RECONCILE_PAGES_MAX ?
		    "too many pages for one attempt" : a->pcall.log, f->pages,
		    f->after[0] != '\0' ? "; the next attempt goes on after " :
		    "", f->after);
		a->answer = &provider_answer_unresolved;
		(void)snprintf(a->pcall.detail, sizeof(a->pcall.detail),
		    "the payment provider could not be asked whether this %s "
		    "was made", a->call->noun);
		return (reconcile_stop(f, LEASE_RELEASE));
	default:
		kore_log(LOG_NOTICE, "reconciled %s:%s: no %s under "
		    "generations 1 to %u (%s); the next is %u", a->client_id,
		    a->key, a->call->noun, a->generation, f->reconcile ?
		    "after its settle window" : "past the provider's key "
		    "retention", a->generation + 1);
		/* The cursor of this generation is of no use to the next. */
		f->after[0] = '\0';
		return (reconcile_stop(f, LEASE_GENERATION));
	}
}

/*
 * A reconciliation ends for this attempt and goes to state: through the
 * saving of its cursor when it stops with one (a release), or the
 * clearing of the one it was given (the next generation).
 */
static int
reconcile_stop(struct lease_flow *f, int state)
{
	f->pages = 0;

	if ((state == LEASE_RELEASE && f->after[0] != '\0') ||
	    (state == LEASE_GENERATION && f->cursor_kept)) {
		/* 0 is LEASE_RESERVE, never a state after this one. */
		f->cursor_then = state;
		return (LEASE_NEXT);
	}

	f->state = state;
	f->cursor_read = 0;
	f->cursor_kept = 0;
	f->after[0] = '\0';
	return (LEASE_NEXT);
}

/*
 * generation: the key moves to the next generation of its derived key,
 * under this attempt's lease and from the generation it reconciled; the
 * call then sends that.
 */
static int
flow_generation(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	const char		*params[7];
	char			gen[16], lease[16], call[16], stale[16];
	int			ret;

	(void)snprintf(gen, sizeof(gen), "%u", a->generation);
	(void)snprintf(stale, sizeof(stale), "%u",
	    provider_key_stale_seconds());
	(void)snprintf(lease, sizeof(lease), "%u", settings.lease_seconds);
	(void)snprintf(call, sizeof(call), "%u", settings.provider_timeout_ms);
	params[0] = a->client_id;
	params[1] = a->key;
	params[2] = a->lease_id;
	params[3] = gen;
	params[4] = lease;
	params[5] = call;
	params[6] = provider_key_stale_seconds() > 0 ? stale : NULL;
	if (f->stmt_started == 0)
		f->stmt_started = kore_time_ms();

	if ((ret = flow_query(f, LEASE_GENERATION_SQL, 7, params)) !=
	    LEASE_NEXT)
		return (ret);

	if (db_call_rows(f->db) != 1 || db_call_null(f->db, 0)) {
		f->stmt_started = 0;
		if (f->req == NULL) {
			f->end = LEASE_END_FENCED;
			return (LEASE_DONE);
		}
		/* Its client gets what the key holds now. */
		flow_db_reset(f);
		f->state = LEASE_NOW;
		return (LEASE_NEXT);
	}

	a->generation = (u_int32_t)strtoul(db_call_value(f->db, 0), NULL, 10);
	f->reconcile = 0;
	f->stale = 0;
	/* lease_generation() gave the lease a new start. */
	f->lease_ends = f->stmt_started +
	    (u_int64_t)settings.lease_seconds * 1000;
	f->stmt_started = 0;
	flow_db_reset(f);
	f->state = LEASE_CALL;

	return (LEASE_NEXT);
}

/* call: the provider, with this generation of the derived key. */
static int
flow_call(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;

	/*
	 * Sent only while the whole call fits in this attempt's lease: past
	 * it another attempt may hold the key and call (the model's "one
	 * caller at a time"). A reserve answered late gets here so.
	 */
	if (!a->calling && kore_time_ms() + settings.provider_timeout_ms >=
	    f->lease_ends) {
		kore_log(LOG_NOTICE, "not calling the provider for %s:%s: its "
		    "lease %s would end during the call", a->client_id, a->key,
		    a->lease_id);
		a->answer = &provider_answer_unsent;
		(void)snprintf(a->pcall.detail, sizeof(a->pcall.detail),
		    "the payment provider was not called in time");
		f->state = LEASE_RELEASE;
		return (LEASE_NEXT);
	}

	if (!lease_attempt_call(a, (const char *)f->request.data,
	    f->request.offset, f->req))
		return (LEASE_WAIT);

	f->state = provider_answer_saved(a->answer) ? LEASE_SETTLE :
	    LEASE_RELEASE;

	return (LEASE_NEXT);
}

/*
 * settle: a success or a refusal is completed (saved by the operation's
 * run function), only with the lease this attempt took.
 */
static int
flow_settle(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	struct kore_buf		problem;
	const char		*params[6];
	char			status[8];
	int			code, ret;

	params[0] = a->client_id;
	params[1] = a->key;
	params[2] = a->lease_id;
	kore_buf_init(&problem, 256);

	if (a->answer->class == PROVIDER_SUCCESS) {
		params[3] = a->pcall.id;
		params[4] = "201";
		params[5] = NULL;
	} else {
		code = lease_problem(a);
		problem_body(&problem, code, a->pcall.detail);
		(void)snprintf(status, sizeof(status), "%d",
		    problem_status(code));
		params[3] = NULL;
		params[4] = status;
		params[5] = kore_buf_stringify(&problem, NULL);
	}

	ret = flow_query(f, LEASE_COMPLETE_SQL, 6, params);
	kore_buf_cleanup(&problem);
	if (ret != LEASE_NEXT)
		return (ret);

	late_settled(f);
	f->end = LEASE_END_SETTLED;
	return (LEASE_DONE);
}

/*
 * release: any other answer gives the lease back, marking the key for
 * reconciliation after an indeterminate one; the job's attempt also backs
 * the job off the key.
 */
static int
flow_release(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	const char		*params[7];
	char			base[16], cap[16], settle[16];
	int			ret;

	/*
	 * Only an answer the provider proved it keeps (its table's
	 * indeterminate rows) starts a settle window; a listing that could
	 * not be read leaves the key as it was.
	 */
	(void)snprintf(settle, sizeof(settle), "%u", provider_settle_seconds);
	params[0] = a->client_id;
	params[1] = a->key;
	params[2] = a->lease_id;
	params[3] = a->answer->class == PROVIDER_INDETERMINATE &&
	    a->answer != &provider_answer_unresolved ? "t" : "f";
	params[4] = NULL;
	params[5] = NULL;
	params[6] = settle;
	if (f->req == NULL) {
		(void)snprintf(base, sizeof(base), "%u",
		    settings.recovery_backoff_seconds);
		(void)snprintf(cap, sizeof(cap), "%u",
		    settings.recovery_backoff_max_seconds);
		params[4] = base;
		params[5] = cap;
	}

	if ((ret = flow_query(f, LEASE_RELEASE_SQL, 7, params)) != LEASE_NEXT)
		return (ret);

	/*
	 * Fenced: another attempt took the key meanwhile. Its client gets
	 * what the key holds now, never "retry" whatever it holds.
	 */
	if (f->req != NULL && db_call_rows(f->db) == 1 &&
	    strcmp(db_call_field(f->db, "released"), "t")) {
		/* Counted and logged as fenced by lease_respond_fenced(). */
		flow_db_reset(f);
		f->state = LEASE_NOW;
		return (LEASE_NEXT);
	}

	f->end = LEASE_END_RELEASED;
	return (LEASE_DONE);
}

/*
 * now: an attempt of a request that lost its lease reads what the key
 * holds now (lease_now(): as lease_complete() answers a fenced attempt),
 * which lease_respond_fenced() answers: the saved outcome, 409 while
 * another attempt runs, 410 once deleted.
 */
static int
flow_now(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	const char		*params[2];
	int			ret;

	params[0] = a->client_id;
	params[1] = a->key;

	if ((ret = flow_query(f, LEASE_NOW_SQL, 2, params)) != LEASE_NEXT)
		return (ret);

	f->end = LEASE_END_SETTLED;
	return (LEASE_DONE);
}

/* A state's one statement: LEASE_NEXT once its row is in f->db. */
static int
flow_query(struct lease_flow *f, const char *query, int nparams,
    const char **params)
{
	if (!*f->db_active) {
		/* A flow whose client left: a request's pool, polled. */
		if (f->req != NULL || f->handed)
			db_call_init(f->db, f->req);
		else
			db_call_init_job(f->db);
		*f->db_active = 1;
		/*
		 * The provider has answered: its outcome is saved (or the
		 * lease given back) even if the client leaves before the
		 * statement is sent; the flow is then handed on (handoff.c).
		 */
		if (f->state == LEASE_SETTLE || f->state == LEASE_RELEASE)
			f->db->for_nobody = 1;
	}

	switch (db_call_step(f->db, query, nparams, params)) {
	case DB_CALL_PENDING:
		return (LEASE_WAIT);
	case DB_CALL_FAILED:
		return (LEASE_FAILED);
	default:
		return (LEASE_NEXT);
	}
}

static void
flow_db_reset(struct lease_flow *f)
{
	if (*f->db_active) {
		db_call_cleanup(f->db);
		*f->db_active = 0;
	}
}

/*
 * The provider's list for the key, as its table asks for it: by the key
 * (the fake provider), by creation time (Stripe's charges) or by a member
 * of the request (Stripe's refunds of the charge); from the last item of
 * the page before.
 */
static void
list_path(struct kore_buf *buf, struct lease_flow *f)
{
	struct lease_attempt		*a = &f->attempt;
	const struct provider_op	*op = a->op;
	struct json_value		*v, *m;
	char				key[LEASE_PROVIDER_KEY_MAX];
	char				err[JSON_ERROR_LEN];

	kore_buf_appendf(buf, "%s?", op->path);

	switch (op->list) {
	case LIST_BY_KEY:
		provider_key(a, 1, key, sizeof(key));
		kore_buf_append(buf, "idempotency_key=", 16);
		provider_url_escape(buf, key, strlen(key));
		kore_buf_append(buf, "&prefix=1", 9);
		return;
	case LIST_SINCE:
		kore_buf_appendf(buf, "limit=100&created%%5Bgte%%5D=%lld",
		    (long long)(f->taken_at - RECONCILE_CLOCK_SLACK));
		/*
		 * Up to when this reconciliation began (every generation
		 * sent so far): a bounded window, the same for every attempt
		 * that goes on from its cursor (flow_reconcile()).
		 */
		kore_buf_appendf(buf, "&created%%5Blte%%5D=%lld",
		    (long long)f->window_end);
		break;
	case LIST_BY_MEMBER:
		kore_buf_appendf(buf, "limit=100&%s=", op->list_arg);
		v = json_parse(f->request.data, f->request.offset, err,
		    sizeof(err));
		m = json_member(v, op->list_member);
		if (m != NULL && m->type == JSON_STRING)
			provider_url_escape(buf, m->str, m->len);
		json_free(v);
		break;
	default:
		fatal("%s: unknown list %d", __func__, op->list);
	}

	if (f->after[0] != '\0') {
		kore_buf_append(buf, "&starting_after=", 16);
		provider_url_escape(buf, f->after, strlen(f->after));
	}
}

/*
 * What a page of the list says of the key: an item sent under one of its
 * generations (its metadata, or the fake's key) that succeeded (FOUND, its
 * id in pcall.id), is still pending, or none (MORE when more pages follow:
 * f->after is then the id of the page's last item, where the next page
 * starts). Items of other keys, and failed ones, are passed over. A page
 * that says more follow without a cursor (its last item has no id, or it
 * has no item) cannot be gone on from: FAILED, never none.
 */
static int
listed(struct lease_flow *f)
{
	struct lease_attempt		*a = &f->attempt;
	struct provider_call		*c = &a->pcall;
	struct json_value		*body, *items, *item, *k, *id, *st, *more;
	char				err[JSON_ERROR_LEN];
	char				cursor[PROVIDER_ID_MAX + 1];
	int				ret, pending;

	c->log[0] = '\0';
	if (c->result != CURLE_OK || c->status < 200 || c->status > 299) {
		(void)snprintf(c->log, sizeof(c->log), "listing %.32s: %.160s "
		    "%ld", a->op->path, c->result != CURLE_OK ? (c->errbuf[0] ?
		    c->errbuf : curl_easy_strerror(c->result)) : "status",
		    c->status);
		return (LISTED_FAILED);
	}

	body = json_parse(c->response.data, c->response.offset, err,
	    sizeof(err));
	items = json_member(body, a->op->list_items);
	if (items == NULL || items->type != JSON_ARRAY) {
		(void)snprintf(c->log, sizeof(c->log), "listing %s: no %s "
		    "array", a->op->path, a->op->list_items);
		json_free(body);
		return (LISTED_FAILED);
	}

	ret = LISTED_NONE;
	pending = 0;
	cursor[0] = '\0';
	TAILQ_FOREACH(item, &items->children, list) {
		/* The cursor is the last item's id: none if it has none. */
		cursor[0] = '\0';
		id = json_member(item, a->op->id);
		if (id != NULL && id->type == JSON_STRING && id->len > 0 &&
		    id->len <= PROVIDER_ID_MAX &&
		    idem_id_valid(id->str, id->len)) {
			memcpy(cursor, id->str, id->len);
			cursor[id->len] = '\0';
		}

		k = provider_path(item, provider->item_key);
		if (k == NULL || k->type != JSON_STRING ||
		    !generation_of(a, k->str, k->len,
		    provider_path(item, provider->item_generation)))
			continue;

		if (provider->item_status != NULL) {
			st = json_member(item, provider->item_status);
			if (st == NULL || st->type != JSON_STRING)
				continue;
			if (st->len == 7 && !memcmp(st->str, "pending", 7))
				pending = 1;
			if (st->len != 9 || memcmp(st->str, "succeeded", 9))
				continue;
		}

		if (id == NULL || id->type != JSON_STRING || id->len == 0 ||
		    id->len > PROVIDER_ID_MAX ||
		    !idem_id_valid(id->str, id->len))
			continue;

		/*
		 * The page is read to its end: every other success of the
		 * key's generations is a late operation (late_listed()).
		 */
		if (f->late_scan || ret == LISTED_FOUND) {
			late_listed(f, item, k, id);
			continue;
		}

		(void)kore_strlcpy(c->id, id->str, sizeof(c->id));
		ret = LISTED_FOUND;
	}

	/* A late scan reads every page, whatever is pending. */
	if (ret == LISTED_NONE && pending && !f->late_scan)
		ret = LISTED_PENDING;

	if (ret == LISTED_NONE && provider->has_more != NULL) {
		more = json_member(body, provider->has_more);
		if (more != NULL && more->type == JSON_TRUE) {
			if (TAILQ_EMPTY(&items->children) ||
			    cursor[0] == '\0') {
				(void)snprintf(c->log, sizeof(c->log),
				    "listing %.32s: %s true, and no id on the "
				    "page's last item to go on from",
				    a->op->path, provider->has_more);
				ret = LISTED_FAILED;
			} else {
				(void)kore_strlcpy(f->after, cursor,
				    sizeof(f->after));
				ret = LISTED_MORE;
			}
		}
	}

	json_free(body);
	return (ret);
}

/*
 * Whether a listed item was sent for this key: its derived key (s, len)
 * is the one of a generation from 1 to this attempt's (provider_key()'s
 * forms, which the previous release sent alike for a key that fits);
 * where the provider keeps the generation the item carries (gen: Stripe's
 * metadata[key_generation]), it must say the same, so that the client key
 * "<key>:<n>", sent as generation 1, is not taken for generation n of
 * <key>.
 */
static int
generation_of(const struct lease_attempt *a, const char *s, size_t len,
    struct json_value *gen)
{
	char		base[LEASE_PROVIDER_KEY_MAX], num[16];
	size_t		n;
	u_int64_t	g;

	provider_key(a, 1, base, sizeof(base));
	n = strlen(base);
	if (len < n || memcmp(s, base, n))
		return (0);

	/* <base>, or <base>:<n> with n > 1. */
	g = 1;
	if (len > n && (s[n] != ':' ||
	    !generation_parse(s + n + 1, len - n - 1, &g) || g < 2))
		return (0);

	if (g > a->generation)
		return (0);

	/*
	 * Where the provider keeps the generation it was sent, it must say
	 * the same: the key "K:<n>" sent as generation 1 is not K's n.
	 */
	if (provider->item_generation[0] != NULL) {
		if (gen == NULL || gen->type != JSON_STRING ||
		    gen->len != (size_t)snprintf(num, sizeof(num), "%llu",
		    (unsigned long long)g) || memcmp(gen->str, num, gen->len))
			return (0);
	}

	return (1);
}

/* A generation as provider_key() writes it: 1 to 10 digits, no leading 0. */
static int
generation_parse(const char *s, size_t len, u_int64_t *g)
{
	size_t		i;

	if (len == 0 || len > 10 || s[0] == '0')
		return (0);

	*g = 0;
	for (i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return (0);
		*g = *g * 10 + (u_int64_t)(s[i] - '0');
	}

	return (1);
}

/*
 * A success listed for the key that is not its outcome (issue 28, item
 * 6): a reconciliation's second success, or, in a late scan, any but the
 * key's saved one. Recorded by late.c, which logs and counts it once.
 */
static void
late_listed(struct lease_flow *f, struct json_value *item,
    struct json_value *k, struct json_value *id)
{
	struct lease_attempt	*a = &f->attempt;
	char			pkey[LEASE_PROVIDER_KEY_MAX];
	char			base[LEASE_PROVIDER_KEY_MAX];
	u_int32_t		g;
	int64_t			amount;
	size_t			n;

	if (f->late_scan && !strcmp(f->settled, id->str))
		return;
	if (k->len >= sizeof(pkey))
		return;
	memcpy(pkey, k->str, k->len);
	pkey[k->len] = '\0';

	/* generation_of() said it is <base> or <base>:<g>. */
	provider_key(a, 1, base, sizeof(base));
	n = strlen(base);
	g = 1;
	if (k->len > n + 1)
		g = (u_int32_t)strtoul(pkey + n + 1, NULL, 10);

	lease_late_found(f, pkey, g, id->str,
	    json_int64(json_member(item, "amount"), &amount) ? &amount : NULL,
	    f->late_scan ? "scan" : "reconcile");
}

/*
 * A fenced settle of a success: another attempt finished the key. If the
 * key saved another operation (or a refusal), this attempt's is a second
 * one, made under an earlier generation; under the same derived key the
 * provider answers every attempt with the same operation, and the record
 * (late_operation_record()) finds it is the key's own and writes nothing.
 */
static void
late_settled(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	struct json_value	*v;
	int64_t			amount;
	char			err[JSON_ERROR_LEN];
	int			known;

	/*
	 * A reconciled success was listed, not sent now: its generation is
	 * not known here. The key went past its first generation if another
	 * attempt settled another operation, so the late scan lists it.
	 */
	if (a->answer->class != PROVIDER_SUCCESS ||
	    a->answer == &provider_answer_reconciled ||
	    db_call_rows(f->db) != 1 ||
	    strcmp(db_call_field(f->db, "outcome"), "fenced") ||
	    strcmp(db_call_field(f->db, "status"), "done"))
		return;

	v = json_parse(f->request.data, f->request.offset, err, sizeof(err));
	known = json_int64(json_member(v, "amount"), &amount);
	json_free(v);

	lease_late_found(f, a->provider_key, a->generation, a->pcall.id,
	    known ? &amount : NULL, "settle");
}

/*
 * The late scan's listing of a finished key (late.c): the provider's list
 * of its generations, page by page, every success but its saved one
 * reported late. LEASE_WAIT while a page is read, LEASE_NEXT once a page
 * is in and another follows, LEASE_DONE at the end, LEASE_FAILED when the
 * list could not be read (a->pcall.log says why).
 */
int
lease_late_list(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;
	struct kore_buf		path;
	int			ret;

	if (!a->calling) {
		kore_buf_init(&path, 256);
		list_path(&path, f);
		a->pcall.req = NULL;
		provider_call_get(&a->pcall, kore_buf_stringify(&path, NULL));
		kore_buf_cleanup(&path);
		a->calling = 1;
	}

	if (!a->pcall.done)
		return (LEASE_WAIT);

	ret = listed(f);
	lease_attempt_cleanup(a);

	switch (ret) {
	case LISTED_MORE:
		if (++f->pages < RECONCILE_PAGES_MAX)
			return (LEASE_NEXT);
		(void)snprintf(a->pcall.log, sizeof(a->pcall.log),
		    "more than %d pages", RECONCILE_PAGES_MAX);
		return (LEASE_FAILED);
	case LISTED_FAILED:
		return (LEASE_FAILED);
	default:
		return (LEASE_DONE);
	}
}

/*
 * The request path: the flow until it ends, then the answer.
 */
static int
lease_flow_step(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_flow	*f = r->lease;

	if (f->db == NULL)
		lease_flow_init(f, LEASE_RESERVE, req, &r->db, &r->db_active);

	switch (lease_flow_run(f)) {
	case LEASE_WAIT:
		/* The database wakes the request; the provider call too. */
		if (f->attempt.calling && !f->attempt.pcall.done)
			http_request_sleep(req);
		return (HTTP_STATE_RETRY);
	case LEASE_FAILED:
		return (idem_fail_db(req, f->db));
	default:
		req->fsm_state = LEASE_STATE_RESPOND;
		return (HTTP_STATE_CONTINUE);
	}
}

static int
lease_respond(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_flow	*f = r->lease;

	switch (f->end) {
	case LEASE_END_ANSWERED:
		return (lease_respond_answered(req));
	case LEASE_END_SETTLED:
		if (db_call_rows(&r->db) == 0 ||
		    !strcmp(db_call_field(&r->db, "outcome"), "fenced"))
			return (lease_respond_fenced(req));
		return (idem_respond_row(req, 0));
	case LEASE_END_RELEASED:
		return (lease_respond_released(req));
	case LEASE_END_FENCED:
		metrics_count(COUNTER_LEASE_FENCED, 1);
		http_response_header(req, "retry-after", "1");
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "another attempt "
		    "with Idempotency-Key '%s' holds it now; retry with the "
		    "same key", r->key));
	default:
		fatal("%s: flow ended with %d", __func__, f->end);
	}
}

/* The key row answered without this attempt running the operation. */
static int
lease_respond_answered(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*outcome, *after;

	/*
	 * No row: the cleanup deleted the key between the statements of
	 * lease_reserve_v2(). Nothing was taken; a retry takes it anew.
	 */
	if (db_call_rows(&r->db) == 0) {
		http_response_header(req, "retry-after", "1");
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "Idempotency-Key "
		    "'%s' changed while this request took it; retry with the "
		    "same key", r->key));
	}

	outcome = db_call_field(&r->db, "outcome");

	if (!strcmp(outcome, "mismatch"))
		return (idem_fail_mismatch(req));

	if (!strcmp(outcome, "in_flight") &&
	    !strcmp(db_call_field(&r->db, "settling"), "t")) {
		after = db_call_field(&r->db, "retry_after");
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, PROBLEM_OUTCOME_PENDING, "the payment "
		    "provider's outcome of Idempotency-Key '%s' is not known "
		    "yet (its settle window); nothing was sent. Retry in %s s "
		    "with the same key", r->key, after));
	}

	if (!strcmp(outcome, "in_flight")) {
		after = db_call_field(&r->db, "retry_after");
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "a request with "
		    "Idempotency-Key '%s' is being executed; retry in %s s "
		    "with the same key", r->key, after));
	}

	/*
	 * A done key never changes: its answer is kept for the retries this
	 * worker may get, as a transactional one is (replay_cache.c).
	 */
	if (!strcmp(outcome, "replayed")) {
		replay_cache_put(r, (int)strtol(db_call_field(&r->db,
		    "status_code"), NULL, 10), db_call_field(&r->db,
		    "response"), (size_t)db_call_field_length(&r->db,
		    "response"), strtoull(db_call_field(&r->db, "age_ms"),
		    NULL, 10), !strcmp(db_call_field(&r->db, "standby"), "t"));
		return (idem_respond_row(req, 1));
	}

	/*
	 * "K:<n>" would reach the provider as generation n of the key K,
	 * which K has reached: nothing taken (provider_key()).
	 */
	if (!strcmp(outcome, "collides")) {
		return (idem_fail(req, PROBLEM_KEY_REUSED, "Idempotency-Key "
		    "'%s' would reach the payment provider as a later attempt "
		    "of another key of yours; nothing was done: send this "
		    "request with another key", r->key));
	}

	/* The operation's admit refused it: nothing taken, nothing saved. */
	if (!strcmp(outcome, "refused"))
		return (lease_respond_unsaved(req));

	kore_log(LOG_ERR, "lease_reserve_v2 answered '%s'", outcome);
	return (idem_fail(req, PROBLEM_INTERNAL, "the key is in an unexpected "
	    "state; retry with the same Idempotency-Key"));
}

/* Nothing saved, the lease given back: what the answer was. */
static int
lease_respond_released(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_attempt	*a = &r->lease->attempt;
	char			after[16];

	(void)snprintf(after, sizeof(after), "%u", a->pcall.retry_after);

	/* A kept 5xx: the settle window has started. */
	if (a->answer->problem == PROBLEM_OUTCOME_PENDING) {
		(void)snprintf(after, sizeof(after), "%u",
		    provider_settle_seconds > 0 ? provider_settle_seconds : 1);
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, PROBLEM_OUTCOME_PENDING, "the payment "
		    "provider failed this %s with an answer it keeps under the "
		    "key: it may still be made. Retry in %s s with the same "
		    "Idempotency-Key: the service then asks the provider, and "
		    "makes it only if it was not made", a->call->noun, after));
	}

	/* The provider still processes the same key: its 409. */
	if (a->answer->class == PROVIDER_BUSY) {
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "the payment "
		    "provider is still processing an earlier attempt with "
		    "Idempotency-Key '%s'; retry in %s s with the same key",
		    r->key, after));
	}

	if (a->answer->problem == PROBLEM_PROVIDER_RATE_LIMITED) {
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, a->answer->problem, "%s with the same "
		    "Idempotency-Key", a->pcall.detail));
	}

	return (idem_fail(req, a->answer->problem, "%s; retry with the same "
	    "Idempotency-Key", a->pcall.detail));
}

/*
 * A refusal before the key was taken (a refund of an unknown payment, or
 * larger than what is left, or one that must wait for refunds in flight):
 * answered, counted, and neither saved nor replayed.
 */
static int
lease_respond_unsaved(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*after;
	int			status;

	/* A 409 is a wait, with the admit's Retry-After; the rest refuse. */
	status = (int)strtol(db_call_field(&r->db, "status_code"), NULL, 10);
	if (status == HTTP_STATUS_CONFLICT) {
		after = db_call_field(&r->db, "retry_after");
		http_response_header(req, "retry-after",
		    *after != '\0' ? after : "1");
		r->outcome = OUTCOME_IN_FLIGHT;
	} else {
		r->outcome = OUTCOME_INVALID;
	}
	/* Counted as idem_fail() counts, and so logged (accesslog.c). */
	metrics_request(r->route, r->outcome, r->started);
	http_response_header(req, "content-type", PROBLEM_CONTENT_TYPE);
	http_response(req, status, db_call_field(&r->db, "response"),
	    db_call_field_length(&r->db, "response"));

	return (HTTP_STATE_COMPLETE);
}

/*
 * This worker lost its lease while it waited: another attempt holds or has
 * finished the key, and this result was not written. The client gets what
 * the key holds now: the other attempt's saved response, a 409 while it
 * runs, or, when its outcome has passed the retention and been deleted, a
 * 410: a retry with this key would be a new operation.
 */
static int
lease_respond_fenced(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_attempt	*a = &r->lease->attempt;
	const char		*status;

	metrics_count(COUNTER_LEASE_FENCED, 1);
	kore_log(LOG_NOTICE, "lease %s of %s:%s was taken over; its late "
	    "result was not written", a->lease_id, r->client_id, r->key);

	status = db_call_rows(&r->db) == 0 ? "gone" :
	    db_call_field(&r->db, "status");

	if (!strcmp(status, "done"))
		return (idem_respond_row(req, 1));

	if (!strcmp(status, "gone")) {
		return (idem_fail(req, PROBLEM_KEY_EXPIRED, "another attempt "
		    "with Idempotency-Key '%s' finished this %s, and its "
		    "outcome has passed the retention of %u s and was "
		    "deleted; this attempt's result was not written. Do not "
		    "retry with this key: it would be a new %s", r->key,
		    a->call->noun, settings.retention_seconds, a->call->noun));
	}

	http_response_header(req, "retry-after", "1");
	return (idem_fail(req, PROBLEM_IN_PROGRESS, "another attempt with "
	    "Idempotency-Key '%s' holds it now; retry with the same key",
	    r->key));
}

/*
 * The request is freed, answered or cut off. A flow whose provider call
 * was sent and whose outcome is not saved yet (its client left) goes on
 * without it (handoff.c); any other ends here.
 */
static void
lease_request_free(struct idem_request *r)
{
	if (!lease_handoff(r->lease)) {
		if (r->lease->db != NULL)
			lease_flow_cleanup(r->lease);
		kore_free(r->lease);
	}
	r->lease = NULL;
}

/*
 * Whether a key is sent as itself (1) or as its SHA-256 (0): a key whose
 * generations could pass the provider's longest key (Stripe: 255) with
 * <client>:<key> and 11 bytes more. The bound is the previous release's,
 * so that a key in flight across an upgrade keeps its first generation.
 */
static int
key_fits(const struct lease_attempt *a)
{
	return (provider->key_max == 0 || strlen(a->client_id) + 1 +
	    strlen(a->key) + 11 <= provider->key_max);
}

/*
 * The provider's Idempotency-Key of a generation: derived from the
 * client's, the same for every attempt of one generation whichever worker
 * or process makes it; or, for the fresh-provider-key demo, a new random
 * one per attempt. With <n> a generation in decimal, without a leading
 * zero, and <hex> the SHA-256 of the key in lower-case hex:
 *
 *   <client>:<key>              generation 1 of a key that fits
 *   <client>:<key>:<n>          generation n > 1 of a key that fits
 *   <client>~sha256:<hex>       generation 1 of a longer key
 *   <client>~sha256:<hex>:<n>   generation n > 1 of a longer key
 *
 * The first two are the contract's (docs/API.md). A hashed form can never
 * be a plain one: a client id is ^[A-Za-z0-9._-]+$, so a plain form has
 * ':' right after the client, a hashed one '~'. Among plain forms, the
 * key "K:<n>" (generation 1) and generation n of the key "K" spell the same
 * provider key: the two are never both sent. lease_reserve_v2() refuses a new
 * key "K:<n>" once K has reached generation n (422), and
 * lease_generation() passes over a generation n of K while a key "K:<n>"
 * of the client exists, both under one advisory lock (sql/040). Stripe's
 * items carry metadata[key_generation], so a listing tells them apart too
 * (generation_of()); the fake provider keeps no generation, which leaves
 * one case open there only (a generation passed over, then listed: see
 * docs/operations.md).
 *
 * Lengths: a generation adds 11 bytes at most (the bound in key_fits());
 * a hashed form is the client and 82 bytes.
 */
static void
provider_key(const struct lease_attempt *a, u_int32_t generation, char *out,
    size_t len)
{
	u_int8_t	random[16];
	char		hex[sizeof(random) * 2 + 1], sha[65], gen[16];
	size_t		i;

	if (!a->call->fresh_key) {
		gen[0] = '\0';
		if (generation > 1)
			(void)snprintf(gen, sizeof(gen), ":%u", generation);
		if (key_fits(a)) {
			(void)snprintf(out, len, "%s:%s%s", a->client_id,
			    a->key, gen);
		} else {
			sha256_hex(a->key, strlen(a->key), sha);
			(void)snprintf(out, len, "%s~sha256:%s%s",
			    a->client_id, sha, gen);
		}
		return;
	}

	if (RAND_bytes(random, sizeof(random)) != 1)
		fatal("RAND_bytes failed");
	for (i = 0; i < sizeof(random); i++)
		(void)snprintf(hex + i * 2, 3, "%02x", random[i]);
	(void)snprintf(out, len, "fresh-%s", hex);
}
