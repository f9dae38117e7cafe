/*
 * The access log: one logfmt line per request, written when Kore frees
 * the request, so that its status is the one sent (req->status) and a
 * request cut off before its answer is logged too (status=0). Fields:
 *
 *   time method path status client key outcome duration_ms replayed
 *   request_id
 *
 * client is the client id the token authenticated, never the token; key
 * is the Idempotency-Key as the service read it (its RFC 8941 quotes
 * removed; "-" when it is missing or malformed); outcome is the metrics'
 * outcome (created, replayed, in_flight_409, ...); request_id is the
 * X-Request-Id header the edge (haproxy, conf/haproxy.cfg) gave the
 * request and logged, so that a line here is matched to the edge's. A
 * field the request never reached, or a header it does not carry, is "-".
 *
 * Kore's own access log (the accesslog directive) has a fixed format and
 * knows none of the service's fields, hence this one. It goes to stdout
 * through kore_log(), as every other line of the service.
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "accesslog.h"

static void	append_value(struct kore_buf *, const char *);

/*
 * route, client, key and outcome may be NULL; started is when the first
 * handler call began (Kore's req->start is reset at every resumption).
 */
void
access_log(struct http_request *req, const char *client, const char *key,
    const char *outcome, u_int64_t started, int replayed)
{
	struct kore_buf		buf;
	struct timespec		ts;
	const char		*request_id;
	struct tm		tm;
	char			when[64];

	(void)clock_gettime(CLOCK_REALTIME, &ts);
	(void)gmtime_r(&ts.tv_sec, &tm);
	(void)snprintf(when, sizeof(when),
	    "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900,
	    tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	    ts.tv_nsec / 1000000);

	kore_buf_init(&buf, 256);
	kore_buf_appendf(&buf, "access time=%s method=%s path=", when,
	    http_method_text(req->method));
	append_value(&buf, req->path);
	kore_buf_appendf(&buf, " status=%u client=", req->status);
	append_value(&buf, client);
	kore_buf_append(&buf, " key=", 5);
	append_value(&buf, key);
	kore_buf_append(&buf, " outcome=", 9);
	append_value(&buf, outcome);
	kore_buf_appendf(&buf, " duration_ms=%llu replayed=%s",
	    (unsigned long long)(kore_time_ms() - started),
	    replayed ? "true" : "false");
	if (!http_request_header(req, "x-request-id", &request_id))
		request_id = NULL;
	kore_buf_append(&buf, " request_id=", 12);
	append_value(&buf, request_id);

	kore_log(LOG_INFO, "%s", kore_buf_stringify(&buf, NULL));
	kore_buf_cleanup(&buf);
}

/*
 * A request that no operation ran (/healthz, /metrics, /docs, a problem
 * page, a 404 or 405): logged at once, since it has answered.
 */
void
access_log_plain(struct http_request *req, const char *outcome)
{
	access_log(req, NULL, NULL, outcome, req->start, 0);
}

/*
 * A logfmt value: bare when it can be, else quoted with \" and \\, and
 * control bytes and bytes past ASCII as \xNN, so that a path or a key
 * cannot forge a field or a line.
 */
static void
append_value(struct kore_buf *buf, const char *v)
{
	const unsigned char	*p;
	int			quote;

	if (v == NULL || *v == '\0') {
		kore_buf_append(buf, "-", 1);
		return;
	}

	quote = 0;
	for (p = (const unsigned char *)v; *p != '\0'; p++) {
		if (*p <= ' ' || *p >= 0x7f || *p == '"' || *p == '=' ||
		    *p == '\\')
			quote = 1;
	}
	if (!quote) {
		kore_buf_append(buf, v, strlen(v));
		return;
	}

	kore_buf_append(buf, "\"", 1);
	for (p = (const unsigned char *)v; *p != '\0'; p++) {
		if (*p == '"' || *p == '\\')
			kore_buf_appendf(buf, "\\%c", *p);
		else if (*p < ' ' || *p >= 0x7f)
			kore_buf_appendf(buf, "\\x%02x", *p);
		else
			kore_buf_append(buf, p, 1);
	}
	kore_buf_append(buf, "\"", 1);
}
