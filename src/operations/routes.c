/*
 * Every route of the API, in one place: method, Kore path, the label the
 * metrics give it, and the operation that serves it. The route's index is
 * its id. Adding an operation adds its declaration and its route here, its
 * file beside this one, its SQL and its test (docs/adding-an-operation.md).
 *
 * Kore routes every path of this table to api_dispatch(), which finds the
 * line of the path Kore matched and the request's method, and runs the
 * operation's strategy.
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "accesslog.h"
#include "idem.h"
#include "operations.h"
#include "problem.h"
#include "reload.h"

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

const struct idem_route	idem_routes[] = {
	{ HTTP_METHOD_POST, "/v1/orders", "POST /v1/orders",
	    &order_create_operation },
	{ HTTP_METHOD_GET, "/v1/orders", "GET /v1/orders",
	    &order_list_operation },
	{ HTTP_METHOD_POST, "/v1/bonuses", "POST /v1/bonuses",
	    &bonus_apply_operation },
	{ HTTP_METHOD_GET, "^/v1/bonuses/[^/]+$",
	    "GET /v1/bonuses/{customer_id}", &bonus_balance_operation },
	/* Routed before the pattern above (routes_register): a GET is a 405. */
	{ HTTP_METHOD_POST, "/v1/bonuses/transfers",
	    "POST /v1/bonuses/transfers", &bonus_transfer_operation },
	{ HTTP_METHOD_POST, "/v1/payments", "POST /v1/payments",
	    &payment_create_operation },
	{ HTTP_METHOD_GET, "^/v1/payments/[^/]+$",
	    "GET /v1/payments/{payment_id}", &payment_read_operation },
	{ HTTP_METHOD_POST, "/v1/refunds", "POST /v1/refunds",
	    &refund_create_operation },
#if defined(DEV_ROUTES)
	{ HTTP_METHOD_POST, "/demo/naive/payments",
	    "POST /demo/naive/payments", &demo_naive_operation },
	{ HTTP_METHOD_POST, "/demo/fresh-provider-key/payments",
	    "POST /demo/fresh-provider-key/payments",
	    &demo_fresh_key_operation },
#endif
};

const size_t	idem_nroutes = sizeof(idem_routes) / sizeof(idem_routes[0]);

static const char	*method_name(int);

/*
 * Routes every path of the table to api_dispatch(), in the API's server:
 * exact paths first, so that /v1/x/y is not taken by a pattern /v1/x/[^/]+.
 */
void
routes_register(const char *server)
{
	struct kore_server	*srv;
	struct kore_domain	*dom;
	size_t			i, j;
	int			pass, type;

	if ((srv = kore_server_lookup(server)) == NULL ||
	    (dom = kore_domain_lookup(srv, "*")) == NULL)
		fatal("no domain * in server %s", server);

	for (pass = 0; pass < 2; pass++) {
		for (i = 0; i < idem_nroutes; i++) {
			type = idem_routes[i].path[0] == '/' ?
			    HANDLER_TYPE_STATIC : HANDLER_TYPE_DYNAMIC;
			if ((pass == 0) != (type == HANDLER_TYPE_STATIC))
				continue;
			/* One Kore route per path, whatever its methods. */
			for (j = 0; j < i; j++) {
				if (!strcmp(idem_routes[j].path,
				    idem_routes[i].path))
					break;
			}
			if (j < i)
				continue;
			if (!kore_module_handler_new(dom, idem_routes[i].path,
			    "api_dispatch", NULL, type))
				fatal("cannot route %s", idem_routes[i].path);
		}
	}
}

int
api_dispatch(struct http_request *req)
{
	struct idem_request	*r;
	char			allow[64];
	size_t			i, n;

	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	if (!http_state_exists(req)) {
		allow[0] = '\0';
		for (i = 0; i < idem_nroutes; i++) {
			if (strcmp(idem_routes[i].path, req->hdlr->path))
				continue;
			if (idem_routes[i].method == req->method)
				break;
			n = strlen(allow);
			(void)snprintf(allow + n, sizeof(allow) - n, "%s%s",
			    n > 0 ? ", " : "", method_name(idem_routes[i].method));
		}

		if (i == idem_nroutes) {
			http_response_header(req, "allow", allow);
			problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED,
			    "%s accepts %s only", req->path, allow);
			access_log_plain(req, "method_not_allowed");
			return (KORE_RESULT_OK);
		}

		(void)idem_request(req, (int)i, idem_routes[i].op);
	}

	r = http_state_get(req);

	return (r->op->strategy(req));
}

static const char *
method_name(int method)
{
	switch (method) {
	case HTTP_METHOD_GET:
		return ("GET");
	case HTTP_METHOD_POST:
		return ("POST");
	default:
		return ("?");
	}
}
