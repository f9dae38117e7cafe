/*
 * Bonus points (transactional): POST /v1/bonuses accrues or redeems
 * points (sql/010_orders_bonuses.sql, bonus_apply: an insufficient
 * balance is a saved 422); GET /v1/bonuses/{customer_id} is a balance.
 */

#include <sys/types.h>

#include "idem.h"
#include "operations.h"
#include "problem.h"
#include "transactional.h"

static const struct idem_field	bonus_fields[] = {
	{ "customer_id",	FIELD_ID,	1, 1 },
	{ "points",		FIELD_POINTS,	1, 1 },
	{ "reason",		FIELD_TEXT,	1, 1 },
};

const struct idem_operation	bonus_apply_operation = {
	.name = "bonuses.apply",
	.fields = bonus_fields,
	.nfields = sizeof(bonus_fields) / sizeof(bonus_fields[0]),
	.strategy = transactional_run,
};

static const struct idem_read	bonus_balance_read = {
	.sql = "SELECT bonus_balance($1, $2)",
	.arg = "the customer id in the path",
	.parse = idem_path_arg,
	.rule = "1 to 128 bytes of UTF-8 without control characters, "
	    "percent-encoded (%XX; + is a plus)",
	.not_found = PROBLEM_NOT_FOUND,
};

const struct idem_operation	bonus_balance_operation = {
	.strategy = idem_read_run,
	.read = &bonus_balance_read,
};
