/*
 * The lease strategy, for an operation outside this database (a charge, a
 * refund at a payment provider). The key is taken first, as an
 * in_progress row with a lease and a fencing token; the provider is called
 * with a key derived from the client's; the outcome is saved only while
 * the lease is still this attempt's. SQL: sql/003_lease.sql.
 *
 *   authenticate -> admit -> reserve -> decide -> call (provider)
 *     -> settle (complete | release) -> respond
 *
 * What an operation adds is data: its provider call (struct lease_call)
 * and its SQL (the run function that saves an outcome, an optional admit
 * function). What each answer of the provider does is the one table of
 * provider_answer.c. No database connection or transaction is held
 * during the provider call.
 */

#include <sys/types.h>

#include <openssl/rand.h>

#include <stdio.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "lease.h"
#include "metrics.h"
#include "problem.h"
#include "settings.h"

#define LEASE_RESERVE_SQL						\
	"SELECT outcome, lease_id, status_code, response, retry_after, "	\
	"request FROM lease_reserve($1, $2, $3, $4, $5::jsonb, $6::int, "	\
	"$7::int)"

#define LEASE_COMPLETE_SQL						\
	"SELECT outcome, status_code, response, status FROM "		\
	"lease_complete($1, $2, $3::bigint, $4, $5::int, $6)"

#define LEASE_RELEASE_SQL						\
	"SELECT lease_release($1, $2, $3::bigint) AS released"

#define LEASE_STATE_RESERVE	IDEM_STATE_STRATEGY
#define LEASE_STATE_DECIDE	(IDEM_STATE_STRATEGY + 1)
#define LEASE_STATE_CALL	(IDEM_STATE_STRATEGY + 2)
#define LEASE_STATE_SETTLE	(IDEM_STATE_STRATEGY + 3)
#define LEASE_STATE_RESPOND	(IDEM_STATE_STRATEGY + 4)

static int	lease_reserve(struct http_request *);
static int	lease_decide(struct http_request *);
static int	lease_call(struct http_request *);
static int	lease_settle(struct http_request *);
static int	lease_respond(struct http_request *);
static int	lease_respond_unsaved(struct http_request *);
static int	lease_respond_fenced(struct http_request *);
static void	lease_request_free(struct idem_request *);
static void	provider_body(struct kore_buf *, const struct lease_call *,
		    const char *, size_t);
static void	provider_key(struct lease_attempt *);

static struct http_state	lease_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(lease_reserve),
	KORE_HTTP_STATE(lease_decide),
	KORE_HTTP_STATE(lease_call),
	KORE_HTTP_STATE(lease_settle),
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

	return (http_state_run(lease_states,
	    sizeof(lease_states) / sizeof(lease_states[0]), req));
}

/*
 * The operation's problem for a refusal of the provider: the table of
 * provider_answer.c names a payment's (card-declined, payment-rejected),
 * which an operation maps to its own.
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

void
lease_attempt_init(struct lease_attempt *a, const struct lease_call *call,
    const char *client, const char *key, const char *lease)
{
	a->call = call;
	(void)kore_strlcpy(a->client_id, client, sizeof(a->client_id));
	(void)kore_strlcpy(a->key, key, sizeof(a->key));
	(void)kore_strlcpy(a->lease_id, lease, sizeof(a->lease_id));
}

/*
 * Calls the provider with the members of the saved request the operation
 * sends; true once the answer is in and classified. A request sleeps
 * until then, a job polls.
 */
int
lease_attempt_call(struct lease_attempt *a, const char *request,
    size_t len, struct http_request *req)
{
	struct kore_buf		body;

	if (!a->calling) {
		provider_key(a);
		kore_buf_init(&body, 128);
		provider_body(&body, a->call, request, len);
		a->pcall.req = req;
		provider_call_start(&a->pcall, a->call->path, a->provider_key,
		    (const char *)body.data, body.offset);
		kore_buf_cleanup(&body);
		a->calling = 1;
	}

	if (!a->pcall.done)
		return (0);

	a->answer = provider_answer_classify(&a->pcall, a->call->id,
	    a->call->noun);
	if (!provider_answer_saved(a->answer)) {
		kore_log(LOG_NOTICE, "provider call for %s:%s not finished: "
		    "%s (%s)", a->client_id, a->key, a->pcall.detail,
		    a->answer->what);
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
 * The call that settles an attempt: a success or a refusal is completed
 * (saved by the operation's run function), any other answer releases.
 */
void
lease_settle_init(struct lease_settle *s, struct lease_attempt *a)
{
	int		problem;

	s->params[0] = a->client_id;
	s->params[1] = a->key;
	s->params[2] = a->lease_id;
	kore_buf_init(&s->problem, 256);

	switch (a->answer->class) {
	case PROVIDER_SUCCESS:
		s->params[3] = a->pcall.id;
		s->params[4] = "201";
		s->params[5] = NULL;
		s->nparams = 6;
		s->sql = LEASE_COMPLETE_SQL;
		break;
	case PROVIDER_REFUSED:
		problem = lease_problem(a);
		problem_body(&s->problem, problem, a->pcall.detail);
		(void)snprintf(s->status, sizeof(s->status), "%d",
		    problem_status(problem));
		s->params[3] = NULL;
		s->params[4] = s->status;
		s->params[5] = kore_buf_stringify(&s->problem, NULL);
		s->nparams = 6;
		s->sql = LEASE_COMPLETE_SQL;
		break;
	default:
		s->nparams = 3;
		s->sql = LEASE_RELEASE_SQL;
		break;
	}
}

void
lease_settle_cleanup(struct lease_settle *s)
{
	kore_buf_cleanup(&s->problem);
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

static int
lease_reserve(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[7];
	char			lease[16], call[16];

	(void)snprintf(lease, sizeof(lease), "%u", settings.lease_seconds);
	(void)snprintf(call, sizeof(call), "%u", settings.provider_timeout_ms);

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->op->name;
	params[3] = r->fingerprint;
	params[4] = (const char *)r->request.data;
	params[5] = lease;
	params[6] = call;

	return (idem_execute(req, LEASE_STATE_DECIDE, LEASE_RESERVE_SQL, 7,
	    params));
}

static int
lease_decide(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_attempt	*a = r->lease;
	const char		*outcome, *after;

	/*
	 * No row: the cleanup deleted the key between the statements of
	 * lease_reserve(). Nothing was taken; a retry takes it anew.
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

	if (!strcmp(outcome, "in_flight")) {
		after = db_call_field(&r->db, "retry_after");
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "a request with "
		    "Idempotency-Key '%s' is being executed; retry in %s s "
		    "with the same key", r->key, after));
	}

	if (!strcmp(outcome, "replayed"))
		return (idem_respond_row(req, 1));

	/* The operation's admit refused it: nothing taken, nothing saved. */
	if (!strcmp(outcome, "refused"))
		return (lease_respond_unsaved(req));

	if (strcmp(outcome, "reserved") && strcmp(outcome, "taken_over")) {
		kore_log(LOG_ERR, "lease_reserve answered '%s'", outcome);
		return (idem_fail(req, PROBLEM_INTERNAL, "the key is in an "
		    "unexpected state; retry with the same Idempotency-Key"));
	}

	lease_attempt_init(a, r->op->call, r->client_id, r->key,
	    db_call_field(&r->db, "lease_id"));

	/* What the provider is sent: the request as the key row keeps it. */
	kore_buf_reset(&r->request);
	kore_buf_append(&r->request, db_call_field(&r->db, "request"),
	    db_call_field_length(&r->db, "request"));

	if (!strcmp(outcome, "taken_over")) {
		metrics_count(COUNTER_LEASE_TAKEOVERS, 1);
		kore_log(LOG_NOTICE, "took over %s:%s with lease %s",
		    r->client_id, r->key, a->lease_id);
	}

	idem_db_reset(r);
	req->fsm_state = LEASE_STATE_CALL;

	return (HTTP_STATE_CONTINUE);
}

/*
 * Calls the provider and sleeps until the call is done; the worker serves
 * other requests meanwhile.
 */
static int
lease_call(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (!lease_attempt_call(r->lease, (const char *)r->request.data,
	    r->request.offset, req)) {
		http_request_sleep(req);
		return (HTTP_STATE_RETRY);
	}

	req->fsm_state = LEASE_STATE_SETTLE;
	return (HTTP_STATE_CONTINUE);
}

/*
 * A success or a refusal is saved (complete); any other answer gives the
 * lease back (release). Either only with the lease this attempt took.
 */
static int
lease_settle(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_settle	s;
	int			ret;

	lease_settle_init(&s, r->lease);
	ret = idem_execute(req, LEASE_STATE_RESPOND, s.sql, s.nparams,
	    s.params);
	lease_settle_cleanup(&s);

	return (ret);
}

static int
lease_respond(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_attempt	*a = r->lease;
	char			after[16];

	if (!provider_answer_saved(a->answer)) {
		if (strcmp(db_call_field(&r->db, "released"), "t")) {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "lease %s of %s:%s was taken over; "
			    "not released", a->lease_id, r->client_id, r->key);
		}

		/* The provider still processes the same key: its 409. */
		if (a->answer->class == PROVIDER_BUSY) {
			(void)snprintf(after, sizeof(after), "%u",
			    a->pcall.retry_after);
			http_response_header(req, "retry-after", after);
			return (idem_fail(req, PROBLEM_IN_PROGRESS, "the "
			    "payment provider is still processing an earlier "
			    "attempt with Idempotency-Key '%s'; retry in %s s "
			    "with the same key", r->key, after));
		}

		return (idem_fail(req, a->answer->problem, "%s; retry with the "
		    "same Idempotency-Key", a->pcall.detail));
	}

	if (db_call_rows(&r->db) == 0 ||
	    !strcmp(db_call_field(&r->db, "outcome"), "fenced"))
		return (lease_respond_fenced(req));

	return (idem_respond_row(req, 0));
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
	struct lease_attempt	*a = r->lease;
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

static void
lease_request_free(struct idem_request *r)
{
	lease_attempt_cleanup(r->lease);
	kore_free(r->lease);
	r->lease = NULL;
}

/*
 * The provider's body: the members of the saved request the operation
 * sends, by name (a request that is not the JSON object this service
 * saved sends an empty object, which the provider refuses).
 */
static void
provider_body(struct kore_buf *buf, const struct lease_call *call,
    const char *request, size_t len)
{
	struct json_value	*v, *members[LEASE_MEMBERS_MAX];
	char			err[JSON_ERROR_LEN];
	size_t			i, n;

	v = json_parse((const u_int8_t *)request, len, err, sizeof(err));

	n = 0;
	for (i = 0; i < LEASE_MEMBERS_MAX && call->members[i] != NULL; i++) {
		if ((members[n] = json_member(v, call->members[i])) != NULL)
			n++;
	}

	json_canonical_members(buf, members, n);
	json_free(v);
}

/*
 * The provider's Idempotency-Key: derived from the client's, the same for
 * every attempt of one operation whichever worker or process makes it;
 * or, for the fresh-provider-key demo, a new random one per attempt.
 */
static void
provider_key(struct lease_attempt *a)
{
	u_int8_t	random[16];
	char		hex[sizeof(random) * 2 + 1];
	size_t		i;

	if (!a->call->fresh_key) {
		(void)snprintf(a->provider_key, sizeof(a->provider_key),
		    "%s:%s", a->client_id, a->key);
		return;
	}

	if (RAND_bytes(random, sizeof(random)) != 1)
		fatal("RAND_bytes failed");
	for (i = 0; i < sizeof(random); i++)
		(void)snprintf(hex + i * 2, 3, "%02x", random[i]);
	(void)snprintf(a->provider_key, sizeof(a->provider_key), "fresh-%s",
	    hex);
}
