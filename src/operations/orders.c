/*
 * Orders (transactional): POST /v1/orders creates an order and accrues
 * floor(amount / 100) bonus points (sql/010_orders_bonuses.sql,
 * order_create); GET /v1/orders lists a customer's orders.
 */

#include <sys/types.h>

#include "idem.h"
#include "operations.h"
#include "problem.h"
#include "transactional.h"

static int	customer_query(struct http_request *, char *, size_t);

static const struct idem_field	order_fields[] = {
	{ "customer_id",	FIELD_ID,	1, 1 },
	{ "amount",		FIELD_AMOUNT,	1, 1 },
	{ "currency",		FIELD_CURRENCY,	1, 1 },
	{ "comment",		FIELD_TEXT,	0, 1 },
};

const struct idem_operation	order_create_operation = {
	.name = "orders.create",
	.fields = order_fields,
	.nfields = sizeof(order_fields) / sizeof(order_fields[0]),
	.strategy = transactional_run,
};

static const struct idem_read	order_list_read = {
	.sql = "SELECT order_list($1, $2)",
	.arg = "customer_id",
	.parse = customer_query,
	.rule = "a query parameter of 1 to 128 bytes of UTF-8 without "
	    "control characters",
	.not_found = PROBLEM_NOT_FOUND,
};

const struct idem_operation	order_list_operation = {
	.strategy = idem_read_run,
	.read = &order_list_read,
};

static int
customer_query(struct http_request *req, char *out, size_t len)
{
	return (idem_query_arg(req, "customer_id", out, len));
}
