/*
 * The one place that writes an error response. The type URL of each
 * problem is a page under /problems/ that this service serves from assets/.
 */

#include <sys/types.h>

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "accesslog.h"
#include "json.h"
#include "problem.h"
#include "settings.h"

static void	page_handler(const char *, char *, size_t);

struct problem_type {
	int		status;
	const char	*slug;
	const char	*title;
};

static const struct problem_type	problems[PROBLEM_MAX] = {
	[PROBLEM_UNAUTHORIZED] = { 401, "unauthorized",
	    "Missing or unknown bearer token" },
	[PROBLEM_KEY_MISSING] = { 400, "idempotency-key-missing",
	    "Idempotency-Key header is required" },
	[PROBLEM_KEY_MALFORMED] = { 400, "idempotency-key-malformed",
	    "Idempotency-Key header is malformed" },
	[PROBLEM_MEDIA_TYPE] = { 415, "unsupported-media-type",
	    "Request body must be application/json" },
	[PROBLEM_BODY_TOO_LARGE] = { 413, "body-too-large",
	    "Request body is too large" },
	[PROBLEM_INVALID_JSON] = { 400, "invalid-json",
	    "Request body is not valid JSON" },
	[PROBLEM_INVALID_REQUEST] = { 400, "invalid-request",
	    "Request is missing a field or has an ill-typed one" },
	[PROBLEM_KEY_REUSED] = { 422, "idempotency-key-reused",
	    "Idempotency-Key was already used for a different request" },
	[PROBLEM_IN_PROGRESS] = { 409, "request-in-progress",
	    "A request with this Idempotency-Key is still in progress" },
	[PROBLEM_INSUFFICIENT_BALANCE] = { 422, "insufficient-balance",
	    "Insufficient bonus balance" },
	[PROBLEM_CARD_DECLINED] = { 402, "card-declined",
	    "The payment was declined" },
	[PROBLEM_PROVIDER_UNAVAILABLE] = { 502, "provider-unavailable",
	    "The payment provider failed" },
	[PROBLEM_PROVIDER_TIMEOUT] = { 504, "provider-timeout",
	    "The payment provider did not answer in time" },
	[PROBLEM_DATABASE_UNAVAILABLE] = { 503, "database-unavailable",
	    "The database is unavailable" },
	[PROBLEM_DATABASE_MISCONFIGURED] = { 503, "database-misconfigured",
	    "The database refuses the service's connection or schema" },
	[PROBLEM_PROVIDER_RATE_LIMITED] = { 503, "provider-rate-limited",
	    "The payment provider is limiting the service's requests" },
	[PROBLEM_OUTCOME_PENDING] = { 503, "outcome-pending",
	    "The provider's outcome is not known yet" },
	[PROBLEM_NOT_FOUND] = { 404, "not-found", "No such resource" },
	[PROBLEM_METHOD_NOT_ALLOWED] = { 405, "method-not-allowed",
	    "Method not allowed on this resource" },
	[PROBLEM_INTERNAL] = { 500, "internal-error",
	    "Internal server error" },
	[PROBLEM_PAYMENT_REJECTED] = { 422, "payment-rejected",
	    "The payment provider refused the payment" },
	[PROBLEM_KEY_EXPIRED] = { 410, "idempotency-key-expired",
	    "The outcome of this Idempotency-Key is no longer kept" },
	[PROBLEM_BALANCE_LIMIT] = { 422, "balance-limit-exceeded",
	    "Bonus balance would pass 2^53-1" },
	[PROBLEM_PAYMENT_NOT_FOUND] = { 404, "payment-not-found",
	    "No such payment of this client" },
	[PROBLEM_REFUND_EXCEEDS] = { 422, "refund-exceeds-payment",
	    "The refund exceeds what is left of the payment" },
	[PROBLEM_REFUND_IN_PROGRESS] = { 409, "refund-in-progress",
	    "Other refunds of this payment are in progress" },
	[PROBLEM_REFUND_REJECTED] = { 422, "refund-rejected",
	    "The payment provider refused the refund" },
};

const char *
problem_title(int problem)
{
	return (problems[problem].title);
}

int
problem_status(int problem)
{
	return (problems[problem].status);
}

void
problem_type_url(int problem, char *buf, size_t len)
{
	int		n;

	n = snprintf(buf, len, "%s/problems/%s", settings.public_url,
	    problems[problem].slug);
	if (n < 0 || (size_t)n >= len)
		fatal("%s: IDEM_PUBLIC_URL is too long", __func__);
}

void
problem_body(struct kore_buf *buf, int problem, const char *detail)
{
	char		url[512];

	problem_type_url(problem, url, sizeof(url));

	kore_buf_append(buf, "{\"type\":", 8);
	json_append_string(buf, url, strlen(url));
	kore_buf_append(buf, ",\"title\":", 9);
	json_append_string(buf, problems[problem].title,
	    strlen(problems[problem].title));
	kore_buf_appendf(buf, ",\"status\":%d,\"detail\":",
	    problems[problem].status);
	json_append_string(buf, detail, strlen(detail));
	kore_buf_append(buf, "}", 1);
}

void
problem_respond(struct http_request *req, int problem, const char *fmt, ...)
{
	struct kore_buf		buf;
	va_list			args;
	char			detail[512];

	va_start(args, fmt);
	(void)vsnprintf(detail, sizeof(detail), fmt, args);
	va_end(args);

	kore_buf_init(&buf, 256);
	problem_body(&buf, problem, detail);

	http_response_header(req, "content-type", PROBLEM_CONTENT_TYPE);
	http_response(req, problems[problem].status, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
}

int
problem_not_found(struct http_request *req)
{
	problem_respond(req, PROBLEM_NOT_FOUND, "%s is not a resource of "
	    "this API", req->path);

	return (KORE_RESULT_OK);
}

/*
 * Routes /problems/<slug> to problem_page(), which serves the page
 * assets/<slug>.html that kodev compiled in (its handler
 * asset_serve_<slug, - as _>_html), so that a problem is one line of the
 * table above and one page.
 */
void
problem_routes_register(const char *server)
{
	struct kore_server	*srv;
	struct kore_domain	*dom;
	char			path[128], handler[128];
	int			i;

	if ((srv = kore_server_lookup(server)) == NULL ||
	    (dom = kore_domain_lookup(srv, "*")) == NULL)
		fatal("no domain * in server %s", server);

	for (i = 0; i < PROBLEM_MAX; i++) {
		(void)snprintf(path, sizeof(path), "/problems/%s",
		    problems[i].slug);
		page_handler(problems[i].slug, handler, sizeof(handler));
		if (kore_module_getsym(handler, NULL) == NULL)
			fatal("no page for problem %s", problems[i].slug);
		if (!kore_module_handler_new(dom, path, "problem_page", NULL,
		    HANDLER_TYPE_STATIC))
			fatal("cannot route %s", path);
	}
}

/*
 * GET /problems/<slug>: the page, by kodev's handler. Any other method is
 * a 405 problem: kodev's handler would answer it a bare 400.
 */
int
problem_page(struct http_request *req)
{
	int		(*serve)(struct http_request *);
	char		handler[128];
	int		ret;

	if (req->method != HTTP_METHOD_GET) {
		http_response_header(req, "allow", "GET");
		problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED,
		    "%s accepts GET only", req->path);
		access_log_plain(req, "method_not_allowed");
		return (KORE_RESULT_OK);
	}

	page_handler(req->path + strlen("/problems/"), handler,
	    sizeof(handler));
	if ((serve = (int (*)(struct http_request *))kore_module_getsym(
	    handler, NULL)) == NULL)
		ret = problem_not_found(req);
	else
		ret = serve(req);
	access_log_plain(req, req->status == HTTP_STATUS_OK ? "ok" : "-");

	return (ret);
}

static void
page_handler(const char *slug, char *handler, size_t len)
{
	char		*p;

	(void)snprintf(handler, len, "asset_serve_%s_html", slug);
	for (p = handler; *p != '\0'; p++) {
		if (*p == '-')
			*p = '_';
	}
}

/*
 * The table as JSON (GET /dev/problems), so that a test can check that
 * the SQL's problem types agree with it.
 */
void
problem_table_json(struct kore_buf *buf)
{
	int		i;

	kore_buf_append(buf, "[", 1);
	for (i = 0; i < PROBLEM_MAX; i++) {
		kore_buf_appendf(buf, "%s{\"slug\":", i > 0 ? "," : "");
		json_append_string(buf, problems[i].slug,
		    strlen(problems[i].slug));
		kore_buf_appendf(buf, ",\"status\":%d,\"title\":",
		    problems[i].status);
		json_append_string(buf, problems[i].title,
		    strlen(problems[i].title));
		kore_buf_append(buf, "}", 1);
	}
	kore_buf_append(buf, "]", 1);
}
