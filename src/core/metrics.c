/*
 * Prometheus metrics. The counters live in one anonymous shared mapping
 * made by the parent before it forks the workers: every worker adds to
 * the same memory with atomic operations, a restarted worker keeps the
 * totals, and a scrape served by any worker sees the sum. The database
 * would have cost a write per request for the same numbers.
 */

#include <sys/types.h>
#include <sys/mman.h>

#include <stdio.h>
#include <string.h>

#include "accesslog.h"
#include "idem.h"
#include "metrics.h"
#include "problem.h"

#define LATENCY_BUCKETS		11

/* The Kore allocation that finds the mapping again after a reload. */
#define METRICS_ANCHOR_TAG	0x69646d31

struct metrics_anchor {
	struct metrics_shared	*shared;
};

struct metrics_shared {
	u_int64_t	requests[ROUTE_MAX][OUTCOME_MAX];
	u_int64_t	latency[ROUTE_MAX][LATENCY_BUCKETS + 1];
	u_int64_t	latency_sum_ms[ROUTE_MAX];
	u_int64_t	counters[COUNTER_MAX];

	/* Not a metric: what replay_cache.c's workers last learned. */
	u_int64_t	standby;
};

static void	serve_requests(struct kore_buf *);
static void	serve_latency(struct kore_buf *);
static void	serve_counters(struct kore_buf *);
static u_int64_t	load(u_int64_t *);

static struct metrics_shared	*shared = NULL;

static const char	*outcome_names[OUTCOME_MAX] = {
	[OUTCOME_CREATED] = "created",
	[OUTCOME_REPLAYED] = "replayed",
	[OUTCOME_IN_FLIGHT] = "in_flight_409",
	[OUTCOME_MISMATCH] = "mismatch_422",
	[OUTCOME_INVALID] = "invalid_400",
	[OUTCOME_UNAUTHORIZED] = "unauthorized_401",
	[OUTCOME_PROVIDER_ERROR] = "provider_error",
	[OUTCOME_DB_ERROR] = "db_error",
	[OUTCOME_OK] = "ok",
};

static const struct {
	const char	*name;
	const char	*help;
} counters[COUNTER_MAX] = {
	[COUNTER_LEASE_TAKEOVERS] = { "idem_lease_takeovers_total",
	    "Lease keys (payments, refunds) taken over by a retry." },
	[COUNTER_LEASE_FENCED] = { "idem_lease_fenced_total",
	    "Late results not written because the lease was taken over." },
	[COUNTER_PAYMENTS_RECOVERED] = { "idem_payments_recovered_total",
	    "Abandoned lease keys (payments, refunds) completed by the recovery job." },
	[COUNTER_CLEANUP_DELETED] = { "idem_cleanup_deleted_keys_total",
	    "Finished keys deleted after the retention." },
	[COUNTER_DB_ERRORS] = { "idem_database_errors_total",
	    "Database calls that failed." },
	[COUNTER_REPLAY_CACHE_HITS] = { "idem_replay_cache_hits_total",
	    "Retries of finished keys answered from a worker's replay cache." },
};

/* Upper bounds of the latency buckets, in milliseconds. */
static const u_int64_t	bucket_ms[LATENCY_BUCKETS] = {
	1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000
};

void
metrics_init(void)
{
	struct metrics_anchor	*anchor;

	/* The counters of a route are indexed by its line in routes.c. */
	if (idem_nroutes > ROUTE_MAX)
		fatal("%s: %zu routes, room for %d", __func__, idem_nroutes,
		    ROUTE_MAX);

	shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (shared == MAP_FAILED)
		fatal("%s: mmap: %s", __func__, errno_s);

	memset(shared, 0, sizeof(*shared));

	/*
	 * A reload drops the module's statics, this pointer among them, in
	 * the parent and in the workers; the mapping itself stays, and so
	 * does Kore's memory, where a tagged allocation remembers it.
	 */
	anchor = kore_malloc_tagged(sizeof(*anchor), METRICS_ANCHOR_TAG);
	anchor->shared = shared;
}

/*
 * Finds the mapping the parent made, in a worker whose module was loaded
 * again (a reload, or a worker forked by a reloaded parent).
 */
void
metrics_attach(void)
{
	struct metrics_anchor	*anchor;

	if (shared != NULL)
		return;

	if ((anchor = kore_mem_lookup(METRICS_ANCHOR_TAG)) == NULL)
		fatal("%s: the parent made no metrics mapping", __func__);

	shared = anchor->shared;
}

void
metrics_request(int route, int outcome, u_int64_t started)
{
	u_int64_t	ms;
	int		i;

	if (shared == NULL)
		return;

	ms = kore_time_ms() - started;
	for (i = 0; i < LATENCY_BUCKETS; i++) {
		if (ms <= bucket_ms[i])
			break;
	}

	__atomic_fetch_add(&shared->requests[route][outcome], 1,
	    __ATOMIC_RELAXED);
	__atomic_fetch_add(&shared->latency[route][i], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&shared->latency_sum_ms[route], ms,
	    __ATOMIC_RELAXED);
}

const char *
metrics_outcome_name(int outcome)
{
	return (outcome_names[outcome]);
}

void
metrics_count(int counter, u_int64_t n)
{
	if (shared != NULL)
		__atomic_fetch_add(&shared->counters[counter], n,
		    __ATOMIC_RELAXED);
}

/*
 * Whether commits wait for a synchronous standby, as the last answer of any
 * worker of this process said (see replay_cache.c): kept in the shared
 * mapping, so that every worker knows what one learned.
 */
void
metrics_standby_set(int standby)
{
	if (shared != NULL)
		__atomic_store_n(&shared->standby, standby ? 1 : 0,
		    __ATOMIC_RELAXED);
}

int
metrics_standby(void)
{
	return (shared != NULL &&
	    __atomic_load_n(&shared->standby, __ATOMIC_RELAXED) != 0);
}

void
metrics_db_error(void)
{
	metrics_count(COUNTER_DB_ERRORS, 1);
}

int
metrics_serve(struct http_request *req)
{
	struct kore_buf		buf;

	if (req->method != HTTP_METHOD_GET) {
		http_response_header(req, "allow", "GET");
		problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED,
		    "/metrics accepts GET only");
		access_log_plain(req, "method_not_allowed");
		return (KORE_RESULT_OK);
	}

	kore_buf_init(&buf, 8192);
	serve_requests(&buf);
	serve_latency(&buf);
	serve_counters(&buf);

	http_response_header(req, "content-type",
	    "text/plain; version=0.0.4; charset=utf-8");
	http_response(req, HTTP_STATUS_OK, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
	access_log_plain(req, "ok");

	return (KORE_RESULT_OK);
}

static void
serve_requests(struct kore_buf *buf)
{
	int		r, o;

	kore_buf_appendf(buf, "# HELP idem_requests_total Requests by route "
	    "and outcome.\n# TYPE idem_requests_total counter\n");

	for (r = 0; r < (int)idem_nroutes; r++) {
		for (o = 0; o < OUTCOME_MAX; o++) {
			kore_buf_appendf(buf, "idem_requests_total{route=\"%s\","
			    "outcome=\"%s\"} %lu\n", idem_routes[r].label,
			    outcome_names[o],
			    (unsigned long)load(&shared->requests[r][o]));
		}
	}
}

static void
serve_latency(struct kore_buf *buf)
{
	u_int64_t	total;
	int		r, i;

	kore_buf_appendf(buf, "# HELP idem_request_duration_seconds Time from "
	    "the handler's first run to the response.\n"
	    "# TYPE idem_request_duration_seconds histogram\n");

	for (r = 0; r < (int)idem_nroutes; r++) {
		total = 0;
		for (i = 0; i <= LATENCY_BUCKETS; i++) {
			total += load(&shared->latency[r][i]);
			if (i < LATENCY_BUCKETS) {
				kore_buf_appendf(buf,
				    "idem_request_duration_seconds_bucket{"
				    "route=\"%s\",le=\"%.3f\"} %lu\n",
				    idem_routes[r].label, bucket_ms[i] / 1000.0,
				    (unsigned long)total);
			} else {
				kore_buf_appendf(buf,
				    "idem_request_duration_seconds_bucket{"
				    "route=\"%s\",le=\"+Inf\"} %lu\n",
				    idem_routes[r].label, (unsigned long)total);
			}
		}

		kore_buf_appendf(buf, "idem_request_duration_seconds_sum{"
		    "route=\"%s\"} %.3f\n", idem_routes[r].label,
		    load(&shared->latency_sum_ms[r]) / 1000.0);
		kore_buf_appendf(buf, "idem_request_duration_seconds_count{"
		    "route=\"%s\"} %lu\n", idem_routes[r].label, (unsigned long)total);
	}
}

static void
serve_counters(struct kore_buf *buf)
{
	int		i;

	for (i = 0; i < COUNTER_MAX; i++) {
		kore_buf_appendf(buf, "# HELP %s %s\n# TYPE %s counter\n%s %lu\n",
		    counters[i].name, counters[i].help, counters[i].name,
		    counters[i].name, (unsigned long)load(&shared->counters[i]));
	}
}

static u_int64_t
load(u_int64_t *p)
{
	return (__atomic_load_n(p, __ATOMIC_RELAXED));
}
