/*
 * Payments (lease): POST /v1/payments charges through the provider's
 * POST /v1/charges with a key derived from the client's; a charge is
 * saved as a payment (sql/020_payments.sql, payment_settle).
 * GET /v1/payments/{payment_id} reads one with its refunds
 * (sql/030_refunds.sql, payment_read).
 */

#include <sys/types.h>

#include "idem.h"
#include "lease.h"
#include "operations.h"
#include "problem.h"

static int	payment_check(struct json_value *, char *, size_t);

const struct idem_field	payment_fields[PAYMENT_NFIELDS] = {
	{ "amount",	FIELD_AMOUNT,	1, 1 },
	{ "currency",	FIELD_CURRENCY,	1, 1 },
	{ "recipient",	FIELD_ID,	1, 1 },
	{ "purpose",	FIELD_TEXT,	0, 1 },
	{ "payment_method", FIELD_TOKEN, 0, 1 },
};

/* What the provider is sent is its table's (src/lease/provider.c). */
static const struct lease_call	charge_call = {
	.noun = "payment",
	.declined = PROBLEM_CARD_DECLINED,
	.rejected = PROBLEM_PAYMENT_REJECTED,
};

const struct idem_operation	payment_create_operation = {
	.name = "payments.create",
	.fields = payment_fields,
	.nfields = PAYMENT_NFIELDS,
	.check = payment_check,
	.strategy = lease_run,
	.call = &charge_call,
};

static const struct idem_read	payment_read = {
	.sql = "SELECT payment_read($1, $2::bigint)",
	.arg = "payment_id",
	.parse = idem_path_ref,
	.rule = "an integer id from 1 to 9007199254740991 in the path",
	.not_found = PROBLEM_PAYMENT_NOT_FOUND,
};

const struct idem_operation	payment_read_operation = {
	.strategy = idem_read_run,
	.read = &payment_read,
};

/* What the provider needs of a payment (Stripe: a payment_method). */
static int
payment_check(struct json_value *body, char *err, size_t len)
{
	return (provider_check("payments.create", body, err, len));
}
