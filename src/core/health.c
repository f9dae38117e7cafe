/*
 * GET /healthz: 200 when the database answers a query and takes writes,
 * 503 when it does not.
 */

#include <sys/types.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "accesslog.h"
#include "db.h"
#include "problem.h"
#include "reload.h"
#include "settings.h"

/* A function of the schema: an unmigrated database is named as such. */
#define HEALTH_SQL		"SELECT idem_standby()"
#define HEALTH_OK		"{\"status\":\"ok\",\"database\":\"up\"}"

struct health_check {
	struct db_call		db;
	u_int64_t		started;
};

int		healthz(struct http_request *);
static int	health_query(struct http_request *);
static void	health_fail(struct http_request *, struct db_call *);
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

	switch (db_call_step(&h->db, HEALTH_SQL, 0, NULL)) {
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
		http_response_header(req, "content-type", JSON_CONTENT_TYPE);
		http_response(req, HTTP_STATUS_OK, HEALTH_OK,
		    sizeof(HEALTH_OK) - 1);
		break;
	default:
		health_fail(req, &h->db);
		break;
	}

	return (KORE_RESULT_OK);
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
