/*
 * The steps every API request goes through before and after its one
 * database call, whichever strategy protects it.
 *
 * A failure before execution (authentication, key, body) is answered with
 * a problem and leaves no trace: the key is not taken, so the client can
 * fix the request and send it again with the same key.
 */

#include <sys/types.h>

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "idem.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"

static void	request_free(struct http_request *);
static int	admit_key(struct http_request *, struct idem_request *);
static int	admit_media_type(struct http_request *);
static int	admit_body(struct http_request *, struct idem_request *);
static int	admit_fields(struct http_request *, struct idem_request *);
static int	field_check(const struct idem_field *, struct json_value *);
static int	text_valid(const char *, size_t, size_t, size_t, int);
static int	key_parse(const char *, char *);
static void	fingerprint(struct idem_request *);
static int	problem_outcome(int);

static const char	*field_rules[] = {
	[FIELD_AMOUNT] = "an integer count of minor units from 1 to "
	    "9007199254740991",
	[FIELD_POINTS] = "a non-zero integer from -9007199254740991 to "
	    "9007199254740991",
	[FIELD_CURRENCY] = "three upper-case ASCII letters",
	[FIELD_ID] = "a string of 1 to 128 bytes without control characters",
	[FIELD_TEXT] = "a string of at most 1024 bytes without NUL",
};

struct idem_request *
idem_request(struct http_request *req, int route,
    const struct idem_operation *op)
{
	struct idem_request	*r;

	if (http_state_exists(req))
		return (http_state_get(req));

	r = http_state_create(req, sizeof(*r), request_free);
	reload_hold();
	r->started = kore_time_ms();
	r->route = route;
	r->op = op;
	kore_buf_init(&r->canonical, 256);

	return (r);
}

/*
 * Answers 405 unless the request uses the method the route serves.
 */
int
idem_method(struct http_request *req, int method, const char *allow)
{
	if (req->method == method)
		return (KORE_RESULT_OK);

	http_response_header(req, "allow", allow);
	problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED, "%s accepts %s only",
	    req->path, allow);

	return (KORE_RESULT_ERROR);
}

int
idem_authenticate(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	switch (auth_step(req, &r->auth, r->client_id)) {
	case AUTH_PENDING:
		return (HTTP_STATE_RETRY);
	case AUTH_OK:
		req->fsm_state++;
		return (HTTP_STATE_CONTINUE);
	case AUTH_DENIED:
		http_response_header(req, "www-authenticate", "Bearer");
		return (idem_fail(req, PROBLEM_UNAUTHORIZED,
		    "send Authorization: Bearer <token> with a known token"));
	default:
		return (idem_fail_db(req, &r->auth.db));
	}
}

/*
 * Everything that can be checked without the database, in the order a
 * client would fix it: key, media type, size, JSON, fields.
 */
int
idem_admit(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (!admit_key(req, r) || !admit_media_type(req) ||
	    !admit_body(req, r) || !admit_fields(req, r))
		return (HTTP_STATE_COMPLETE);

	fingerprint(r);

	req->fsm_state++;
	return (HTTP_STATE_CONTINUE);
}

/*
 * Runs the request's one call of a SQL function; the next state reads its
 * row from r->db.
 */
int
idem_execute(struct http_request *req, const char *query, int nparams,
    const char **params)
{
	struct idem_request	*r = http_state_get(req);

	if (!r->db_active) {
		db_call_init(&r->db, req);
		r->db_active = 1;
	}

	switch (db_call_step(&r->db, query, nparams, params)) {
	case DB_CALL_PENDING:
		return (HTTP_STATE_RETRY);
	case DB_CALL_FAILED:
		return (idem_fail_db(req, &r->db));
	default:
		req->fsm_state++;
		return (HTTP_STATE_CONTINUE);
	}
}

/*
 * Answers from a row (outcome, status_code, response) of a transactional
 * SQL function: 'created' and 'replayed' carry the saved response,
 * 'mismatch' means the key was used for another request.
 */
int
idem_respond_outcome(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*outcome;

	outcome = db_call_value(&r->db, 0);

	if (!strcmp(outcome, "mismatch"))
		return (idem_fail_mismatch(req));

	return (idem_respond_row(req, 1, 2, !strcmp(outcome, "replayed")));
}

/*
 * Answers 200 with the JSON document a read function returned.
 */
int
idem_respond_read(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	metrics_request(r->route, OUTCOME_OK, r->started);

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_OK, db_call_value(&r->db, 0),
	    db_call_length(&r->db, 0));

	return (HTTP_STATE_COMPLETE);
}

/*
 * The request body read whole and parsed, or NULL with the reason in err.
 */
struct json_value *
idem_parse_body(struct http_request *req, char *err, size_t errlen)
{
	struct json_value	*v;
	struct kore_buf		buf;
	ssize_t			n;
	u_int8_t		chunk[4096];

	kore_buf_init(&buf, 1024);
	if (req->http_body != NULL) {
		while ((n = http_body_read(req, chunk, sizeof(chunk))) > 0)
			kore_buf_append(&buf, chunk, n);
	}

	if (buf.offset == 0) {
		(void)kore_strlcpy(err, "the body is empty", errlen);
		v = NULL;
	} else {
		v = json_parse(buf.data, buf.offset, err, errlen);
	}

	kore_buf_cleanup(&buf);

	return (v);
}

/*
 * An identifier (a customer, a recipient): 1 to 128 bytes without control
 * characters.
 */
int
idem_id_valid(const char *s, size_t len)
{
	return (text_valid(s, len, 1, IDEM_ID_MAX, 1));
}

/*
 * An Idempotency-Key is 1 to 255 visible ASCII characters, sent bare or as
 * an RFC 8941 string ("abc" means abc, with \" and \\ escapes).
 */
static int
key_parse(const char *value, char *out)
{
	size_t		len;
	const char	*p;

	len = 0;

	if (*value != '"') {
		for (p = value; *p != '\0'; p++) {
			if (*p < 0x21 || *p > 0x7e || len == IDEM_KEY_MAX)
				return (KORE_RESULT_ERROR);
			out[len++] = *p;
		}
	} else {
		for (p = value + 1; *p != '"'; p++) {
			if (*p == '\\') {
				p++;
				if (*p != '"' && *p != '\\')
					return (KORE_RESULT_ERROR);
			}
			if (*p < 0x21 || *p > 0x7e || len == IDEM_KEY_MAX)
				return (KORE_RESULT_ERROR);
			out[len++] = *p;
		}
		if (p[1] != '\0')
			return (KORE_RESULT_ERROR);
	}

	out[len] = '\0';

	return (len > 0 ? KORE_RESULT_OK : KORE_RESULT_ERROR);
}

/*
 * Frees the request's database call so that it can make another one.
 */
void
idem_db_reset(struct idem_request *r)
{
	if (r->db_active) {
		db_call_cleanup(&r->db);
		r->db_active = 0;
	}
}

/*
 * Sends a response the operation produced or saved, byte for byte.
 */
void
idem_respond(struct http_request *req, int status, const void *body,
    size_t len, int replayed)
{
	struct idem_request	*r = http_state_get(req);

	metrics_request(r->route, replayed ? OUTCOME_REPLAYED : OUTCOME_CREATED,
	    r->started);

	if (replayed)
		http_response_header(req, "idempotent-replayed", "true");

	http_response_header(req, "content-type",
	    status >= 400 ? PROBLEM_CONTENT_TYPE : JSON_CONTENT_TYPE);
	http_response(req, status, body, len);
}

/*
 * Sends the status and body a SQL function returned in its row, in the
 * given columns of r->db.
 */
int
idem_respond_row(struct http_request *req, int status_col, int body_col,
    int replayed)
{
	struct idem_request	*r = http_state_get(req);

	idem_respond(req, (int)strtol(db_call_value(&r->db, status_col),
	    NULL, 10), db_call_value(&r->db, body_col),
	    db_call_length(&r->db, body_col), replayed);

	return (HTTP_STATE_COMPLETE);
}

int
idem_fail(struct http_request *req, int problem, const char *fmt, ...)
{
	struct idem_request	*r = http_state_get(req);
	va_list			args;
	char			detail[512];

	va_start(args, fmt);
	(void)vsnprintf(detail, sizeof(detail), fmt, args);
	va_end(args);

	metrics_request(r->route, problem_outcome(problem), r->started);
	problem_respond(req, problem, "%s", detail);

	return (HTTP_STATE_COMPLETE);
}

/*
 * 422: the key was first used for another request (fingerprint or
 * operation); nothing was executed.
 */
int
idem_fail_mismatch(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	return (idem_fail(req, PROBLEM_KEY_REUSED, "Idempotency-Key '%s' was "
	    "first used with a different request; send a new key for a new "
	    "operation", r->key));
}

/*
 * A failed database call: a retryable 503 whenever a retry with the same
 * key can succeed (see db.h), a 500 only for a fault in the query.
 */
int
idem_fail_db(struct http_request *req, struct db_call *c)
{
	const char	*why;

	switch (c->error) {
	case DB_ERROR_QUERY:
		return (idem_fail(req, PROBLEM_INTERNAL, "the database refused "
		    "the request (SQLSTATE %s)",
		    c->sqlstate[0] ? c->sqlstate : "none"));
	case DB_ERROR_TIMEOUT:
		why = "the database did not answer in time";
		break;
	case DB_ERROR_CONFLICT:
		why = "the request conflicted with a concurrent one and was "
		    "rolled back";
		break;
	case DB_ERROR_UNCONFIRMED:
		why = "the database could not confirm that the request was "
		    "saved on its standby, so its outcome is unknown";
		break;
	case DB_ERROR_READ_ONLY:
		why = "the database is changing its primary";
		break;
	default:
		why = "the database did not answer";
		break;
	}

	http_response_header(req, "retry-after", "1");

	return (idem_fail(req, PROBLEM_DATABASE_UNAVAILABLE, "%s; retry with "
	    "the same Idempotency-Key", why));
}

static void
request_free(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	auth_cleanup(&r->auth);
	idem_db_reset(r);
	json_free(r->body);
	kore_buf_cleanup(&r->canonical);

	if (r->extra != NULL && r->extra_free != NULL)
		r->extra_free(r->extra);

	reload_release();
}

static int
admit_key(struct http_request *req, struct idem_request *r)
{
	const char	*value;

	if (!http_request_header(req, "idempotency-key", &value)) {
		(void)idem_fail(req, PROBLEM_KEY_MISSING, "send an "
		    "Idempotency-Key header, e.g. a UUID, and reuse it on "
		    "every retry of this request");
		return (KORE_RESULT_ERROR);
	}

	if (!key_parse(value, r->key)) {
		(void)idem_fail(req, PROBLEM_KEY_MALFORMED, "Idempotency-Key "
		    "must be 1 to 255 visible ASCII characters, bare or as a "
		    "quoted RFC 8941 string");
		return (KORE_RESULT_ERROR);
	}

	return (KORE_RESULT_OK);
}

static int
admit_media_type(struct http_request *req)
{
	const char	*value;
	size_t		len;

	len = strlen(JSON_CONTENT_TYPE);
	if (http_request_header(req, "content-type", &value) &&
	    !strncasecmp(value, JSON_CONTENT_TYPE, len) &&
	    (value[len] == '\0' || value[len] == ';' || value[len] == ' '))
		return (KORE_RESULT_OK);

	(void)idem_fail(req, PROBLEM_MEDIA_TYPE,
	    "send the body as Content-Type: application/json");

	return (KORE_RESULT_ERROR);
}

static int
admit_body(struct http_request *req, struct idem_request *r)
{
	char			err[JSON_ERROR_LEN];

	if (req->content_length > IDEM_BODY_MAX) {
		(void)idem_fail(req, PROBLEM_BODY_TOO_LARGE, "the body has %zu "
		    "bytes; at most %d are accepted", req->content_length,
		    IDEM_BODY_MAX);
		return (KORE_RESULT_ERROR);
	}

	r->body = idem_parse_body(req, err, sizeof(err));
	if (r->body == NULL) {
		(void)idem_fail(req, PROBLEM_INVALID_JSON, "%s", err);
		return (KORE_RESULT_ERROR);
	}

	if (r->body->type != JSON_OBJECT) {
		(void)idem_fail(req, PROBLEM_INVALID_REQUEST,
		    "the body must be a JSON object");
		return (KORE_RESULT_ERROR);
	}

	return (KORE_RESULT_OK);
}

static int
admit_fields(struct http_request *req, struct idem_request *r)
{
	const struct idem_field	*f;
	struct json_value	*v;
	size_t			i;

	for (i = 0; i < r->op->nfields; i++) {
		f = &r->op->fields[i];
		v = json_member(r->body, f->name);

		if (v == NULL && !f->required) {
			r->values[i] = NULL;
			continue;
		}

		if (v == NULL) {
			(void)idem_fail(req, PROBLEM_INVALID_REQUEST,
			    "%s is required: %s", f->name, field_rules[f->kind]);
			return (KORE_RESULT_ERROR);
		}

		if (!field_check(f, v)) {
			(void)idem_fail(req, PROBLEM_INVALID_REQUEST,
			    "%s must be %s", f->name, field_rules[f->kind]);
			return (KORE_RESULT_ERROR);
		}

		r->values[i] = v->str;
	}

	return (KORE_RESULT_OK);
}

static int
field_check(const struct idem_field *f, struct json_value *v)
{
	int64_t		n;

	switch (f->kind) {
	case FIELD_AMOUNT:
		return (json_int64(v, &n) && n > 0 && n <= IDEM_AMOUNT_MAX);
	case FIELD_POINTS:
		return (json_int64(v, &n) && n != 0 &&
		    n >= -IDEM_AMOUNT_MAX && n <= IDEM_AMOUNT_MAX);
	case FIELD_CURRENCY:
		return (v->type == JSON_STRING && v->len == 3 &&
		    isupper((unsigned char)v->str[0]) &&
		    isupper((unsigned char)v->str[1]) &&
		    isupper((unsigned char)v->str[2]));
	case FIELD_ID:
		return (v->type == JSON_STRING && idem_id_valid(v->str, v->len));
	case FIELD_TEXT:
		return (v->type == JSON_STRING &&
		    text_valid(v->str, v->len, 0, IDEM_TEXT_MAX, 0));
	default:
		fatal("%s: unknown field kind %d", __func__, f->kind);
	}
}

/*
 * PostgreSQL text cannot hold NUL; identifiers take no control characters.
 */
static int
text_valid(const char *s, size_t len, size_t min, size_t max, int strict)
{
	size_t		i;
	u_int8_t	ch;

	if (len < min || len > max)
		return (KORE_RESULT_ERROR);

	for (i = 0; i < len; i++) {
		ch = (u_int8_t)s[i];
		if (ch == 0 || (strict && (ch < 0x20 || ch == 0x7f)))
			return (KORE_RESULT_ERROR);
	}

	return (KORE_RESULT_OK);
}

/*
 * SHA-256 of the canonical JSON of the fields that define the operation;
 * the others (a client timestamp, an attempt counter) do not count.
 */
static void
fingerprint(struct idem_request *r)
{
	struct json_value	*members[IDEM_FIELDS_MAX];
	size_t			i, n;

	n = 0;
	for (i = 0; i < r->op->nfields; i++) {
		if (!r->op->fields[i].fingerprint)
			continue;
		if ((members[n] = json_member(r->body,
		    r->op->fields[i].name)) != NULL)
			n++;
	}

	json_canonical_members(&r->canonical, members, n);
	sha256_hex(r->canonical.data, r->canonical.offset, r->fingerprint);

	/* Kept as a C string too: the lease strategy stores it. */
	(void)kore_buf_stringify(&r->canonical, NULL);
}

static int
problem_outcome(int problem)
{
	switch (problem) {
	case PROBLEM_UNAUTHORIZED:
		return (OUTCOME_UNAUTHORIZED);
	case PROBLEM_KEY_REUSED:
		return (OUTCOME_MISMATCH);
	case PROBLEM_IN_PROGRESS:
		return (OUTCOME_IN_FLIGHT);
	case PROBLEM_PROVIDER_UNAVAILABLE:
	case PROBLEM_PROVIDER_TIMEOUT:
		return (OUTCOME_PROVIDER_ERROR);
	case PROBLEM_DATABASE_UNAVAILABLE:
	case PROBLEM_INTERNAL:
		return (OUTCOME_DB_ERROR);
	default:
		return (OUTCOME_INVALID);
	}
}
