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

/*
 * The mapping is made once, by the parent, before it forks: its size is
 * fixed for the life of the process, whatever a reload brings. Only the
 * pages the counters touch are ever used.
 */
#define METRICS_MAP_SIZE	(256 * 1024)

struct metrics_anchor {
	struct metrics_header	*header;
};

/*
 * The start of the mapping, the same in every build: which layout of the
 * counters follows it, and what replay_cache.c's workers last learned
 * (not a metric).
 */
struct metrics_header {
	u_int64_t	layout;
	u_int64_t	standby;
	u_int64_t	reserved[6];
};

/* 0 in the header's layout: the counters are being started again. */
#define LAYOUT_RESETTING	0

/* A route's counters, indexed by its line in routes.c. */
struct metrics_route {
	u_int64_t	requests[OUTCOME_MAX];
	u_int64_t	latency[LATENCY_BUCKETS + 1];
	u_int64_t	latency_sum_ms;
};

/*
 * What follows the header: this build's counters, then one row per route
 * of the route table (idem_nroutes of them: the table sizes them, there
 * is no fixed number of routes).
 */
struct metrics_shared {
	u_int64_t		counters[COUNTER_MAX];
	struct metrics_route	routes[];
};

/*
 * How many routes the mapping holds: about 1,480. A table past that
 * stops the service at start, naming it (metrics_init).
 */
#define METRICS_ROUTES_ROOM						\
	((METRICS_MAP_SIZE - sizeof(struct metrics_header) -		\
	sizeof(struct metrics_shared)) / sizeof(struct metrics_route))

_Static_assert(sizeof(struct metrics_header) == 64,
    "the header is the same in every build");
_Static_assert(METRICS_ROUTES_ROOM >= 1024,
    "the mapping holds a thousand routes");

static void	serve_requests(struct kore_buf *, const struct metrics_shared *);
static void	serve_latency(struct kore_buf *, const struct metrics_shared *);
static void	serve_counters(struct kore_buf *,
		    const struct metrics_shared *);
static u_int64_t	load(const u_int64_t *);
static u_int64_t	layout_of_build(void);
static u_int64_t	layout_hash(u_int64_t, const void *, size_t);
static int		current(void);
static size_t		shared_size(void);

static const char	unavailable[] = "the counters are another build's (a "
    "reload in progress) or this build has more routes than they hold\n";

static struct metrics_header	*header = NULL;
static struct metrics_shared	*shared = NULL;
static u_int64_t		layout = 0;

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
	[COUNTER_LATE_OPERATIONS] = { "idem_late_operations_total",
	    "Operations a provider made for a key that are not its settled "
	    "outcome (late charges, refunds), recorded in late_operations." },
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
	if (idem_nroutes > METRICS_ROUTES_ROOM)
		fatal("%s: %zu routes, the metrics' mapping holds %zu "
		    "(METRICS_MAP_SIZE in src/core/metrics.c)", __func__,
		    idem_nroutes, (size_t)METRICS_ROUTES_ROOM);

	header = mmap(NULL, METRICS_MAP_SIZE, PROT_READ | PROT_WRITE,
	    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (header == MAP_FAILED)
		fatal("%s: mmap: %s", __func__, errno_s);

	/* Anonymous memory starts zeroed: every counter at 0. */
	layout = layout_of_build();
	header->layout = layout;
	shared = (struct metrics_shared *)(header + 1);

	/*
	 * A reload drops the module's statics, this pointer among them, in
	 * the parent and in the workers; the mapping itself stays, and so
	 * does Kore's memory, where a tagged allocation remembers it.
	 */
	anchor = kore_malloc_tagged(sizeof(*anchor), METRICS_ANCHOR_TAG);
	anchor->header = header;
}

/*
 * Finds the mapping the parent made, in a worker whose module was loaded
 * again (a reload, or a worker forked by a reloaded parent).
 *
 * A build whose counters are laid out otherwise (a route inserted, an
 * outcome or a counter added) cannot read the old ones: the counters
 * would land on other labels. The first worker of such a build starts
 * them again from zero, and says so; the others of its build find them
 * so. A worker still on the old build then counts nothing (current()).
 */
void
metrics_attach(void)
{
	struct metrics_anchor	*anchor;
	u_int64_t		old;

	if (shared != NULL)
		return;

	if ((anchor = kore_mem_lookup(METRICS_ANCHOR_TAG)) == NULL)
		fatal("%s: the parent made no metrics mapping", __func__);

	header = anchor->header;

	/* A reload cannot grow the table past the room of the mapping. */
	if (idem_nroutes > METRICS_ROUTES_ROOM) {
		kore_log(LOG_ERR, "metrics: %zu routes, the mapping holds %zu: "
		    "none are counted until a restart", idem_nroutes,
		    (size_t)METRICS_ROUTES_ROOM);
		return;
	}

	layout = layout_of_build();
	shared = (struct metrics_shared *)(header + 1);

	/*
	 * The layout goes to LAYOUT_RESETTING while the counters are zeroed,
	 * so that no worker counts into them meanwhile, then to this
	 * build's. A worker of this build that attaches meanwhile finds it
	 * resetting and counts once it is done.
	 */
	old = __atomic_load_n(&header->layout, __ATOMIC_ACQUIRE);
	if (old != layout && old != LAYOUT_RESETTING &&
	    __atomic_compare_exchange_n(&header->layout, &old,
	    LAYOUT_RESETTING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		memset(shared, 0, shared_size());
		__atomic_store_n(&header->layout, layout, __ATOMIC_RELEASE);
		kore_log(LOG_NOTICE, "metrics: the new build lays its counters "
		    "out otherwise (routes, outcomes or counters changed): "
		    "they start again from zero");
	}
}

/*
 * Whether the counters in the mapping are this build's. A worker of the
 * old build that passed this just before a reset may still add once, on
 * its own indices: a window of a few instructions, once per layout change.
 */
static int
current(void)
{
	return (shared != NULL &&
	    __atomic_load_n(&header->layout, __ATOMIC_ACQUIRE) == layout);
}

/*
 * What the layout of the counters depends on: their sizes, the routes'
 * labels in their order, the outcomes, the counters and the buckets.
 */
static u_int64_t
layout_of_build(void)
{
	const char	*name;
	u_int64_t	h;
	size_t		i, size;

	h = 14695981039346656037ULL;
	size = sizeof(struct metrics_header);
	h = layout_hash(h, &size, sizeof(size));
	size = sizeof(struct metrics_shared);
	h = layout_hash(h, &size, sizeof(size));
	size = sizeof(struct metrics_route);
	h = layout_hash(h, &size, sizeof(size));
	h = layout_hash(h, &idem_nroutes, sizeof(idem_nroutes));
	h = layout_hash(h, bucket_ms, sizeof(bucket_ms));
	for (i = 0; i < idem_nroutes; i++)
		h = layout_hash(h, idem_routes[i].label,
		    strlen(idem_routes[i].label) + 1);
	/* A name left out (a NULL) counts as an empty one. */
	for (i = 0; i < OUTCOME_MAX; i++) {
		name = outcome_names[i] != NULL ? outcome_names[i] : "";
		h = layout_hash(h, name, strlen(name) + 1);
	}
	for (i = 0; i < COUNTER_MAX; i++) {
		name = counters[i].name != NULL ? counters[i].name : "";
		h = layout_hash(h, name, strlen(name) + 1);
	}

	return (h == LAYOUT_RESETTING ? 1 : h);
}

/* The bytes this build's counters take after the header. */
static size_t
shared_size(void)
{
	return (sizeof(struct metrics_shared) +
	    idem_nroutes * sizeof(struct metrics_route));
}

/* FNV-1a, 64 bits. */
static u_int64_t
layout_hash(u_int64_t h, const void *data, size_t len)
{
	const u_int8_t	*p = data;
	size_t		i;

	for (i = 0; i < len; i++) {
		h ^= p[i];
		h *= 1099511628211ULL;
	}

	return (h);
}

void
metrics_request(int route, int outcome, u_int64_t started)
{
	u_int64_t	ms;
	int		i;

	if (!current())
		return;

	ms = kore_time_ms() - started;
	for (i = 0; i < LATENCY_BUCKETS; i++) {
		if (ms <= bucket_ms[i])
			break;
	}

	__atomic_fetch_add(&shared->routes[route].requests[outcome], 1,
	    __ATOMIC_RELAXED);
	__atomic_fetch_add(&shared->routes[route].latency[i], 1,
	    __ATOMIC_RELAXED);
	__atomic_fetch_add(&shared->routes[route].latency_sum_ms, ms,
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
	if (current())
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
	if (header != NULL)
		__atomic_store_n(&header->standby, standby ? 1 : 0,
		    __ATOMIC_RELAXED);
}

int
metrics_standby(void)
{
	return (header != NULL &&
	    __atomic_load_n(&header->standby, __ATOMIC_RELAXED) != 0);
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

	/*
	 * Zeros would read as a counter reset to Prometheus, and the next
	 * scrape of a reloaded worker as traffic: a failed scrape is honest.
	 */
	if (!current()) {
		http_response_header(req, "content-type",
		    "text/plain; charset=utf-8");
		http_response_header(req, "retry-after", "1");
		http_response(req, HTTP_STATUS_SERVICE_UNAVAILABLE, unavailable,
		    sizeof(unavailable) - 1);
		access_log_plain(req, "-");
		return (KORE_RESULT_OK);
	}

	kore_buf_init(&buf, 8192);
	serve_requests(&buf, shared);
	serve_latency(&buf, shared);
	serve_counters(&buf, shared);

	http_response_header(req, "content-type",
	    "text/plain; version=0.0.4; charset=utf-8");
	http_response(req, HTTP_STATUS_OK, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
	access_log_plain(req, "ok");

	return (KORE_RESULT_OK);
}

static void
serve_requests(struct kore_buf *buf, const struct metrics_shared *m)
{
	int		r, o;

	kore_buf_appendf(buf, "# HELP idem_requests_total Requests by route "
	    "and outcome.\n# TYPE idem_requests_total counter\n");

	for (r = 0; r < (int)idem_nroutes; r++) {
		for (o = 0; o < OUTCOME_MAX; o++) {
			kore_buf_appendf(buf, "idem_requests_total{route=\"%s\","
			    "outcome=\"%s\"} %lu\n", idem_routes[r].label,
			    outcome_names[o],
			    (unsigned long)load(&m->routes[r].requests[o]));
		}
	}
}

static void
serve_latency(struct kore_buf *buf, const struct metrics_shared *m)
{
	u_int64_t	total;
	int		r, i;

	kore_buf_appendf(buf, "# HELP idem_request_duration_seconds Time from "
	    "the handler's first run to the response.\n"
	    "# TYPE idem_request_duration_seconds histogram\n");

	for (r = 0; r < (int)idem_nroutes; r++) {
		total = 0;
		for (i = 0; i <= LATENCY_BUCKETS; i++) {
			total += load(&m->routes[r].latency[i]);
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
		    load(&m->routes[r].latency_sum_ms) / 1000.0);
		kore_buf_appendf(buf, "idem_request_duration_seconds_count{"
		    "route=\"%s\"} %lu\n", idem_routes[r].label, (unsigned long)total);
	}
}

static void
serve_counters(struct kore_buf *buf, const struct metrics_shared *m)
{
	int		i;

	for (i = 0; i < COUNTER_MAX; i++) {
		kore_buf_appendf(buf, "# HELP %s %s\n# TYPE %s counter\n%s %lu\n",
		    counters[i].name, counters[i].help, counters[i].name,
		    counters[i].name, (unsigned long)load(&m->counters[i]));
	}
}

static u_int64_t
load(const u_int64_t *p)
{
	return (__atomic_load_n(p, __ATOMIC_RELAXED));
}
