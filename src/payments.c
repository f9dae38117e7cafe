/*
 * POST /v1/payments: the lease strategy for an operation outside this
 * database. The key is taken first (an in_progress row with a lease and a
 * fencing token), the provider is called with a key derived from the
 * client's, and the outcome is saved only while the lease is still ours.
 *
 *   reserve -> decide -> charge (provider) -> settle (complete | release)
 *
 * What each answer of the provider does is one table, provider_answer.c.
 *
 * No database connection or transaction is held during the provider call.
 */

#include <sys/types.h>

#include <openssl/rand.h>

#include <stdio.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "metrics.h"
#include "payments.h"
#include "problem.h"
#include "reload.h"
#include "routes.h"
#include "settings.h"

#define PAYMENT_COMPLETE_SQL						\
	"SELECT outcome, status_code, response, status FROM "		\
	"payment_complete($1, $2, $3::bigint, $4, $5::int, $6)"

#define PAYMENT_RELEASE_SQL	"SELECT payment_release($1, $2, $3::bigint)"

#define RESERVE_SQL							\
	"SELECT outcome, lease_id, status_code, response, retry_after "	\
	"FROM payment_reserve($1, $2, $3, $4, $5::jsonb, $6::int, $7::int)"


static int	payment_reserve(struct http_request *);
static int	payment_decide(struct http_request *);
static int	payment_settle(struct http_request *);
static int	payment_respond(struct http_request *);
static int	payment_respond_fenced(struct http_request *);
static void	payment_free(void *);
static void	provider_key(struct idem_request *, struct payment *);

const struct idem_field	payment_fields[PAYMENT_NFIELDS] = {
	{ "amount",	FIELD_AMOUNT,	1, 1 },
	{ "currency",	FIELD_CURRENCY,	1, 1 },
	{ "recipient",	FIELD_ID,	1, 1 },
	{ "purpose",	FIELD_TEXT,	0, 1 },
};

static const struct idem_operation	payment_operation = {
	"payments.create", ROUTE_PAYMENTS, payment_fields, PAYMENT_NFIELDS
};

static struct http_state	payment_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(payment_reserve),
	KORE_HTTP_STATE(payment_decide),
	KORE_HTTP_STATE(payment_charge),
	KORE_HTTP_STATE(payment_settle),
	KORE_HTTP_STATE(payment_respond),
};

int
payments(struct http_request *req)
{
	return (payment_run(req, ROUTE_PAYMENTS, &payment_operation,
	    PROVIDER_KEY_DERIVED));
}

/*
 * The lease flow for an operation; the fresh-provider-key demo runs it
 * with PROVIDER_KEY_FRESH.
 */
int
payment_run(struct http_request *req, int route,
    const struct idem_operation *op, int key_kind)
{
	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	(void)payment_start(req, route, op, key_kind);

	if (!idem_method(req, HTTP_METHOD_POST, "POST"))
		return (KORE_RESULT_OK);

	return (http_state_run(payment_states, ROUTE_STATES(payment_states),
	    req));
}

struct payment *
payment_start(struct http_request *req, int route,
    const struct idem_operation *op, int key_kind)
{
	struct idem_request	*r;
	struct payment		*p;

	r = idem_request(req, route, op);
	if (r->extra == NULL) {
		p = kore_calloc(1, sizeof(*p));
		p->provider_key_kind = key_kind;
		r->extra = p;
		r->extra_free = payment_free;
	}

	return (r->extra);
}

/*
 * Calls the provider and sleeps until the call is done; the worker serves
 * other requests meanwhile.
 */
int
payment_charge(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	struct kore_buf		body;
	const char		*json;
	size_t			len;

	if (!p->calling) {
		provider_key(r, p);
		kore_buf_init(&body, 128);
		payment_provider_body(&body, r->values[0], r->values[1],
		    r->values[2]);
		json = kore_buf_stringify(&body, &len);

		p->call.req = req;
		provider_call_start(&p->call, p->provider_key, json, len);
		kore_buf_cleanup(&body);
		p->calling = 1;
	}

	if (!p->call.done) {
		http_request_sleep(req);
		return (HTTP_STATE_RETRY);
	}

	p->answer = provider_answer_classify(&p->call);
	if (!provider_answer_saved(p->answer)) {
		kore_log(LOG_NOTICE, "provider call for %s:%s not finished: "
		    "%s (%s)", r->client_id, r->key, p->call.detail,
		    p->answer->what);
	}

	req->fsm_state++;
	return (HTTP_STATE_CONTINUE);
}

/*
 * The answers that release the lease: nothing was saved, and a retry with
 * the same key can go on. A provider still processing the same key (after
 * an attempt that timed out) gets a 409 with its own Retry-After; a
 * failure a 502 or 504.
 */
int
payment_fail_provider(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	char			after[16];

	if (p->answer->class == PROVIDER_BUSY) {
		(void)snprintf(after, sizeof(after), "%u", p->call.retry_after);
		http_response_header(req, "retry-after", after);
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "the payment "
		    "provider is still processing an earlier attempt with "
		    "Idempotency-Key '%s'; retry in %s s with the same key",
		    r->key, after));
	}

	return (idem_fail(req, p->answer->problem, "%s; retry with the same "
	    "Idempotency-Key", p->call.detail));
}

/*
 * The saved outcome of a refusal: card-declined or payment-rejected, with
 * the provider's reason.
 */
void
payment_refusal_body(struct provider_call *call,
    const struct provider_answer *answer, struct kore_buf *buf)
{
	problem_body(buf, answer->problem, call->detail);
}

/*
 * The call that settles an attempt of the given client, key and lease: a
 * success or a refusal is completed (saved), any other answer releases.
 */
void
payment_settle_init(struct payment_settle *s, struct provider_call *call,
    const struct provider_answer *answer, const char *client,
    const char *key, const char *lease)
{
	s->params[0] = client;
	s->params[1] = key;
	s->params[2] = lease;
	kore_buf_init(&s->problem, 256);

	switch (answer->class) {
	case PROVIDER_SUCCESS:
		s->params[3] = call->charge_id;
		s->params[4] = "201";
		s->params[5] = NULL;
		s->nparams = 6;
		s->sql = PAYMENT_COMPLETE_SQL;
		break;
	case PROVIDER_REFUSED:
		payment_refusal_body(call, answer, &s->problem);
		(void)snprintf(s->status, sizeof(s->status), "%d",
		    problem_status(answer->problem));
		s->params[3] = NULL;
		s->params[4] = s->status;
		s->params[5] = kore_buf_stringify(&s->problem, NULL);
		s->nparams = 6;
		s->sql = PAYMENT_COMPLETE_SQL;
		break;
	default:
		s->nparams = 3;
		s->sql = PAYMENT_RELEASE_SQL;
		break;
	}
}

void
payment_settle_cleanup(struct payment_settle *s)
{
	kore_buf_cleanup(&s->problem);
}

/*
 * The provider's Idempotency-Key for a client's key: the same for every
 * attempt of one payment, whichever worker or process makes it.
 */
void
payment_derived_key(char *out, size_t len, const char *client,
    const char *key)
{
	(void)snprintf(out, len, "%s:%s", client, key);
}

/*
 * The body of POST /v1/charges.
 */
void
payment_provider_body(struct kore_buf *buf, const char *amount,
    const char *currency, const char *recipient)
{
	kore_buf_appendf(buf, "{\"amount\":%s,\"currency\":", amount);
	json_append_string(buf, currency, strlen(currency));
	kore_buf_append(buf, ",\"recipient\":", 13);
	json_append_string(buf, recipient, strlen(recipient));
	kore_buf_append(buf, "}", 1);
}

static int
payment_reserve(struct http_request *req)
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
	params[4] = (const char *)r->canonical.data;
	params[5] = lease;
	params[6] = call;

	return (idem_execute(req, RESERVE_SQL, 7, params));
}

static int
payment_decide(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	const char		*outcome;

	/*
	 * No row: the cleanup deleted the key between the statements of
	 * payment_reserve(). Nothing was taken; a retry takes it anew.
	 */
	if (db_call_rows(&r->db) == 0) {
		http_response_header(req, "retry-after", "1");
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "Idempotency-Key "
		    "'%s' changed while this request took it; retry with the "
		    "same key", r->key));
	}

	outcome = db_call_value(&r->db, 0);

	if (!strcmp(outcome, "mismatch"))
		return (idem_fail_mismatch(req));

	if (!strcmp(outcome, "in_flight")) {
		http_response_header(req, "retry-after",
		    db_call_value(&r->db, 4));
		return (idem_fail(req, PROBLEM_IN_PROGRESS, "a request with "
		    "Idempotency-Key '%s' is being executed; retry in %s s "
		    "with the same key", r->key, db_call_value(&r->db, 4)));
	}

	if (!strcmp(outcome, "replayed"))
		return (idem_respond_row(req, 2, 3, 1));

	if (strcmp(outcome, "reserved") && strcmp(outcome, "taken_over")) {
		kore_log(LOG_ERR, "payment_reserve answered '%s'", outcome);
		return (idem_fail(req, PROBLEM_INTERNAL, "the key is in an "
		    "unexpected state; retry with the same Idempotency-Key"));
	}

	(void)kore_strlcpy(p->lease_id, db_call_value(&r->db, 1),
	    sizeof(p->lease_id));

	if (!strcmp(outcome, "taken_over")) {
		metrics_count(COUNTER_LEASE_TAKEOVERS, 1);
		kore_log(LOG_NOTICE, "took over %s:%s with lease %s",
		    r->client_id, r->key, p->lease_id);
	}

	idem_db_reset(r);
	req->fsm_state++;

	return (HTTP_STATE_CONTINUE);
}

/*
 * A charge or a refusal is saved (complete); any other answer gives the
 * lease back (release). Either only with the lease this attempt took.
 */
static int
payment_settle(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	struct payment_settle	s;
	int			ret;

	payment_settle_init(&s, &p->call, p->answer, r->client_id, r->key,
	    p->lease_id);
	p->released = !provider_answer_saved(p->answer);
	ret = idem_execute(req, s.sql, s.nparams, s.params);
	payment_settle_cleanup(&s);

	return (ret);
}

static int
payment_respond(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;

	if (p->released) {
		if (strcmp(db_call_value(&r->db, 0), "t")) {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "lease %s of %s:%s was taken over; "
			    "not released", p->lease_id, r->client_id, r->key);
		}
		return (payment_fail_provider(req));
	}

	if (db_call_rows(&r->db) == 0 ||
	    !strcmp(db_call_value(&r->db, 0), "fenced"))
		return (payment_respond_fenced(req));

	return (idem_respond_row(req, 1, 2, 0));
}

/*
 * This worker lost its lease while it waited: another attempt holds or has
 * finished the key, and this result was not written. The client gets what
 * the key holds now: the other attempt's saved response, a 409 while it
 * runs, or, when its outcome has passed the retention and been deleted, a
 * 410: a retry with this key would be a new payment.
 */
static int
payment_respond_fenced(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	const char		*status;

	metrics_count(COUNTER_LEASE_FENCED, 1);
	kore_log(LOG_NOTICE, "lease %s of %s:%s was taken over; its late "
	    "result was not written", p->lease_id, r->client_id, r->key);

	status = db_call_rows(&r->db) == 0 ? "gone" :
	    db_call_value(&r->db, 3);

	if (!strcmp(status, "done"))
		return (idem_respond_row(req, 1, 2, 1));

	if (!strcmp(status, "gone")) {
		return (idem_fail(req, PROBLEM_KEY_EXPIRED, "another attempt "
		    "with Idempotency-Key '%s' finished this payment, and its "
		    "outcome has passed the retention of %u s and was deleted; "
		    "this attempt's result was not written. Do not retry with "
		    "this key: it would be a new payment", r->key,
		    settings.retention_seconds));
	}

	http_response_header(req, "retry-after", "1");
	return (idem_fail(req, PROBLEM_IN_PROGRESS, "another attempt with "
	    "Idempotency-Key '%s' holds it now; retry with the same key",
	    r->key));
}

static void
payment_free(void *arg)
{
	struct payment	*p = arg;

	if (p->calling)
		provider_call_cleanup(&p->call);

	kore_free(p);
}

/*
 * The provider's Idempotency-Key: derived from the client's, or, for the
 * fresh-provider-key demo, a new random one per attempt.
 */
static void
provider_key(struct idem_request *r, struct payment *p)
{
	u_int8_t	random[16];
	char		hex[sizeof(random) * 2 + 1];
	size_t		i;

	if (p->provider_key_kind == PROVIDER_KEY_DERIVED) {
		payment_derived_key(p->provider_key, sizeof(p->provider_key),
		    r->client_id, r->key);
		return;
	}

	if (RAND_bytes(random, sizeof(random)) != 1)
		fatal("RAND_bytes failed");
	for (i = 0; i < sizeof(random); i++)
		(void)snprintf(hex + i * 2, 3, "%02x", random[i]);
	(void)snprintf(p->provider_key, sizeof(p->provider_key), "fresh-%s",
	    hex);
}
