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
	{ "customer_id",	FIELD_ID,	1, 1, "The customer." },
	{ "points",		FIELD_POINTS,	1, 1,
	    "Points to accrue (> 0) or redeem (< 0)." },
	{ "reason",		FIELD_TEXT,	1, 1, "Why." },
};

static const struct idem_field	bonus_answer[] = {
	{ "entry_id",		FIELD_REF,	1, 0, "The ledger row." },
	{ "customer_id",	FIELD_ID,	1, 0, "The customer." },
	{ "points",		FIELD_POINTS,	1, 0, "Points moved." },
	{ "balance",		FIELD_COUNT,	1, 0, "The new balance." },
};

const struct idem_operation	bonus_apply_operation = {
	.name = "bonuses.apply",
	.summary = "Accrue or redeem bonus points",
	.doc = "Transactional: a ledger row and the new balance. A balance "
	    "that would go below zero or past 2^53-1 is a saved 422.",
	IDEM_FIELDS(bonus_fields),
	IDEM_ANSWER(bonus_answer),
	.strategy = transactional_run,
};

static const struct idem_field	balance_answer[] = {
	{ "customer_id",	FIELD_ID,	1, 0, "The customer." },
	{ "balance",		FIELD_COUNT,	1, 0,
	    "0 for an unknown customer." },
};

static const struct idem_read	bonus_balance_read = {
	.sql = "SELECT bonus_balance($1, $2)",
	.arg = "the customer id in the path",
	.parse = idem_path_arg,
	.rule = "1 to 128 bytes of UTF-8 without control characters, "
	    "percent-encoded (%XX; + is a plus)",
	.not_found = PROBLEM_NONE,
};

const struct idem_operation	bonus_balance_operation = {
	.summary = "A customer's bonus balance",
	.doc = "The calling client's ledger only; 0 for an unknown customer.",
	IDEM_ANSWER(balance_answer),
	.strategy = idem_read_run,
	.read = &bonus_balance_read,
};
