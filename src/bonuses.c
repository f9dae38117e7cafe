/*
 * POST /v1/bonuses and GET /v1/bonuses/{customer_id}: the transactional
 * strategy for bonus points. An insufficient balance is an outcome that
 * bonus_apply() saves and replays, not a validation error.
 */

#include <sys/types.h>

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"
#include "routes.h"

#define BONUS_APPLY_SQL							\
	"SELECT outcome, status_code, response FROM "			\
	"bonus_apply($1, $2, $3, $4, $5::bigint, $6, $7, $8, $9, $10)"

#define BONUS_BALANCE_SQL	"SELECT bonus_balance($1, $2)"
#define BONUS_PATH_PREFIX	"/v1/bonuses/"

static int	bonus_apply_execute(struct http_request *);
static int	bonus_balance_execute(struct http_request *);
static int	path_decode(char *, size_t *);

static const struct idem_field	bonus_fields[] = {
	{ "customer_id",	FIELD_ID,	1, 1 },
	{ "points",		FIELD_POINTS,	1, 1 },
	{ "reason",		FIELD_TEXT,	1, 1 },
};

static const struct idem_operation	bonus_operation = {
	"bonuses.apply", ROUTE_BONUSES_APPLY, bonus_fields,
	sizeof(bonus_fields) / sizeof(bonus_fields[0])
};

static struct http_state	apply_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(idem_admit),
	KORE_HTTP_STATE(bonus_apply_execute),
	KORE_HTTP_STATE(idem_respond_outcome),
};

static struct http_state	balance_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(bonus_balance_execute),
	KORE_HTTP_STATE(idem_respond_read),
};

int
bonuses(struct http_request *req)
{
	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	(void)idem_request(req, ROUTE_BONUSES_APPLY, &bonus_operation);

	if (!idem_method(req, HTTP_METHOD_POST, "POST"))
		return (KORE_RESULT_OK);

	return (http_state_run(apply_states, ROUTE_STATES(apply_states), req));
}

int
bonus_balance(struct http_request *req)
{
	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	(void)idem_request(req, ROUTE_BONUSES_GET, NULL);

	if (!idem_method(req, HTTP_METHOD_GET, "GET"))
		return (KORE_RESULT_OK);

	return (http_state_run(balance_states, ROUTE_STATES(balance_states),
	    req));
}

/*
 * Validator of the customer_id query parameter (see kore.conf).
 */
int
v_customer_id(struct http_request *req, const void *data)
{
	return (idem_id_valid(data, strlen(data)));
}

static int
bonus_apply_execute(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[10];
	char			type[512], limit_type[512];

	problem_type_url(PROBLEM_INSUFFICIENT_BALANCE, type, sizeof(type));
	problem_type_url(PROBLEM_BALANCE_LIMIT, limit_type, sizeof(limit_type));

	params[0] = r->client_id;
	params[1] = r->key;
	params[2] = r->fingerprint;
	params[3] = r->values[0];
	params[4] = r->values[1];
	params[5] = r->values[2];
	params[6] = type;
	params[7] = problem_title(PROBLEM_INSUFFICIENT_BALANCE);
	params[8] = limit_type;
	params[9] = problem_title(PROBLEM_BALANCE_LIMIT);

	return (idem_execute(req, BONUS_APPLY_SQL, 10, params));
}

static int
bonus_balance_execute(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*params[2];
	size_t			len;

	if (!r->db_active) {
		r->extra = kore_strdup(req->path + strlen(BONUS_PATH_PREFIX));
		r->extra_free = kore_free;
		if (!path_decode(r->extra, &len) ||
		    !idem_id_valid(r->extra, len)) {
			return (idem_fail(req, PROBLEM_INVALID_REQUEST,
			    "the customer id in the path must be 1 to 128 "
			    "bytes without control characters, percent-encoded "
			    "(%%XX; + is a plus)"));
		}
	}

	params[0] = r->client_id;
	params[1] = r->extra;

	return (idem_execute(req, BONUS_BALANCE_SQL, 2, params));
}

/*
 * Decodes a path segment in place (RFC 3986): %XX is the byte XX and
 * every other character is itself. Unlike a query string or a form, a path
 * has no "+ means space" rule, so a customer "a+b" is /v1/bonuses/a+b or
 * /v1/bonuses/a%2Bb. A % without two hex digits is an error; the decoded
 * length is returned because %00 is a byte too.
 */
static int
path_decode(char *s, size_t *len)
{
	char		*in, *out, hex[3];

	hex[2] = '\0';
	for (in = out = s; *in != '\0'; in++) {
		if (*in != '%') {
			*out++ = *in;
			continue;
		}
		if (!isxdigit((unsigned char)in[1]) ||
		    !isxdigit((unsigned char)in[2]))
			return (KORE_RESULT_ERROR);
		hex[0] = in[1];
		hex[1] = in[2];
		*out++ = (char)strtoul(hex, NULL, 16);
		in += 2;
	}

	*len = (size_t)(out - s);
	*out = '\0';

	return (KORE_RESULT_OK);
}
