/*
 * The handler every route goes through; the operations themselves are
 * declared where they are routed (routes.c).
 */

#ifndef __H_OPERATIONS_H
#define __H_OPERATIONS_H

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"

/* The payment's fields, shared with the demos. */
#define PAYMENT_NFIELDS		5
extern const struct idem_field		payment_fields[PAYMENT_NFIELDS];

int	api_dispatch(struct http_request *);
void	routes_register(const char *);

#endif
