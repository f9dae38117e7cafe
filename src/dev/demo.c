/*
 * The demo strategies, in the dev build only, so that tests can show what
 * the lease strategy prevents. Neither belongs in a real service.
 *
 * POST /demo/naive/payments: look the key up, charge, then insert the key.
 * Two concurrent requests both find nothing and both charge; the second
 * insert fails on the primary key (a 500), too late for the money.
 *
 * POST /demo/fresh-provider-key/payments: the lease strategy, except that
 * every attempt gives the provider a new random key, so an attempt after a
 * crash is a second charge. It is the lease strategy itself, run with
 * another provider call.
 */

#include <sys/types.h>

#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "lease.h"
#include "operations.h"
#include "problem.h"

#if defined(DEV_ROUTES)

#define NAIVE_LOOKUP_SQL						\
	"SELECT status_code, response FROM idempotency_keys "		\
	"WHERE client_id = $1 AND idem_key = $2"

#define NAIVE_SAVE_SQL							\
	"SELECT status_code, response FROM "				\
	"demo_naive_save($1, $2, $3, $4::jsonb, $5)"

#define NAIVE_STATE_LOOKUP	IDEM_STATE_STRATEGY
#define NAIVE_STATE_DECIDE	(IDEM_STATE_STRATEGY + 1)
#define NAIVE_STATE_CALL	(IDEM_STATE_STRATEGY + 2)
#define NAIVE_STATE_SAVE	(IDEM_STATE_STRATEGY + 3)
#define NAIVE_STATE_RESPOND	(IDEM_STATE_STRATEGY + 4)

static int	naive_run(struct http_request *);
static int	naive_lookup(struct http_request *);
static int	naive_decide(struct http_request *);
static int	naive_call(struct http_request *);
static int	naive_save(struct http_request *);
static int	naive_respond(struct http_request *);
static void	naive_free(struct idem_request *);

/* A new random provider key on every attempt. */
static const struct lease_call	fresh_key_call = {
	.noun = "payment",
	.provider_op = "payments.create",
	.declined = PROBLEM_CARD_DECLINED,
	.rejected = PROBLEM_PAYMENT_REJECTED,
	.fresh_key = 1,
};

const struct idem_operation	demo_naive_operation = {
	.name = "demo.naive",
	IDEM_FIELDS(payment_fields),
	.strategy = naive_run,
};

/* Registered as a lease operation by dev/003_demo.sql, never recovered. */
const struct idem_operation	demo_fresh_key_operation = {
	.name = "demo.fresh-provider-key",
	IDEM_FIELDS(payment_fields),
	.strategy = lease_run,
	.call = &fresh_key_call,
};

static struct http_state	naive_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(naive_lookup),
	KORE_HTTP_STATE(naive_decide),
	KORE_HTTP_STATE(naive_call),
	KORE_HTTP_STATE(naive_save),
	KORE_HTTP_STATE(naive_respond),
};

static int
naive_run(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (r->lease == NULL) {
		r->lease = kore_calloc(1, sizeof(*r->lease));
		r->strategy_free = naive_free;
	}

	return (http_state_run(naive_states,
	    sizeof(naive_states) / sizeof(naive_states[0]), req));
}

static int
naive_lookup(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[2];

	params[0] = r->client_id;
	params[1] = r->key;

	return (idem_execute(req, NAIVE_STATE_DECIDE, NAIVE_LOOKUP_SQL, 2,
	    params));
}

static int
naive_decide(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (db_call_rows(&r->db) == 1)
		return (idem_respond_row(req, 1));

	idem_db_reset(r);
	lease_attempt_init(&r->lease->attempt, &fresh_key_call,
	    "demo.fresh-provider-key", r->client_id, r->key, "0", 1);
	req->fsm_state = NAIVE_STATE_CALL;

	return (HTTP_STATE_CONTINUE);
}

static int
naive_call(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (!lease_attempt_call(&r->lease->attempt,
	    (const char *)r->request.data,
	    r->request.offset, req)) {
		http_request_sleep(req);
		return (HTTP_STATE_RETRY);
	}

	req->fsm_state = NAIVE_STATE_SAVE;
	return (HTTP_STATE_CONTINUE);
}

static int
naive_save(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct lease_attempt	*a = &r->lease->attempt;
	struct kore_buf		problem;
	const char		*params[5];
	int			code;

	switch (a->answer->class) {
	case PROVIDER_SUCCESS:
		params[0] = r->client_id;
		params[1] = r->key;
		params[2] = r->fingerprint;
		params[3] = (const char *)r->request.data;
		params[4] = a->pcall.id;
		return (idem_execute(req, NAIVE_STATE_RESPOND, NAIVE_SAVE_SQL,
		    5, params));
	case PROVIDER_REFUSED:
		code = lease_problem(a);
		kore_buf_init(&problem, 256);
		problem_body(&problem, code, a->pcall.detail);
		idem_respond(req, problem_status(code), problem.data,
		    problem.offset, 0);
		kore_buf_cleanup(&problem);
		return (HTTP_STATE_COMPLETE);
	default:
		return (idem_fail(req, a->answer->problem, "%s; retry with the "
		    "same Idempotency-Key", a->pcall.detail));
	}
}

static int
naive_respond(struct http_request *req)
{
	return (idem_respond_row(req, 0));
}

static void
naive_free(struct idem_request *r)
{
	lease_attempt_cleanup(&r->lease->attempt);
	kore_free(r->lease);
	r->lease = NULL;
}

#endif
