/*
 * Bonus transfers (transactional): POST /v1/bonuses/transfers moves points
 * from one customer of the client to another (sql/011_bonus_transfers.sql,
 * bonus_transfer: an insufficient balance is a saved 422).
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include "idem.h"
#include "operations.h"
#include "transactional.h"

static int	transfer_check(struct json_value *, char *, size_t);

static const struct idem_field	transfer_fields[] = {
	{ "from_customer_id",	FIELD_ID,		1, 1, "Who gives." },
	{ "to_customer_id",	FIELD_ID,		1, 1,
	    "Who receives; differs from from_customer_id." },
	{ "points",		FIELD_POINTS_POSITIVE,	1, 1, "Points moved." },
	{ "reason",		FIELD_TEXT,		1, 1, "Why." },
};

static const struct idem_field	transfer_answer[] = {
	{ "transfer_id",	FIELD_REF,	1, 0, "The transfer." },
	{ "from_customer_id",	FIELD_ID,	1, 0, "Who gave." },
	{ "to_customer_id",	FIELD_ID,	1, 0, "Who received." },
	{ "points",		FIELD_POINTS_POSITIVE, 1, 0, "Points moved." },
	{ "from_balance",	FIELD_COUNT,	1, 0, "The giver's new balance." },
	{ "to_balance",		FIELD_COUNT,	1, 0,
	    "The receiver's new balance." },
};

const struct idem_operation	bonus_transfer_operation = {
	.name = "bonuses.transfer",
	.summary = "Move points from one customer to another",
	.doc = "Transactional: two ledger rows and both balances in one "
	    "transaction; transfers in opposite directions never deadlock.",
	IDEM_FIELDS(transfer_fields),
	IDEM_ANSWER(transfer_answer),
	.check = transfer_check,
	.strategy = transactional_run,
};

/*
 * A transfer to the sender itself would move nothing; it is a mistake of
 * the client's, not an outcome to save. The ids are compared as decoded,
 * so "c-1" and "c\u002d1" are the same customer.
 */
static int
transfer_check(struct json_value *body, char *why, size_t len)
{
	struct json_value	*from, *to;

	from = json_member(body, "from_customer_id");
	to = json_member(body, "to_customer_id");

	if (from->len != to->len || memcmp(from->str, to->str, from->len))
		return (KORE_RESULT_OK);

	(void)snprintf(why, len, "from_customer_id and to_customer_id must "
	    "be two different customers");

	return (KORE_RESULT_ERROR);
}
