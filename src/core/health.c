/*
 * GET /healthz: 200 when the database answers a query and takes writes,
 * 503 when it does not.
 *
 * Checks in a worker share queries (single flight): a check that arrives
 * while another's query waits for the health connection, not yet sent,
 * rides on it and answers with what it answers. No check is answered from
 * a query sent before it arrived; a flight that ends without sending its
 * query because its client left or its own deadline came in the queue
 * hands nothing on, and its riders fly again within their own bound. A
 * burst of checks usually costs a worker two queries in a row, not one per
 * check behind its one connection (each waiting its turn within the bound
 * of a second).
 */

#include <sys/types.h>
#include <sys/queue.h>

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

/* What a check answers: 200 and its schema, or a problem and its detail. */
struct health_answer {
	int			status;
	int			problem;
	const char		*retry_after;
	char			text[512];
};

struct health_check {
	struct db_call		db;
	struct http_request	*req;
	u_int64_t		started;

	/* Its own query is a flight, which those riding it wait on. */
	int			leads;
	TAILQ_HEAD(, health_check)	riders;

	/* The flight it rides, until that hands it the answer. */
	struct health_check	*flight;
	TAILQ_ENTRY(health_check)	ride;

	/* Shareable: it says something of the database after riders boarded. */
	int			answered;
	int			shareable;
	struct health_answer	answer;
};

int		healthz(struct http_request *);
static int	health_query(struct http_request *);
static int	health_step(struct health_check *);
static void	health_verdict(struct health_check *, int);
static void	health_fail(struct health_answer *, struct db_call *);
static void	health_ok(struct health_answer *, struct db_call *);
static void	health_respond(struct http_request *, struct health_answer *);
static void	health_land(struct health_check *);
static void	health_free(struct http_request *);

/* The worker's newest flight; others may ride it until its query is sent. */
static struct health_check	*boarding = NULL;

int
healthz(struct http_request *req)
{
	struct health_check	*h;
	u_int64_t		elapsed;
	u_int32_t		budget;

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
		h->req = req;
		h->started = kore_time_ms();
		TAILQ_INIT(&h->riders);
		reload_hold();
	}

	h = http_state_get(req);
	if (h->answered) {
		health_respond(req, &h->answer);
		return (KORE_RESULT_OK);
	}

	if (h->flight != NULL) {
		http_request_sleep(req);
		return (KORE_RESULT_RETRY);
	}

	if (!h->leads) {
		/*
		 * Not a flight whose deadline is past its own: one asking
		 * again after its flight ended rides none younger than it.
		 */
		if (boarding != NULL && db_call_boardable(&boarding->db) &&
		    boarding->db.deadline <= h->started + DB_HEALTH_TIMEOUT_MS) {
			h->flight = boarding;
			TAILQ_INSERT_TAIL(&boarding->riders, h, ride);
			http_request_sleep(req);
			return (KORE_RESULT_RETRY);
		}

		/*
		 * Its own flight, within IDEM_DB_TIMEOUT_MS and the second
		 * of a check. A check whose flight ended without an answer
		 * (that flight's client left) keeps its own bound.
		 */
		elapsed = kore_time_ms() - h->started;
		if (elapsed >= DB_HEALTH_TIMEOUT_MS) {
			h->answer.status = HTTP_STATUS_SERVICE_UNAVAILABLE;
			h->answer.problem = PROBLEM_DATABASE_UNAVAILABLE;
			h->answer.retry_after = "1";
			(void)snprintf(h->answer.text, sizeof(h->answer.text),
			    "the database did not answer in time");
			health_respond(req, &h->answer);
			return (KORE_RESULT_OK);
		}

		h->leads = 1;
		budget = DB_HEALTH_TIMEOUT_MS - elapsed;
		if (budget > settings.db_timeout_ms)
			budget = settings.db_timeout_ms;
		db_call_init_pool(&h->db, req, DB_POOL_HEALTH, budget);
		boarding = h;
	}

	return (health_query(req));
}

static int
health_query(struct http_request *req)
{
	struct health_check	*h = http_state_get(req);
	int			rc;

	if ((rc = health_step(h)) == DB_CALL_PENDING)
		return (KORE_RESULT_RETRY);

	health_verdict(h, rc);
	health_land(h);
	health_respond(req, &h->answer);

	return (KORE_RESULT_OK);
}

static int
health_step(struct health_check *h)
{
	const char		*params[1];

	params[0] = schema_expected;
	return (db_call_step(&h->db, HEALTH_SQL, 1, params));
}

/*
 * The flight's answer, which its riders take when it says something of
 * the database after they boarded: its query's answer (sent after they
 * boarded), or the pool's refusal. Not a flight whose client left before
 * its query was sent, nor one whose own deadline came while it waited for
 * the connection (theirs has not): they fly again.
 */
static void
health_verdict(struct health_check *h, int rc)
{
	h->answered = 1;
	h->shareable = !h->db.client_gone && (h->db.sent || !h->db.timed_out);

	switch (rc) {
	case DB_CALL_DONE:
		/* Answers, but is not the primary: no write would succeed. */
		if (h->db.read_only) {
			h->answer.status = HTTP_STATUS_SERVICE_UNAVAILABLE;
			h->answer.problem = PROBLEM_DATABASE_UNAVAILABLE;
			h->answer.retry_after = "1";
			(void)snprintf(h->answer.text, sizeof(h->answer.text),
			    "the database is read-only (not the primary)");
			break;
		}
		health_ok(&h->answer, &h->db);
		break;
	default:
		health_fail(&h->answer, &h->db);
		break;
	}
}

/*
 * The database answers: 200 with the release and the schema, "current" or
 * "ahead: <the migrations this release does not know>" (a newer release
 * migrated first: this one serves on); a schema behind is a 503 of its
 * own, the migrations it lacks named: this release calls what they make.
 */
static void
health_ok(struct health_answer *a, struct db_call *c)
{
	if (!db_call_null(c, 1)) {
		a->status = HTTP_STATUS_SERVICE_UNAVAILABLE;
		a->problem = PROBLEM_DATABASE_MISCONFIGURED;
		a->retry_after = DB_MISCONFIGURED_RETRY;
		(void)snprintf(a->text, sizeof(a->text),
		    "schema behind: this release (%s) needs migrations the "
		    "database lacks: %s (make migrate)", IDEM_RELEASE,
		    db_call_value(c, 1));
		return;
	}

	a->status = HTTP_STATUS_OK;
	if (db_call_null(c, 2)) {
		(void)snprintf(a->text, sizeof(a->text), "current");
	} else {
		(void)snprintf(a->text, sizeof(a->text), "ahead: %s",
		    db_call_value(c, 2));
	}
}

/*
 * A 503 that names its cause: the server's own refusal that no retry
 * changes (no such database, authentication failed, schema not migrated),
 * or a database that cannot be reached or did not answer in time.
 */
static void
health_fail(struct health_answer *a, struct db_call *c)
{
	char		why[DB_CAUSE_MAX];

	a->status = HTTP_STATUS_SERVICE_UNAVAILABLE;
	if (c->error == DB_ERROR_MISCONFIGURED) {
		a->problem = PROBLEM_DATABASE_MISCONFIGURED;
		a->retry_after = DB_MISCONFIGURED_RETRY;
		(void)snprintf(a->text, sizeof(a->text),
		    "the database refused: %s", db_call_cause(c));
		return;
	}

	a->problem = PROBLEM_DATABASE_UNAVAILABLE;
	a->retry_after = "1";
	if (c->error == DB_ERROR_TIMEOUT) {
		(void)snprintf(a->text, sizeof(a->text),
		    "the database did not answer in time");
	} else if (db_pool_cause(DB_POOL_HEALTH, why, sizeof(why)) != 0) {
		(void)snprintf(a->text, sizeof(a->text),
		    "the database is %s", why);
	} else {
		(void)snprintf(a->text, sizeof(a->text),
		    "the database connection was lost");
	}
}

static void
health_respond(struct http_request *req, struct health_answer *a)
{
	struct kore_buf		buf;

	if (a->status != HTTP_STATUS_OK) {
		http_response_header(req, "retry-after", a->retry_after);
		problem_respond(req, a->problem, "%s", a->text);
		return;
	}

	kore_buf_init(&buf, 128);
	kore_buf_append(&buf, HEALTH_OK, sizeof(HEALTH_OK) - 1);
	/* The opening quote is HEALTH_OK's: the string without its. */
	buf.offset--;
	json_append_string(&buf, a->text, strlen(a->text));
	kore_buf_appendf(&buf, "}");

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_OK, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
}

/*
 * The flight is over: those riding it are woken, with its answer when its
 * query was sent, without otherwise (they fly again).
 */
static void
health_land(struct health_check *h)
{
	struct health_check	*r;

	if (boarding == h)
		boarding = NULL;

	while ((r = TAILQ_FIRST(&h->riders)) != NULL) {
		TAILQ_REMOVE(&h->riders, r, ride);
		r->flight = NULL;
		if (h->answered && h->shareable) {
			r->answer = h->answer;
			r->answered = 1;
		}
		http_request_wakeup(r->req);
	}
}

static void
health_free(struct http_request *req)
{
	struct health_check	*h = http_state_get(req);

	if (h->flight != NULL)
		TAILQ_REMOVE(&h->flight->riders, h, ride);

	/* Its client left with the answer in: its riders still take it. */
	if (h->leads && !h->answered && !TAILQ_EMPTY(&h->riders) &&
	    db_call_answered(&h->db))
		health_verdict(h, health_step(h));
	health_land(h);

	access_log(req, NULL, NULL, req->status == HTTP_STATUS_OK ? "ok" :
	    "db_error", h->started, 0);
	db_call_cleanup(&h->db);
	reload_release();
}
