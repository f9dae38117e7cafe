/*
 * Request smuggling, closed in the service itself. Kore 4.1 reads a body
 * on POST, PUT and PATCH only. On GET, HEAD, DELETE and OPTIONS it takes
 * the head, ignores any Content-Length, and once it has answered parses
 * whatever follows on the connection as the next request: a body sent
 * there (past the first 4 KiB read, or in a later packet) becomes a
 * request that a proxy in front never saw, and whose answer that proxy
 * may hand to another client. Kore reads no chunked framing either, nor
 * any Content-Length but the first.
 *
 * So every route runs framing_check() before its handler (an
 * authentication block of type "request", which answers for itself, set
 * on each route by framing_guard_routes()): a Transfer-Encoding, a second
 * Content-Length, or a Content-Length other than 0 on a method whose body
 * Kore does not read, is refused with a problem, and the connection is
 * closed once that answer is sent (CONN_CLOSE_EMPTY: Kore then neither
 * offers keep-alive nor reads the connection again), so that no byte after
 * the head is ever taken for a request. A route given an authentication
 * block of its own (kore.conf) is refused at start: Kore runs one block
 * per route, and the check would be skipped there. Kore's own errors (404, 405 and
 * 400 before a handler) close the connection already.
 */

#include <sys/types.h>

#include <string.h>

#include "accesslog.h"
#include "framing.h"
#include "problem.h"

#define FRAMING_AUTH		"idem_framing"
#define FRAMING_VALIDATOR	"idem_framing"

static int	length_is_zero(const char *);

/*
 * In the parent, after every route is added (kore.conf's and the code's):
 * each route without an authentication block of its own gets this one.
 * The block and its validator live in Kore's memory and are inherited by
 * every worker; a reload looks the validator's function up again by name.
 */
void
framing_guard_routes(void)
{
	struct kore_server		*srv;
	struct kore_domain		*dom;
	struct kore_module_handle	*hdlr;
	struct kore_auth		*auth;

	if (!kore_validator_add(FRAMING_VALIDATOR,
	    KORE_VALIDATOR_TYPE_FUNCTION, "framing_check"))
		fatal("cannot add the validator %s", FRAMING_VALIDATOR);
	if (!kore_auth_new(FRAMING_AUTH) ||
	    (auth = kore_auth_lookup(FRAMING_AUTH)) == NULL)
		fatal("cannot add the authentication block %s", FRAMING_AUTH);

	auth->type = KORE_AUTH_TYPE_REQUEST;
	if ((auth->validator = kore_validator_lookup(FRAMING_VALIDATOR)) ==
	    NULL)
		fatal("no validator %s", FRAMING_VALIDATOR);

	LIST_FOREACH(srv, &kore_servers, list) {
		TAILQ_FOREACH(dom, &srv->domains, list) {
			TAILQ_FOREACH(hdlr, &dom->handlers, list) {
				if (hdlr->auth == NULL) {
					hdlr->auth = auth;
					continue;
				}
				/*
				 * Kore runs one block per route: a route's
				 * own would go unchecked. Refused at start.
				 */
				if (hdlr->auth != auth) {
					fatal("route %s has the authentication "
					    "block '%s' of its own: the framing "
					    "check (src/core/framing.c) would not "
					    "run on it; check in the handler "
					    "instead", hdlr->path,
					    hdlr->auth->name);
				}
			}
		}
	}
}

/*
 * KORE_RESULT_OK: the handler runs. KORE_RESULT_ERROR: refused here, the
 * answer sent and the connection closing.
 */
int
framing_check(struct http_request *req, const void *data)
{
	struct http_header	*hdr;
	const char		*detail;
	int			lengths, reads_body;

	(void)data;

	reads_body = req->method == HTTP_METHOD_POST ||
	    req->method == HTTP_METHOD_PUT || req->method == HTTP_METHOD_PATCH;

	detail = NULL;
	lengths = 0;
	TAILQ_FOREACH(hdr, &req->req_headers, list) {
		if (!strcasecmp(hdr->header, "transfer-encoding")) {
			detail = "send the body with a Content-Length, not a "
			    "Transfer-Encoding";
			break;
		}
		if (strcasecmp(hdr->header, "content-length"))
			continue;
		if (++lengths > 1) {
			detail = "send one Content-Length, not several";
			break;
		}
		if (!reads_body && !length_is_zero(hdr->value)) {
			detail = "a body is read on POST only: send this "
			    "method without one";
			break;
		}
	}

	if (detail == NULL)
		return (KORE_RESULT_OK);

	req->owner->flags |= CONN_CLOSE_EMPTY;
	problem_respond(req, PROBLEM_INVALID_REQUEST, "%s", detail);
	access_log_plain(req, "framing_refused");

	return (KORE_RESULT_ERROR);
}

static int
length_is_zero(const char *v)
{
	if (*v == '\0')
		return (0);

	for (; *v != '\0'; v++) {
		if (*v != '0')
			return (0);
	}

	return (1);
}
