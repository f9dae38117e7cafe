/*
 * Development-only routes (the dev flavor defines DEV_ROUTES; a prod build
 * has none of them and answers 404).
 */

#include <sys/types.h>

#include <stdio.h>

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
