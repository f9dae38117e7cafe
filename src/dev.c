/*
 * Development-only routes (the dev flavor defines DEV_ROUTES; a prod build
 * has none of them and answers 404).
 */

#include <sys/types.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "json.h"
#include "problem.h"
#include "routes.h"

#if defined(DEV_ROUTES)

/*
 * POST /dev/canonical-json: the canonical form of any JSON body, so that
 * tests can compare it with Python's json.dumps over generated documents.
 * The header x-json-name-comparisons tells how much work the parser's
 * duplicate check did.
 */
int
dev_canonical_json(struct http_request *req)
{
	struct json_value	*v;
	struct kore_buf		out;
	char			err[JSON_ERROR_LEN], n[32];

	v = idem_parse_body(req, err, sizeof(err));

	(void)snprintf(n, sizeof(n), "%llu",
	    (unsigned long long)json_parse_comparisons());
	http_response_header(req, "x-json-name-comparisons", n);

	if (v == NULL) {
		problem_respond(req, PROBLEM_INVALID_JSON, "%s", err);
		return (KORE_RESULT_OK);
	}

	kore_buf_init(&out, 1024);
	json_canonical(&out, v);
	json_free(v);

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_OK, out.data, out.offset);
	kore_buf_cleanup(&out);

	return (KORE_RESULT_OK);
}

#endif

#if defined(IDEM_SANITIZE)
/*
 * GET /dev/sanitizer-canary/heap and /ub: a deliberate heap overflow or
 * signed overflow, in the sanitizer build only, so that make
 * test-sanitize proves the sanitizers watch the module before it trusts
 * their silence.
 */
int
dev_sanitizer_canary(struct http_request *req)
{
	volatile int	big, n;
	char		*p;

	if (!strcmp(req->path, "/dev/sanitizer-canary/ub")) {
		big = INT_MAX;
		n = big + 1;
	} else {
		p = kore_malloc(16);
		n = ((volatile char *)p)[16];
		kore_free(p);
	}

	kore_log(LOG_NOTICE, "sanitizer canary: %d", n);
	http_response(req, HTTP_STATUS_OK, NULL, 0);

	return (KORE_RESULT_OK);
}
#endif
