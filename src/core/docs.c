/*
 * GET /openapi.json, the OpenAPI document (docs/openapi.json, written by
 * scripts/openapi.py), and GET /docs, the page that renders it in the
 * browser (assets/docs.html). Both are compiled in by kodev from assets/,
 * so that the service always serves the document of the code it runs and
 * the page loads nothing from elsewhere.
 */

#include <sys/types.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "accesslog.h"
#include "assets.h"
#include "docs.h"
#include "problem.h"

int	docs_openapi(struct http_request *);
int	docs_page(struct http_request *);

static int	get_only(struct http_request *);

/*
 * Routed from code, beside the problem pages, rather than in kore.conf:
 * kore.conf lists only what the operations' route table cannot.
 */
void
docs_routes_register(const char *server)
{
	struct kore_server	*srv;
	struct kore_domain	*dom;

	if ((srv = kore_server_lookup(server)) == NULL ||
	    (dom = kore_domain_lookup(srv, "*")) == NULL)
		fatal("no domain * in server %s", server);

	if (!kore_module_handler_new(dom, "/openapi.json", "docs_openapi",
	    NULL, HANDLER_TYPE_STATIC) ||
	    !kore_module_handler_new(dom, "/docs", "docs_page", NULL,
	    HANDLER_TYPE_STATIC))
		fatal("cannot route the documentation");
}

int
docs_openapi(struct http_request *req)
{
	int		ret;

	if (!get_only(req))
		return (KORE_RESULT_OK);

	/* A browser page served elsewhere (an editor, a viewer) may read it. */
	http_response_header(req, "access-control-allow-origin", "*");
	ret = asset_serve_openapi_json(req);
	access_log_plain(req, "ok");

	return (ret);
}

int
docs_page(struct http_request *req)
{
	int		ret;

	if (!get_only(req))
		return (KORE_RESULT_OK);

	/* The page talks to this origin only: nothing leaves the machine. */
	http_response_header(req, "content-security-policy",
	    "default-src 'self'; script-src 'unsafe-inline'; "
	    "style-src 'unsafe-inline'; connect-src 'self'");
	ret = asset_serve_docs_html(req);
	access_log_plain(req, "ok");

	return (ret);
}

/*
 * Kore's asset handlers answer another method a bare 400: the service's
 * answer is a 405 problem, as everywhere else.
 */
static int
get_only(struct http_request *req)
{
	if (req->method == HTTP_METHOD_GET)
		return (KORE_RESULT_OK);

	http_response_header(req, "allow", "GET");
	problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED, "%s accepts GET only",
	    req->path);
	access_log_plain(req, "method_not_allowed");

	return (KORE_RESULT_ERROR);
}
