/*
 * POST /v1/payments: the lease strategy for an operation outside this
 * database. The key is taken first (an in_progress row with a lease and a
 * fencing token), the provider is called with a key derived from the
 * client's, and the outcome is saved only while the lease is still ours.
 *
 *   reserve -> decide -> charge (provider) -> settle (complete | release)
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
	"FROM payment_reserve($1, $2, $3, $4, $5::jsonb, $6::int)"


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

	p->outcome = provider_call_outcome(&p->call);
	if (p->outcome == PROVIDER_FAILED || p->outcome == PROVIDER_TIMED_OUT) {
		kore_log(LOG_NOTICE, "provider call for %s:%s failed: %s",
		    r->client_id, r->key, p->call.detail);
	}

	req->fsm_state++;
	return (HTTP_STATE_CONTINUE);
}

/*
 * 502 or 504 after a failed provider call: nothing was saved, and a retry
 * with the same key can go on at once.
 */
int
payment_fail_provider(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;

	if (p->outcome == PROVIDER_TIMED_OUT) {
		return (idem_fail(req, PROBLEM_PROVIDER_TIMEOUT, "%s; retry with "
		    "the same Idempotency-Key", p->call.detail));
	}

	return (idem_fail(req, PROBLEM_PROVIDER_UNAVAILABLE, "%s; retry with the "
	    "same Idempotency-Key", p->call.detail));
}

/*
 * The saved outcome of a declined charge: a card-declined problem.
 */
void
payment_declined_body(struct provider_call *call, struct kore_buf *buf)
{
	problem_body(buf, PROBLEM_CARD_DECLINED, call->detail);
}

/*
 * The call that settles an attempt: complete with a charge or a decline,
 * or release after a failure. params[0..2] hold the client, the key and
 * the lease; the rest is filled here, a decline's body into problem.
 */
const char *
payment_settle_sql(struct provider_call *call, int outcome,
    const char **params, int *nparams, struct kore_buf *problem)
{
	switch (outcome) {
	case PROVIDER_CHARGED:
		params[3] = call->charge_id;
		params[4] = "201";
		params[5] = NULL;
		*nparams = 6;
		return (PAYMENT_COMPLETE_SQL);
	case PROVIDER_DECLINED:
		payment_declined_body(call, problem);
		params[3] = NULL;
		params[4] = "402";
		params[5] = kore_buf_stringify(problem, NULL);
		*nparams = 6;
		return (PAYMENT_COMPLETE_SQL);
	default:
		*nparams = 3;
		return (PAYMENT_RELEASE_SQL);
	}
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
	const char		*params[6];
	char			lease[16];

	(void)snprintf(lease, sizeof(lease), "%u", settings.lease_seconds);

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->op->name;
	params[3] = r->fingerprint;
	params[4] = (const char *)r->canonical.data;
	params[5] = lease;

	return (idem_execute(req, RESERVE_SQL, 6, params));
}

static int
payment_decide(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	const char		*outcome;

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
 * A charge or a decline is saved (complete); a failure gives the lease
 * back (release). Either only with the lease this attempt took.
 */
static int
payment_settle(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	struct kore_buf		problem;
	const char		*params[6], *sql;
	int			n, ret;

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = p->lease_id;

	kore_buf_init(&problem, 256);
	sql = payment_settle_sql(&p->call, p->outcome, params, &n, &problem);
	p->released = (p->outcome == PROVIDER_FAILED ||
	    p->outcome == PROVIDER_TIMED_OUT);
	ret = idem_execute(req, sql, n, params);
	kore_buf_cleanup(&problem);

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

	if (!strcmp(db_call_value(&r->db, 0), "fenced"))
		return (payment_respond_fenced(req));

	return (idem_respond_row(req, 1, 2, 0));
}

/*
 * This worker lost its lease while it waited: another attempt holds or has
 * finished the key, and this result was not written. The client gets what
 * the key holds now.
 */
static int
payment_respond_fenced(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;

	metrics_count(COUNTER_LEASE_FENCED, 1);
	kore_log(LOG_NOTICE, "lease %s of %s:%s was taken over; its late "
	    "result was not written", p->lease_id, r->client_id, r->key);

	if (!strcmp(db_call_value(&r->db, 3), "done"))
		return (idem_respond_row(req, 1, 2, 1));

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
