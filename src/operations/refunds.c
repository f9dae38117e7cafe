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
	{ "payment_id",	FIELD_REF,	1, 1 },
	{ "amount",	FIELD_AMOUNT,	1, 1 },
	{ "reason",	FIELD_TEXT,	0, 1 },
};

/* What the provider is sent is its table's (src/lease/provider.c). */
static const struct lease_call	refund_call = {
	.noun = "refund",
	.declined = PROBLEM_REFUND_REJECTED,
	.rejected = PROBLEM_REFUND_REJECTED,
};

const struct idem_operation	refund_create_operation = {
	.name = "refunds.create",
	.fields = refund_fields,
	.nfields = sizeof(refund_fields) / sizeof(refund_fields[0]),
	.strategy = lease_run,
	.call = &refund_call,
};
