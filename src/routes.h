/*
 * The handlers kore.conf routes to.
 */

#ifndef __H_ROUTES_H
#define __H_ROUTES_H

#include <kore/kore.h>
#include <kore/http.h>

#define ROUTE_STATES(s)		(sizeof(s) / sizeof((s)[0]))

int	orders(struct http_request *);
int	bonuses(struct http_request *);
int	bonus_balance(struct http_request *);
int	payments(struct http_request *);
int	healthz(struct http_request *);
int	not_found(struct http_request *);
int	v_customer_id(struct http_request *, const void *);

#if defined(DEV_ROUTES)
int	dev_canonical_json(struct http_request *);
#if defined(IDEM_SANITIZE)
int	dev_sanitizer_canary(struct http_request *);
#endif
int	demo_naive_payments(struct http_request *);
int	demo_fresh_provider_key_payments(struct http_request *);
#endif

#endif
