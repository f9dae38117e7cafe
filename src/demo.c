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
 * crash is a second charge.
 */

#include <sys/types.h>

#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "metrics.h"
#include "payments.h"
#include "problem.h"
#include "reload.h"
#include "routes.h"

#if defined(DEV_ROUTES)

#define NAIVE_LOOKUP_SQL						\
	"SELECT status_code, response FROM idempotency_keys "		\
	"WHERE client_id = $1 AND idem_key = $2"

#define NAIVE_SAVE_SQL							\
	"SELECT status_code, response FROM "				\
	"demo_naive_save($1, $2, $3, $4::jsonb, $5)"

static int	naive_lookup(struct http_request *);
static int	naive_decide(struct http_request *);
static int	naive_save(struct http_request *);
static int	naive_respond(struct http_request *);

static const struct idem_operation	naive_operation = {
	"demo.naive", ROUTE_DEMO_NAIVE, payment_fields, PAYMENT_NFIELDS
};

static const struct idem_operation	fresh_key_operation = {
	"demo.fresh-provider-key", ROUTE_DEMO_FRESH_KEY, payment_fields,
	PAYMENT_NFIELDS
};

static struct http_state	naive_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(naive_lookup),
	KORE_HTTP_STATE(naive_decide),
	KORE_HTTP_STATE(payment_charge),
	KORE_HTTP_STATE(naive_save),
	KORE_HTTP_STATE(naive_respond),
};

int
demo_naive_payments(struct http_request *req)
{
	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	(void)payment_start(req, ROUTE_DEMO_NAIVE, &naive_operation,
	    PROVIDER_KEY_FRESH);

	if (!idem_method(req, HTTP_METHOD_POST, "POST"))
		return (KORE_RESULT_OK);

	return (http_state_run(naive_states, ROUTE_STATES(naive_states), req));
}

int
demo_fresh_provider_key_payments(struct http_request *req)
{
	return (payment_run(req, ROUTE_DEMO_FRESH_KEY, &fresh_key_operation,
	    PROVIDER_KEY_FRESH));
}

static int
naive_lookup(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[2];

	params[0] = r->client_id;
	params[1] = r->key;

	return (idem_execute(req, NAIVE_LOOKUP_SQL, 2, params));
}

static int
naive_decide(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (db_call_rows(&r->db) == 1)
		return (idem_respond_row(req, 0, 1, 1));

	idem_db_reset(r);
	req->fsm_state++;

	return (HTTP_STATE_CONTINUE);
}

static int
naive_save(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct payment		*p = r->extra;
	struct kore_buf		problem;
	const char		*params[5];

	switch (p->outcome) {
	case PROVIDER_CHARGED:
		params[0] = r->client_id;
		params[1] = r->key;
		params[2] = r->fingerprint;
		params[3] = (const char *)r->canonical.data;
		params[4] = p->call.charge_id;
		return (idem_execute(req, NAIVE_SAVE_SQL, 5, params));
	case PROVIDER_DECLINED:
		kore_buf_init(&problem, 256);
		payment_declined_body(&p->call, &problem);
		idem_respond(req, HTTP_STATUS_PAYMENT_REQUIRED, problem.data,
		    problem.offset, 0);
		kore_buf_cleanup(&problem);
		return (HTTP_STATE_COMPLETE);
	default:
		return (payment_fail_provider(req));
	}
}

static int
naive_respond(struct http_request *req)
{
	return (idem_respond_row(req, 0, 1, 0));
}

#endif
