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
	{ "customer_id",	FIELD_ID,	1, 1, "The customer." },
	{ "amount",		FIELD_AMOUNT,	1, 1, "The order's amount." },
	{ "currency",		FIELD_CURRENCY,	1, 1, "Its currency." },
	{ "comment",		FIELD_TEXT,	0, 1, "Free text." },
};

static const struct idem_field	order_answer[] = {
	{ "order_id",		FIELD_REF,	1, 0, "The order." },
	{ "customer_id",	FIELD_ID,	1, 0, "The customer." },
	{ "amount",		FIELD_AMOUNT,	1, 0, "Minor units." },
	{ "currency",		FIELD_CURRENCY,	1, 0, "Its currency." },
	{ "bonus_points",	FIELD_COUNT,	1, 0,
	    "Points accrued: floor(amount / 100)." },
};

const struct idem_operation	order_create_operation = {
	.name = "orders.create",
	.summary = "Create an order and accrue its bonus points",
	.doc = "Transactional: the key, the order and the accrual of "
	    "floor(amount / 100) points commit together. A concurrent "
	    "duplicate waits for the first and is answered its response as a "
	    "replay; no 409 on this route.",
	IDEM_FIELDS(order_fields),
	IDEM_ANSWER(order_answer),
	.strategy = transactional_run,
};

static const struct idem_field	order_item[] = {
	{ "order_id",		FIELD_REF,	1, 0, "The order." },
	{ "customer_id",	FIELD_ID,	1, 0, "The customer." },
	{ "amount",		FIELD_AMOUNT,	1, 0, "Minor units." },
	{ "currency",		FIELD_CURRENCY,	1, 0, "Its currency." },
	{ "comment",		FIELD_TEXT,	0, 0, "Free text, or null." },
	{ "bonus_points",	FIELD_COUNT,	1, 0, "Points accrued." },
	{ "created_at",		FIELD_TIME,	1, 0, "When it was created." },
};

static const struct idem_field	order_list_answer[] = {
	{ "orders", FIELD_LIST, 1, 0, "The client's latest 100 orders of the "
	    "customer, oldest first.", IDEM_ITEMS(order_item) },
};

static const struct idem_read	order_list_read = {
	.sql = "SELECT order_list($1, $2)",
	.arg = "customer_id",
	.parse = customer_query,
	.rule = "a query parameter of 1 to 128 bytes of UTF-8 without "
	    "control characters",
	.not_found = PROBLEM_NONE,
};

const struct idem_operation	order_list_operation = {
	.summary = "List a customer's orders",
	.doc = "The calling client's latest 100 orders of the customer.",
	IDEM_ANSWER(order_list_answer),
	.strategy = idem_read_run,
	.read = &order_list_read,
};

static int
customer_query(struct http_request *req, char *out, size_t len)
{
	return (idem_query_arg(req, "customer_id", out, len));
}
