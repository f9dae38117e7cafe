/*
 * GET /healthz: 200 when the database answers a query and takes writes,
 * 503 when it does not.
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "accesslog.h"
#include "json.h"
#include "db.h"
#include "problem.h"
#include "release.h"
#include "reload.h"
#include "schema.h"
#include "settings.h"

/*
 * A function of the schema (an unmigrated database is named as such), and
 * the schema against the migrations this build expects (schema.h).
 */
#define HEALTH_SQL		"SELECT idem_standby(), " SCHEMA_CHECK_COLUMNS
#define HEALTH_OK							\
	"{\"status\":\"ok\",\"database\":\"up\",\"version\":\""		\
	IDEM_RELEASE "\",\"schema\":\""

struct health_check {
	struct db_call		db;
	u_int64_t		started;
};

int		healthz(struct http_request *);
static int	health_query(struct http_request *);
static void	health_fail(struct http_request *, struct db_call *);
static void	health_ok(struct http_request *, struct db_call *);
static void	health_free(struct http_request *);

int
healthz(struct http_request *req)
{
	struct health_check	*h;

	if (req->method != HTTP_METHOD_GET) {
		http_response_header(req, "allow", "GET");
		problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED,
		    "/healthz accepts GET only");
		access_log_plain(req, "method_not_allowed");
		return (KORE_RESULT_OK);
	}

	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	if (!http_state_exists(req)) {
		h = http_state_create(req, sizeof(*h), health_free);
		h->started = kore_time_ms();
		reload_hold();
		db_call_init_pool(&h->db, req, DB_POOL_HEALTH,
		    settings.db_timeout_ms);
	}

	return (health_query(req));
}

static int
health_query(struct http_request *req)
{
	struct health_check	*h = http_state_get(req);
	const char		*params[1];

	params[0] = schema_expected;
	switch (db_call_step(&h->db, HEALTH_SQL, 1, params)) {
	case DB_CALL_PENDING:
		return (KORE_RESULT_RETRY);
	case DB_CALL_DONE:
		/* Answers, but is not the primary: no write would succeed. */
		if (h->db.read_only) {
			http_response_header(req, "retry-after", "1");
			problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
			    "the database is read-only (not the primary)");
			break;
		}
		health_ok(req, &h->db);
		break;
	default:
		health_fail(req, &h->db);
		break;
	}

	return (KORE_RESULT_OK);
}

/*
 * The database answers: 200 with the release and the schema, "current" or
 * "ahead: <the migrations this release does not know>" (a newer release
 * migrated first: this one serves on); a schema behind is a 503 of its
 * own, the migrations it lacks named: this release calls what they make.
 */
static void
health_ok(struct http_request *req, struct db_call *c)
{
	struct kore_buf		buf;
	char			ahead[512];

	if (!db_call_null(c, 1)) {
		http_response_header(req, "retry-after", DB_MISCONFIGURED_RETRY);
		problem_respond(req, PROBLEM_DATABASE_MISCONFIGURED,
		    "schema behind: this release (%s) needs migrations the "
		    "database lacks: %s (make migrate)", IDEM_RELEASE,
		    db_call_value(c, 1));
		return;
	}

	kore_buf_init(&buf, 128);
	kore_buf_append(&buf, HEALTH_OK, sizeof(HEALTH_OK) - 1);
	if (db_call_null(c, 2)) {
		kore_buf_appendf(&buf, "current\"}");
	} else {
		(void)snprintf(ahead, sizeof(ahead), "ahead: %s",
		    db_call_value(c, 2));
		/* The opening quote is HEALTH_OK's: the string without its. */
		buf.offset--;
		json_append_string(&buf, ahead, strlen(ahead));
		kore_buf_appendf(&buf, "}");
	}

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_OK, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
}

/*
 * A 503 that names its cause: the server's own refusal that no retry
 * changes (no such database, authentication failed, schema not migrated),
 * or a database that cannot be reached or did not answer in time.
 */
static void
health_fail(struct http_request *req, struct db_call *c)
{
	char		why[DB_CAUSE_MAX];

	if (c->error == DB_ERROR_MISCONFIGURED) {
		http_response_header(req, "retry-after", DB_MISCONFIGURED_RETRY);
		problem_respond(req, PROBLEM_DATABASE_MISCONFIGURED,
		    "the database refused: %s", db_call_cause(c));
		return;
	}

	http_response_header(req, "retry-after", "1");
	if (c->error == DB_ERROR_TIMEOUT) {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the database did not answer in time");
	} else if (db_pool_cause(DB_POOL_HEALTH, why, sizeof(why)) != 0) {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the database is %s", why);
	} else {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the database connection was lost");
	}
}

static void
health_free(struct http_request *req)
{
	struct health_check	*h = http_state_get(req);

	access_log(req, NULL, NULL, req->status == HTTP_STATUS_OK ? "ok" :
	    "db_error", h->started, 0);
	db_call_cleanup(&h->db);
	reload_release();
}
