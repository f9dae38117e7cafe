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
	{ "amount",	FIELD_AMOUNT,	1, 1, "The charge." },
	{ "currency",	FIELD_CURRENCY,	1, 1, "Its currency." },
	{ "recipient",	FIELD_ID,	1, 1, "Who is paid (the fake provider's "
	    "magic recipients: decline, fail, slow, reject)." },
	{ "purpose",	FIELD_TEXT,	0, 1, "Free text." },
	{ "payment_method", FIELD_TOKEN, 0, 1, "The provider's reference to "
	    "the means of payment: Stripe's source, e.g. tok_visa. Required "
	    "when the service runs with IDEM_PROVIDER_KIND=stripe (a 400 "
	    "before the key is taken)." },
};

/* A payment as both its creation and its read answer it. */
#define PAYMENT_MEMBERS							\
	{ "payment_id",	FIELD_REF,	1, 0, "The payment." },		\
	{ "charge_id",	FIELD_STRING,	1, 0, "The provider's charge." },	\
	{ "status",	FIELD_STRING,	1, 0, "Always succeeded.",	\
	    .values = "succeeded" },					\
	{ "amount",	FIELD_AMOUNT,	1, 0, "Minor units." },		\
	{ "currency",	FIELD_CURRENCY,	1, 0, "Its currency." }

static const struct idem_field	payment_answer[] = {
	PAYMENT_MEMBERS,
};

static const struct idem_field	payment_refund[] = {
	{ "refund_id",	FIELD_REF,	1, 0, "The refund." },
	{ "amount",	FIELD_AMOUNT,	1, 0, "Minor units." },
	{ "status",	FIELD_STRING,	1, 0, "Where it stands.",
	    .values = "pending|succeeded|rejected" },
};

static const struct idem_field	payment_read_answer[] = {
	PAYMENT_MEMBERS,
	{ "refunded",	FIELD_COUNT,	1, 0,
	    "The sum of its succeeded refunds." },
	{ "refunds",	FIELD_LIST,	1, 0, "Every refund, whatever its "
	    "status.", IDEM_ITEMS(payment_refund) },
};

/* What the provider is sent is its table's (src/lease/provider.c). */
static const struct lease_call	charge_call = {
	.noun = "payment",
	.declined = PROBLEM_CARD_DECLINED,
	.rejected = PROBLEM_PAYMENT_REJECTED,
};

const struct idem_operation	payment_create_operation = {
	.name = "payments.create",
	.summary = "Charge through the payment provider",
	.doc = "Lease strategy: the key is taken with a lease before the "
	    "provider is called with Idempotency-Key `<client_id>:<key>`. A "
	    "duplicate while the lease holds is a 409 with Retry-After; a "
	    "provider failure (502, 504) is not saved and the lease is "
	    "released, so that a retry with the same key goes on; a decline "
	    "(402) or a refusal (422 payment-rejected) is saved and replayed.",
	IDEM_FIELDS(payment_fields),
	IDEM_ANSWER(payment_answer),
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
	.summary = "A payment and its refunds",
	.doc = "Only the calling client's payments.",
	IDEM_ANSWER(payment_read_answer),
	.strategy = idem_read_run,
	.read = &payment_read,
};

/* What the provider needs of a payment (Stripe: a payment_method). */
static int
payment_check(struct json_value *body, char *err, size_t len)
{
	return (provider_check("payments.create", body, err, len));
}
