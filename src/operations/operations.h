/*
 * The operations of the API, each a table (see idem.h), and the handler
 * every route goes through.
 */

#ifndef __H_OPERATIONS_H
#define __H_OPERATIONS_H

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"

extern const struct idem_operation	order_create_operation;
extern const struct idem_operation	order_list_operation;
extern const struct idem_operation	bonus_apply_operation;
extern const struct idem_operation	bonus_balance_operation;
extern const struct idem_operation	bonus_transfer_operation;
extern const struct idem_operation	payment_create_operation;
extern const struct idem_operation	payment_read_operation;
extern const struct idem_operation	refund_create_operation;

#if defined(DEV_ROUTES)
extern const struct idem_operation	demo_naive_operation;
extern const struct idem_operation	demo_fresh_key_operation;
#endif

/* The payment's fields, shared with the demos. */
#define PAYMENT_NFIELDS		5
extern const struct idem_field		payment_fields[PAYMENT_NFIELDS];

int	api_dispatch(struct http_request *);
void	routes_register(const char *);

#endif
