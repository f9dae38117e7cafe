/*
 * POST /v1/orders and GET /v1/orders: the transactional strategy. The key
 * and the order are written by one call of order_create().
 */

#include <sys/types.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"
#include "routes.h"

#define ORDER_CREATE_SQL						\
	"SELECT outcome, status_code, response FROM "			\
	"order_create($1, $2, $3, $4, $5::bigint, $6, $7, $8, $9)"

#define ORDER_LIST_SQL		"SELECT order_list($1, $2)"

static int	order_create(struct http_request *);
static int	order_list(struct http_request *);
static int	order_create_execute(struct http_request *);
static int	order_list_execute(struct http_request *);

static const struct idem_field	order_fields[] = {
	{ "customer_id",	FIELD_ID,	1, 1 },
	{ "amount",		FIELD_AMOUNT,	1, 1 },
	{ "currency",		FIELD_CURRENCY,	1, 1 },
	{ "comment",		FIELD_TEXT,	0, 1 },
};

static const struct idem_operation	order_operation = {
	"orders.create", ROUTE_ORDERS_CREATE, order_fields,
	sizeof(order_fields) / sizeof(order_fields[0])
};

static struct http_state	create_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(order_create_execute),
	KORE_HTTP_STATE(idem_respond_outcome),
};

static struct http_state	list_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(order_list_execute),
	KORE_HTTP_STATE(idem_respond_read),
};

int
orders(struct http_request *req)
{
	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	switch (req->method) {
	case HTTP_METHOD_POST:
		return (order_create(req));
	case HTTP_METHOD_GET:
		return (order_list(req));
	default:
		(void)idem_method(req, HTTP_METHOD_POST, "GET, POST");
		return (KORE_RESULT_OK);
	}
}

static int
order_create(struct http_request *req)
{
	(void)idem_request(req, ROUTE_ORDERS_CREATE, &order_operation);

	return (http_state_run(create_states, ROUTE_STATES(create_states),
	    req));
}

static int
order_list(struct http_request *req)
{
	(void)idem_request(req, ROUTE_ORDERS_LIST, NULL);

	return (http_state_run(list_states, ROUTE_STATES(list_states), req));
}

static int
order_create_execute(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[9];
	char			limit_type[512];

	problem_type_url(PROBLEM_BALANCE_LIMIT, limit_type, sizeof(limit_type));

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->fingerprint;
	params[3] = r->values[0];
	params[4] = r->values[1];
	params[5] = r->values[2];
	params[6] = r->values[3];
	params[7] = limit_type;
	params[8] = problem_title(PROBLEM_BALANCE_LIMIT);

	return (idem_execute(req, ORDER_CREATE_SQL, 9, params));
}

static int
order_list_execute(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[2];
	char			*customer;

	if (!r->db_active) {
		http_populate_get(req);
		if (!http_argument_get_string(req, "customer_id", &customer)) {
			return (idem_fail(req, PROBLEM_INVALID_REQUEST,
			    "customer_id query parameter is required: a "
			    "string of 1 to 128 bytes without control "
			    "characters"));
		}
		r->values[0] = customer;
	}

	params[0] = r->client_id;
	params[1] = r->values[0];

	return (idem_execute(req, ORDER_LIST_SQL, 2, params));
}
