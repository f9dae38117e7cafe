/*
 * The release and the schema, said at start: the parent logs this build's
 * release and compares the migrations it was built with (sql/, listed by
 * scripts/build in schema_list.c) with the database's version table. A
 * database behind is logged as an error (the service calls what it lacks;
 * /healthz answers 503 until make migrate runs), one ahead as a warning (a
 * newer release migrated it first, as a rolling upgrade does: this one
 * keeps serving). /healthz says the same on every call (health.c).
 */

#include <sys/types.h>

#include <kore/kore.h>
#include <kore/http.h>

#include <libpq-fe.h>

#include <sys/wait.h>

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "release.h"
#include "schema.h"
#include "settings.h"

#define SCHEMA_START_SQL	"SELECT " SCHEMA_CHECK_COLUMNS

/* A bound on the start's one query, far above its need. */
#define SCHEMA_CONNECT_TIMEOUT	"3"
#define SCHEMA_STATEMENT_OPTION	"-c statement_timeout=3000"

/*
 * The server's statement_timeout ends a slow query, not a silent network:
 * an answer that never comes (a host that lost power after the query was
 * sent) is waited on at most this long, and the check's process ends.
 */
#define SCHEMA_ANSWER_BOUND	10

/*
 * Every answer carries the release, Kore's own bare ones (400, 408, 413,
 * 503) included: Kore writes its server line into each answer's head as
 * given, so the release goes on a line of its own after it. Called in the
 * parent and in every worker's image (a reload of a new release).
 */
void
schema_version_header(void)
{
	char		line[64];
	int		len;

	len = snprintf(line, sizeof(line), "kore (%s)\r\nidem-version: %s",
	    kore_version, IDEM_RELEASE);
	if (len < 0 || (size_t)len >= sizeof(line))
		fatal("%s: the release line is too long", __func__);

	http_server_version(line);
}

static void		 schema_check(void);
static PGresult		*schema_answer(PGconn *, int *);

/*
 * The check runs in a process of its own (forked twice, so that Kore's
 * parent never has it as a child to reap), before the server binds: a name
 * lookup or a database slow to answer never delays the start, and its
 * connection is never inherited by a worker.
 */
void
schema_check_at_start(void)
{
	pid_t		pid;
	int		status;

	kore_log(LOG_NOTICE, "idem %s (its schema: %d migrations of sql/)",
	    IDEM_RELEASE, schema_expected_count);

	fflush(stdout);
	fflush(stderr);
	if ((pid = fork()) == -1) {
		kore_log(LOG_NOTICE, "schema not checked at start: fork: %s",
		    errno_s);
		return;
	}
	if (pid == 0) {
		if (fork() == 0) {
			schema_check();
			fflush(stdout);
			_exit(0);
		}
		_exit(0);
	}
	while (waitpid(pid, &status, 0) == -1 && errno == EINTR)
		;
}

static void
schema_check(void)
{
	PGconn			*conn;
	PGresult		*res;
	PQconninfoOption	*opts, *o;
	struct kore_buf		options;
	const char		*keys[4], *values[4], *params[1], *state;
	int			 late;

	/*
	 * The URL's own options (a search_path, say) kept, the statement's
	 * bound after them, as db.c's dsn_build() merges its own.
	 */
	kore_buf_init(&options, 128);
	if ((opts = PQconninfoParse(settings.database_url, NULL)) != NULL) {
		for (o = opts; o->keyword != NULL; o++) {
			if (!strcmp(o->keyword, "options") && o->val != NULL &&
			    *o->val != '\0')
				kore_buf_appendf(&options, "%s ", o->val);
		}
		PQconninfoFree(opts);
	}
	kore_buf_appendf(&options, "%s", SCHEMA_STATEMENT_OPTION);

	/* The URL's own settings first; the bounds after it win. */
	keys[0] = "dbname";
	values[0] = settings.database_url;
	keys[1] = "connect_timeout";
	values[1] = SCHEMA_CONNECT_TIMEOUT;
	keys[2] = "options";
	values[2] = kore_buf_stringify(&options, NULL);
	keys[3] = NULL;
	values[3] = NULL;

	conn = PQconnectdbParams(keys, values, 1);
	kore_buf_cleanup(&options);
	if (PQstatus(conn) != CONNECTION_OK) {
		kore_log(LOG_NOTICE, "schema not checked at start: the database "
		    "refused or did not answer (/healthz will say why)");
		PQfinish(conn);
		return;
	}

	params[0] = schema_expected;
	if (!PQsendQueryParams(conn, SCHEMA_START_SQL, 1, NULL, params, NULL,
	    NULL, 0)) {
		kore_log(LOG_NOTICE, "schema not checked at start: %s",
		    PQerrorMessage(conn));
		PQfinish(conn);
		return;
	}

	if ((res = schema_answer(conn, &late)) == NULL) {
		if (late == 1) {
			kore_log(LOG_NOTICE, "schema not checked at start: the "
			    "database did not answer within %d s (/healthz will "
			    "say why)", SCHEMA_ANSWER_BOUND);
		} else if (late == 0) {
			kore_log(LOG_NOTICE, "schema not checked at start: %s",
			    PQerrorMessage(conn));
		}
		PQfinish(conn);
		return;
	}

	state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	if (PQresultStatus(res) != PGRES_TUPLES_OK && state != NULL &&
	    !strcmp(state, "42P01")) {
		kore_log(LOG_ERR, "schema not migrated: the database has no "
		    "version table (schema_migrations): run make migrate "
		    "before this release (%s) serves", IDEM_RELEASE);
	} else if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		kore_log(LOG_NOTICE, "schema not checked at start: %s",
		    PQresultErrorMessage(res));
	} else if (!PQgetisnull(res, 0, 0)) {
		kore_log(LOG_ERR, "schema behind: this release (%s) needs "
		    "migrations the database lacks: %s; run make migrate (until "
		    "then /healthz answers 503)", IDEM_RELEASE,
		    PQgetvalue(res, 0, 0));
	} else if (!PQgetisnull(res, 0, 1)) {
		kore_log(LOG_WARNING, "schema ahead: the database has "
		    "migrations this release (%s) does not know: %s (a newer "
		    "release's; this one keeps serving)", IDEM_RELEASE,
		    PQgetvalue(res, 0, 1));
	} else {
		kore_log(LOG_NOTICE, "schema current: the database has the "
		    "%d migrations this release expects", schema_expected_count);
	}

	PQclear(res);
	PQfinish(conn);
}

/*
 * The query's first result, waited on at most SCHEMA_ANSWER_BOUND seconds
 * from now; NULL with *late 1 when the bound passed first, -1 when poll()
 * failed (said here), 0 when the connection failed (PQerrorMessage()).
 * What follows it is left to PQfinish().
 */
static PGresult *
schema_answer(PGconn *conn, int *late)
{
	struct pollfd		pfd;
	struct timespec		now, end;
	long			ms;

	*late = 0;
	(void)clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += SCHEMA_ANSWER_BOUND;

	pfd.fd = PQsocket(conn);
	pfd.events = POLLIN;

	while (PQisBusy(conn)) {
		(void)clock_gettime(CLOCK_MONOTONIC, &now);
		ms = (end.tv_sec - now.tv_sec) * 1000 +
		    (end.tv_nsec - now.tv_nsec) / 1000000;
		if (ms <= 0) {
			*late = 1;
			return (NULL);
		}
		switch (poll(&pfd, 1, (int)ms)) {
		case -1:
			if (errno == EINTR)
				continue;
			kore_log(LOG_NOTICE, "schema not checked at start: "
			    "poll: %s", errno_s);
			*late = -1;
			return (NULL);
		case 0:
			continue;
		}
		if (!PQconsumeInput(conn))
			return (NULL);
	}

	return (PQgetResult(conn));
}
