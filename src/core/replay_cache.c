/*
 * The answers of finished keys, kept in each worker: a retry of a key
 * this worker saw finish, or saw replayed, is answered from memory,
 * without a query. Why that answer is the one the database would give:
 *
 * - A finished key's status and bytes never change: the transactional
 *   strategy writes the key row done in the transaction of the work, the
 *   lease strategy once in lease_complete(), and nothing updates a done
 *   row afterwards (every lease function writes only where status =
 *   'in_progress'; a function that touched a done row would break this
 *   cache). Only the cleanup deletes it, once it is older than the
 *   retention (IDEM_RETENTION_SECONDS, counted from the key's first
 *   request, on the database's clock).
 * - An entry is kept only from an answer the database committed: the
 *   call ended with ReadyForQuery, after the commit waited for the
 *   synchronous standby when there is one (a commit it did not confirm is
 *   a failed call, and nothing is kept). A replay from the database waits
 *   for the standby too (idem_confirm()), so an entry made while commits
 *   waited for none is not served once a worker of this process has seen
 *   that they do (an answer saying so, or a commit the standby did not
 *   confirm, or worker 1 asking every second: standby_job; the flag is in
 *   the shared mapping of metrics.c): the commit it holds may not be on
 *   the standby.
 * - It ends REPLAY_CACHE_MARGIN_MS before the key may be cleaned: the
 *   database says how old the key was when it answered, so a cleaned key
 *   is never replayed. Every instance must run with the same retention.
 * - It is looked up by client and key, and answers only a request of the
 *   same operation and fingerprint; another is the 422 the database would
 *   answer (the saved key does not change either).
 * - Each worker keeps its own; other instances and workers cannot change
 *   what it holds, since a done key does not change.
 *
 * Bounded: IDEM_REPLAY_CACHE_ENTRIES entries and REPLAY_CACHE_BYTES_MAX of
 * entries (their bodies and the rest), the oldest dropped first;
 * IDEM_REPLAY_CACHE_SECONDS caps how long one is kept (0 turns the cache
 * off).
 */

#include <sys/types.h>
#include <sys/queue.h>

#include <string.h>

#include "idem.h"
#include "jobs.h"
#include "metrics.h"
#include "replay_cache.h"
#include "settings.h"

#define CACHE_BUCKETS		1024

/* Longer operation names are not kept (none is near it). */
#define CACHE_OPERATION_MAX	63

/*
 * One allocation per entry, its strings after the body in data[]: an
 * order's entry fits Kore's 512-byte block, where fixed arrays sized for
 * the longest key took a 1 KiB one.
 */
struct cache_entry {
	u_int32_t			hash;
	int				status;
	int				standby;
	u_int64_t			expires;
	size_t				len;
	size_t				size;
	const char			*client_id;
	const char			*key;
	const char			*operation;
	char				fingerprint[65];
	TAILQ_ENTRY(cache_entry)	bucket;
	TAILQ_ENTRY(cache_entry)	age;
	u_int8_t			data[];
};

TAILQ_HEAD(cache_list, cache_entry);

static int			standby_ask(struct job *);
static int			standby_read(struct job *);
static u_int32_t		entry_hash(const char *, const char *);
static size_t			entry_cost(size_t);
static struct cache_entry	*entry_find(const char *, const char *);
static void			entry_drop(struct cache_entry *);

static const struct job_step	standby_steps[] = {
	{ "ask", standby_ask },
	{ "read", standby_read },
};

/*
 * Whether commits wait for a synchronous standby, asked every second by
 * worker 1 (a request's answer says it too): the setting can change while
 * no request reaches the database, when every retry is answered here.
 */
struct job	standby_job = {
	.name = "standby",
	.steps = standby_steps,
	.nsteps = sizeof(standby_steps) / sizeof(standby_steps[0]),
};

static struct cache_list	buckets[CACHE_BUCKETS];
static struct cache_list	oldest = TAILQ_HEAD_INITIALIZER(oldest);
static size_t			entries = 0;
static size_t			bytes = 0;

void
replay_cache_init(void)
{
	int		i;

	for (i = 0; i < CACHE_BUCKETS; i++)
		TAILQ_INIT(&buckets[i]);
	TAILQ_INIT(&oldest);
	entries = 0;
	bytes = 0;
}

/* The entries live in the module's statics: freed before a reload. */
void
replay_cache_unload(void)
{
	struct cache_entry	*e;

	while ((e = TAILQ_FIRST(&oldest)) != NULL)
		entry_drop(e);
}

size_t
replay_cache_count(void)
{
	return (entries);
}

/*
 * Answers the request from the cache when its key is there: the saved
 * answer (replayed), or the 422 of a key first used for another request.
 * Returns 1 when it answered.
 */
int
replay_cache_answer(struct http_request *req)
{
	struct idem_request	*r = http_state_get(req);
	struct cache_entry	*e;

	if (settings.replay_cache_seconds == 0)
		return (0);

	if ((e = entry_find(r->client_id, r->key)) == NULL)
		return (0);

	if (!e->standby && metrics_standby()) {
		entry_drop(e);
		return (0);
	}

	metrics_count(COUNTER_REPLAY_CACHE_HITS, 1);

	if (strcmp(e->operation, r->op->name) ||
	    strcmp(e->fingerprint, r->fingerprint)) {
		(void)idem_fail_mismatch(req);
		return (1);
	}

	idem_respond(req, e->status, e->data, e->len, 1);
	return (1);
}

/*
 * What an answer said, or a failed commit showed: whether commits wait
 * for a synchronous standby.
 */
void
replay_cache_standby(int standby)
{
	metrics_standby_set(standby);
}

/*
 * Keeps a finished key's answer: status and body as saved, the key
 * age_ms old when the database answered, standby whether its commit (or
 * the replay's) waited for a synchronous standby.
 */
void
replay_cache_put(const struct idem_request *r, int status, const char *body,
    size_t len, u_int64_t age_ms, int standby)
{
	struct cache_entry	*e;
	size_t			nclient, nkey, nop, size;
	char			*p;
	u_int64_t		ttl, retention;

	metrics_standby_set(standby);

	if (settings.replay_cache_seconds == 0 ||
	    settings.replay_cache_entries == 0 ||
	    len > REPLAY_CACHE_BODY_MAX ||
	    strlen(r->op->name) > CACHE_OPERATION_MAX)
		return;

	retention = (u_int64_t)settings.retention_seconds * 1000;
	if (age_ms + REPLAY_CACHE_MARGIN_MS >= retention)
		return;
	ttl = retention - age_ms - REPLAY_CACHE_MARGIN_MS;
	if (ttl > (u_int64_t)settings.replay_cache_seconds * 1000)
		ttl = (u_int64_t)settings.replay_cache_seconds * 1000;

	if (r->started + ttl <= kore_time_ms())
		return;

	if ((e = entry_find(r->client_id, r->key)) != NULL)
		entry_drop(e);

	nclient = strlen(r->client_id) + 1;
	nkey = strlen(r->key) + 1;
	nop = strlen(r->op->name) + 1;
	size = entry_cost(sizeof(*e) + len + nclient + nkey + nop);

	while (entries >= settings.replay_cache_entries ||
	    bytes + size > REPLAY_CACHE_BYTES_MAX)
		entry_drop(TAILQ_FIRST(&oldest));

	e = kore_calloc(1, sizeof(*e) + len + nclient + nkey + nop);
	e->size = size;
	e->hash = entry_hash(r->client_id, r->key);
	e->status = status;
	e->standby = standby;
	e->len = len;
	memcpy(e->data, body, len);
	p = (char *)e->data + len;
	memcpy(p, r->client_id, nclient);
	e->client_id = p;
	p += nclient;
	memcpy(p, r->key, nkey);
	e->key = p;
	p += nkey;
	memcpy(p, r->op->name, nop);
	e->operation = p;
	(void)kore_strlcpy(e->fingerprint, r->fingerprint,
	    sizeof(e->fingerprint));
	/*
	 * Counted from the request's start: the database measured the age
	 * later than that, however long the call then took to come back.
	 */
	e->expires = r->started + ttl;

	TAILQ_INSERT_HEAD(&buckets[e->hash % CACHE_BUCKETS], e, bucket);
	TAILQ_INSERT_TAIL(&oldest, e, age);
	entries++;
	bytes += size;
}

/*
 * What an allocation of len bytes takes from Kore: a block of the next
 * power of two up to 8 KiB (kore_malloc()), and its own header.
 */
static size_t
entry_cost(size_t len)
{
	size_t		block;

	if (len > 8192)
		return (len + 32);

	for (block = 8; block < len; block *= 2)
		;

	return (block + 32);
}

/* FNV-1a over the client id, a NUL, and the key. */
static u_int32_t
entry_hash(const char *client_id, const char *key)
{
	u_int32_t	h = 2166136261u;
	const char	*p;

	for (p = client_id; *p != '\0'; p++)
		h = (h ^ (u_int8_t)*p) * 16777619u;
	h = h * 16777619u;
	for (p = key; *p != '\0'; p++)
		h = (h ^ (u_int8_t)*p) * 16777619u;

	return (h);
}

/* The live entry of a client's key; an expired one is dropped. */
static struct cache_entry *
entry_find(const char *client_id, const char *key)
{
	struct cache_entry	*e;
	u_int32_t		h;

	h = entry_hash(client_id, key);
	TAILQ_FOREACH(e, &buckets[h % CACHE_BUCKETS], bucket) {
		if (e->hash != h || strcmp(e->key, key) ||
		    strcmp(e->client_id, client_id))
			continue;

		if (e->expires <= kore_time_ms()) {
			entry_drop(e);
			return (NULL);
		}

		return (e);
	}

	return (NULL);
}

static void
entry_drop(struct cache_entry *e)
{
	TAILQ_REMOVE(&buckets[e->hash % CACHE_BUCKETS], e, bucket);
	TAILQ_REMOVE(&oldest, e, age);
	entries--;
	bytes -= e->size;
	kore_free(e);
}

static int
standby_ask(struct job *job)
{
	if (settings.replay_cache_seconds == 0)
		return (JOB_DONE);

	return (job_query(job, "SELECT idem_standby() AS standby", 0, NULL));
}

static int
standby_read(struct job *job)
{
	metrics_standby_set(!strcmp(db_call_field(&job->db, "standby"), "t"));

	return (JOB_DONE);
}
