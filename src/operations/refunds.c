/*
 * Refunds (lease): POST /v1/refunds refunds part or all of a succeeded
 * payment through the provider's POST /v1/refunds, with a key derived
 * from the client's (sql/030_refunds.sql).
 *
 * What the lease strategy does not know, the SQL does: refund_admit()
 * runs in the transaction that takes the key, finds the client's payment
 * and holds the refund's amount on it (a pending refund row), so that two
 * refunds that together exceed the payment cannot both go to the
 * provider; it adds the payment's charge to the request the provider is
 * sent. refund_settle() saves the provider's answer and frees the hold of
 * a refused refund.
 */

#include <sys/types.h>

#include "idem.h"
#include "lease.h"
#include "operations.h"
#include "problem.h"

static const struct idem_field	refund_fields[] = {
	{ "payment_id",	FIELD_REF,	1, 1,
	    "A succeeded payment of the client." },
	{ "amount",	FIELD_AMOUNT,	1, 1, "What to refund." },
	{ "reason",	FIELD_TEXT,	0, 1, "Why." },
};

static const struct idem_field	refund_answer[] = {
	{ "refund_id",	FIELD_REF,	1, 0, "The refund." },
	{ "payment_id",	FIELD_REF,	1, 0, "The payment." },
	{ "provider_refund_id", FIELD_STRING, 1, 0, "The provider's refund." },
	{ "amount",	FIELD_AMOUNT,	1, 0, "Minor units." },
	{ "status",	FIELD_STRING,	1, 0, "Always succeeded.",
	    .values = "succeeded" },
};

/* What the provider is sent is its table's (src/lease/provider.c). */
static const struct lease_call	refund_call = {
	.noun = "refund",
	.declined = PROBLEM_REFUND_REJECTED,
	.rejected = PROBLEM_REFUND_REJECTED,
};

const struct idem_operation	refund_create_operation = {
	.name = "refunds.create",
	.summary = "Refund (part of) a payment",
	.doc = "Lease strategy, as payments. The amount is held when the key "
	    "is taken: a refund past what is left is a 422 "
	    "refund-exceeds-payment, one that fits only if refunds in flight "
	    "fail a 409 refund-in-progress with Retry-After; neither takes "
	    "the key, nor does an unknown payment (404).",
	IDEM_FIELDS(refund_fields),
	IDEM_ANSWER(refund_answer),
	.strategy = lease_run,
	.call = &refund_call,
};
