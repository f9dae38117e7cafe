/*
 * The steps every API request goes through before and after its one
 * database call, whichever strategy protects it.
 *
 * A failure before execution (authentication, key, body) is answered with
 * a problem and leaves no trace: the key is not taken, so the client can
 * fix the request and send it again with the same key.
 */

#include <sys/types.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "accesslog.h"
#include "idem.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"
#include "replay_cache.h"

static void	request_free(struct http_request *);
static int	admit_key(struct http_request *, struct idem_request *);
static int	admit_media_type(struct http_request *);
static int	admit_body(struct http_request *, struct idem_request *);
static int	admit_fields(struct http_request *, struct idem_request *);
static int	admit_check(struct http_request *, struct idem_request *);
static int	header_count(struct http_request *, const char *);
static void	fingerprint(struct idem_request *);
static int	problem_outcome(int);


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
	r->outcome = -1;
	r->route = route;
	r->op = op;
	kore_buf_init(&r->canonical, 256);
	kore_buf_init(&r->request, 256);

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

	if (header_count(req, "authorization") > 1) {
		http_response_header(req, "www-authenticate", "Bearer");
		return (idem_fail(req, PROBLEM_UNAUTHORIZED,
		    "send one Authorization header, not several"));
	}

	switch (auth_step(req, &r->auth, r->client_id)) {
	case AUTH_PENDING:
		return (HTTP_STATE_RETRY);
	case AUTH_OK:
		/* IDEM_STATE_ADMIT for a write, IDEM_STATE_READ for a read. */
		req->fsm_state = IDEM_STATE_ADMIT;
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
 * client would fix it: key, media type, size, JSON, fields, the fields
 * together.
 */
int
idem_admit(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (!admit_key(req, r) || !admit_media_type(req) ||
	    !admit_body(req, r) || !admit_fields(req, r) ||
	    !admit_check(req, r))
		return (HTTP_STATE_COMPLETE);

	fingerprint(r);

	/* A retry of a key this worker saw finish: no query. */
	if (replay_cache_answer(req))
		return (HTTP_STATE_COMPLETE);

	req->fsm_state = IDEM_STATE_STRATEGY;
	return (HTTP_STATE_CONTINUE);
}

/*
 * Runs the request's one call of a SQL function; the state next reads its
 * row from r->db.
 */
int
idem_execute(struct http_request *req, int next, const char *query,
    int nparams, const char **params)
{
	return (idem_execute_rerun(req, next, query, nparams, params, NULL));
}

/*
 * The same, where a failed call may be run again: rerun(), when given,
 * says whether (and resets the call); the state then runs once more.
 */
int
idem_execute_rerun(struct http_request *req, int next, const char *query,
    int nparams, const char **params, int (*rerun)(struct idem_request *))
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
		if (rerun != NULL && rerun(r))
			return (HTTP_STATE_CONTINUE);
		return (idem_fail_db(req, &r->db));
	default:
		req->fsm_state = next;
		return (HTTP_STATE_CONTINUE);
	}
}

/*
 * Answers from a row (outcome, status_code, response) of tx_execute() or of a
 * lease function: 'created' and 'replayed' carry the saved response,
 * 'mismatch' means the key was used for another request.
 */
int
idem_respond_outcome(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const char		*outcome;

	outcome = db_call_field(&r->db, "outcome");

	if (!strcmp(outcome, "mismatch"))
		return (idem_fail_mismatch(req));

	return (idem_respond_row(req, !strcmp(outcome, "replayed")));
}

#define READ_STATE_EXECUTE	IDEM_STATE_READ
#define READ_STATE_RESPOND	(IDEM_STATE_READ + 1)

static int	read_execute(struct http_request *);
static int	read_respond(struct http_request *);

static struct http_state	read_states[] = {
	KORE_HTTP_STATE(idem_authenticate),
	KORE_HTTP_STATE(read_execute),
	KORE_HTTP_STATE(read_respond),
};

/*
 * A read (GET): authenticate, one SQL function of the client and the
 * route's one argument, 200 with the JSON document it returns, or 404
 * when it returns none.
 */
int
idem_read_run(struct http_request *req)
{
	return (http_state_run(read_states,
	    sizeof(read_states) / sizeof(read_states[0]), req));
}

static int
read_execute(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	const struct idem_read	*rd = r->op->read;
	const char		*params[2];

	if (!r->db_active && !rd->parse(req, r->arg, sizeof(r->arg))) {
		return (idem_fail(req, PROBLEM_INVALID_REQUEST, "%s must be %s",
		    rd->arg, rd->rule));
	}

	params[0] = r->client_id;
	params[1] = r->arg;

	return (idem_execute(req, READ_STATE_RESPOND, rd->sql, 2, params));
}

static int
read_respond(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);

	if (db_call_rows(&r->db) == 0 || db_call_null(&r->db, 0)) {
		if (r->op->read->not_found == PROBLEM_NONE) {
			return (idem_fail(req, PROBLEM_INTERNAL, "%s answered "
			    "nothing", r->op->read->sql));
		}
		return (idem_fail(req, r->op->read->not_found, "no %s '%s' of "
		    "this client", r->op->read->arg, r->arg));
	}

	r->outcome = OUTCOME_OK;
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
 * How many times the request carries a header. Kore's
 * http_request_header() finds the first; the service refuses a second
 * Authorization, Idempotency-Key or Content-Type rather than pick one, since
 * a proxy in front may read another one of them (the last, or all joined
 * by commas) and see another client, key or body.
 */
static int
header_count(struct http_request *req, const char *name)
{
	struct http_header	*hdr;
	int			n;

	n = 0;
	TAILQ_FOREACH(hdr, &req->req_headers, list) {
		if (!strcasecmp(hdr->header, name))
			n++;
	}

	return (n);
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

	r->outcome = replayed ? OUTCOME_REPLAYED : OUTCOME_CREATED;
	r->replayed = replayed;
	metrics_request(r->route, r->outcome, r->started);

	if (replayed)
		http_response_header(req, "idempotent-replayed", "true");

	http_response_header(req, "content-type",
	    status >= 400 ? PROBLEM_CONTENT_TYPE : JSON_CONTENT_TYPE);
	http_response(req, status, body, len);
}

/*
 * Sends the status and body a SQL function returned in its row (columns
 * status_code and response of r->db).
 */
int
idem_respond_row(struct http_request *req, int replayed)
{
	struct idem_request	*r = http_state_get(req);

	idem_respond(req, (int)strtol(db_call_field(&r->db, "status_code"),
	    NULL, 10), db_call_field(&r->db, "response"),
	    db_call_field_length(&r->db, "response"), replayed);

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

	r->outcome = problem_outcome(problem);
	metrics_request(r->route, r->outcome, r->started);
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

	/* A commit waited for a standby: see replay_cache.c. */
	if (c->error == DB_ERROR_UNCONFIRMED)
		replay_cache_standby(1);

	switch (c->error) {
	case DB_ERROR_MISCONFIGURED:
		http_response_header(req, "retry-after", DB_MISCONFIGURED_RETRY);
		return (idem_fail(req, PROBLEM_DATABASE_MISCONFIGURED, "the "
		    "database refused: %s; an operator must fix the "
		    "service's database settings or migrate its schema",
		    db_call_cause(c)));
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

	/* Last: the request is done with, answered or cut off. */
	access_log(req, r->client_id, r->key, r->outcome < 0 ? NULL :
	    metrics_outcome_name(r->outcome), r->started, r->replayed);

	/*
	 * The strategy first: a lease flow whose client left takes the
	 * request's database call in flight with it (lease_handoff()).
	 */
	if (r->strategy_free != NULL)
		r->strategy_free(r);

	auth_cleanup(&r->auth);
	idem_db_reset(r);
	json_free(r->body);
	kore_buf_cleanup(&r->canonical);
	kore_buf_cleanup(&r->request);

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

	if (header_count(req, "idempotency-key") > 1) {
		(void)idem_fail(req, PROBLEM_KEY_MALFORMED, "send one "
		    "Idempotency-Key header, not several");
		return (KORE_RESULT_ERROR);
	}

	if (!idem_key_parse(value, r->key)) {
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
	if (header_count(req, "content-type") == 1 &&
	    http_request_header(req, "content-type", &value) &&
	    !strncasecmp(value, JSON_CONTENT_TYPE, len) &&
	    (value[len] == '\0' || value[len] == ';' || value[len] == ' '))
		return (KORE_RESULT_OK);

	(void)idem_fail(req, PROBLEM_MEDIA_TYPE,
	    "send the body with one header Content-Type: application/json");

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
	char			rule[IDEM_RULE_LEN];

	for (i = 0; i < r->op->nfields; i++) {
		f = &r->op->fields[i];
		v = json_member(r->body, f->name);

		if (v == NULL && !f->required)
			continue;

		if (v == NULL) {
			idem_field_rule(f, rule, sizeof(rule));
			(void)idem_fail(req, PROBLEM_INVALID_REQUEST,
			    "%s is required: %s", f->name, rule);
			return (KORE_RESULT_ERROR);
		}

		if (!idem_field_check(f, v)) {
			idem_field_rule(f, rule, sizeof(rule));
			(void)idem_fail(req, PROBLEM_INVALID_REQUEST,
			    "%s must be %s", f->name, rule);
			return (KORE_RESULT_ERROR);
		}
	}

	return (KORE_RESULT_OK);
}

/*
 * The operation's rule across its fields, after each passed its own, so
 * that it reads only well-formed values.
 */
static int
admit_check(struct http_request *req, struct idem_request *r)
{
	char		why[256];

	if (r->op->check == NULL)
		return (KORE_RESULT_OK);

	(void)kore_strlcpy(why, "the fields do not go together", sizeof(why));
	if (r->op->check(r->body, why, sizeof(why)))
		return (KORE_RESULT_OK);

	(void)idem_fail(req, PROBLEM_INVALID_REQUEST, "%s", why);

	return (KORE_RESULT_ERROR);
}

/*
 * SHA-256 of the canonical JSON of the fields that define the operation;
 * the others (a client timestamp, an attempt counter) do not count. The
 * request the SQL reads its fields from, by name, is the canonical JSON
 * of every field the operation lists.
 */
static void
fingerprint(struct idem_request *r)
{
	struct json_value	*members[IDEM_FIELDS_MAX], *all[IDEM_FIELDS_MAX];
	struct json_value	*v;
	size_t			i, n, m;

	n = m = 0;
	for (i = 0; i < r->op->nfields; i++) {
		if ((v = json_member(r->body, r->op->fields[i].name)) == NULL)
			continue;
		all[m++] = v;
		if (r->op->fields[i].fingerprint)
			members[n++] = v;
	}

	json_canonical_members(&r->canonical, members, n);
	sha256_hex(r->canonical.data, r->canonical.offset, r->fingerprint);

	json_canonical_members(&r->request, all, m);

	/*
	 * NUL-terminated for a text parameter of the SQL, but offset stays
	 * the JSON's length: a provider body is built from data and offset,
	 * and a JSON parser refuses the NUL after the document.
	 */
	(void)kore_buf_stringify(&r->request, NULL);
	r->request.offset--;
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
	case PROBLEM_PROVIDER_RATE_LIMITED:
	case PROBLEM_OUTCOME_PENDING:
		return (OUTCOME_PROVIDER_ERROR);
	case PROBLEM_DATABASE_UNAVAILABLE:
	case PROBLEM_DATABASE_MISCONFIGURED:
	case PROBLEM_INTERNAL:
		return (OUTCOME_DB_ERROR);
	default:
		return (OUTCOME_INVALID);
	}
}

/*
 * The last segment of the path, an identifier (idem_input.c).
 */
int
idem_path_arg(struct http_request *req, char *out, size_t len)
{
	return (idem_path_arg_parse(req->path, out, len));
}

/*
 * The last segment of the path, an integer id (idem_input.c).
 */
int
idem_path_ref(struct http_request *req, char *out, size_t len)
{
	return (idem_path_ref_parse(req->path, out, len));
}

/*
 * A query argument, an identifier (idem_input.c).
 */
int
idem_query_arg(struct http_request *req, const char *name, char *out,
    size_t len)
{
	if (req->query_string == NULL)
		return (KORE_RESULT_ERROR);

	return (idem_query_arg_parse(req->query_string, name, out, len));
}
