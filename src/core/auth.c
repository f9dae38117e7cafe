/*
 * Bearer authentication against the clients table.
 */

#include <sys/types.h>
#include <sys/queue.h>

#include <openssl/evp.h>

#include <string.h>

#include "auth.h"
#include "settings.h"

/* The digest is uniform, so its first byte picks a bucket. */
#define AUTH_BUCKETS		256
#define AUTH_CACHE_MAX		4096

/*
 * A known token is trusted for IDEM_AUTH_CACHE_SECONDS counted from when
 * its lookup began, before the query saw the table: a client revoked
 * (idemctl client revoke) is refused by every worker within that bound,
 * a lookup that raced the revocation included.
 *
 * An unknown token is remembered this long, so that a flood of them costs
 * one lookup per token and worker, not one per request; at most
 * AUTH_UNKNOWN_MAX of them at once (past that, lookups on the token pool).
 * A client added meanwhile is refused until its token is forgotten.
 */
#define AUTH_UNKNOWN_MS		5000
#define AUTH_UNKNOWN_MAX	1024

#define AUTH_LOOKUP_SQL							\
	"SELECT client_id FROM clients WHERE token_sha256 = $1"

struct auth_entry {
	char			token_sha256[65];
	char			client_id[AUTH_CLIENT_ID_MAX + 1];
	u_int64_t		expires;
	int			unknown;
	TAILQ_ENTRY(auth_entry)	list;
};

TAILQ_HEAD(auth_bucket, auth_entry);

static int	token_hash(struct http_request *, char *);
static int	cache_bucket(const char *);
static int	cache_find(const char *, char *);
static void	cache_add(const char *, const char *, int, u_int64_t);
static void	cache_free(struct auth_bucket *, struct auth_entry *);
static void	cache_flush(void);

static struct auth_bucket	cache[AUTH_BUCKETS];
static size_t			cache_count = 0;
static size_t			unknown_count = 0;

/* SHA-256, fetched once per worker (sha256_hex()). */
static EVP_MD			*sha256_md = NULL;
static EVP_MD_CTX		*sha256_ctx = NULL;

void
auth_init(void)
{
	int		i;

	for (i = 0; i < AUTH_BUCKETS; i++)
		TAILQ_INIT(&cache[i]);
}

/*
 * The cache lives in the module's statics: freed before a reload drops
 * them.
 */
void
auth_unload(void)
{
	cache_flush();

	EVP_MD_CTX_free(sha256_ctx);
	sha256_ctx = NULL;
	EVP_MD_free(sha256_md);
	sha256_md = NULL;
}

/*
 * Resolves the request's bearer token to a client id, from the cache or
 * with one query.
 */
int
auth_step(struct http_request *req, struct auth_lookup *a, char *client_id)
{
	const char	*params[1];
	int		r;

	if (!a->querying) {
		if (!token_hash(req, a->token_sha256))
			return (AUTH_DENIED);
		switch (cache_find(a->token_sha256, client_id)) {
		case AUTH_OK:
			return (AUTH_OK);
		case AUTH_DENIED:
			return (AUTH_DENIED);
		default:
			break;
		}
		/* Its own pool: an unknown token never takes a request's. */
		db_call_init_pool(&a->db, req, DB_POOL_AUTH,
		    settings.db_timeout_ms);
		a->querying = 1;
		a->started = kore_time_ms();
	}

	params[0] = a->token_sha256;
	r = db_call_step(&a->db, AUTH_LOOKUP_SQL, 1, params);

	switch (r) {
	case DB_CALL_PENDING:
		return (AUTH_PENDING);
	case DB_CALL_FAILED:
		return (AUTH_FAILED);
	default:
		break;
	}

	if (db_call_rows(&a->db) != 1 ||
	    db_call_length(&a->db, 0) > AUTH_CLIENT_ID_MAX) {
		cache_add(a->token_sha256, "", 1, a->started);
		auth_cleanup(a);
		return (AUTH_DENIED);
	}

	(void)kore_strlcpy(client_id, db_call_value(&a->db, 0),
	    AUTH_CLIENT_ID_MAX + 1);
	cache_add(a->token_sha256, client_id, 0, a->started);
	auth_cleanup(a);

	return (AUTH_OK);
}

void
auth_cleanup(struct auth_lookup *a)
{
	if (a->querying) {
		db_call_cleanup(&a->db);
		a->querying = 0;
	}
}

/*
 * The digest is fetched from OpenSSL's provider once per worker, and its
 * context kept (both freed by auth_unload() before a reload):
 * EVP_Digest() with EVP_sha256() fetched and allocated both on every
 * call, which perf showed as several per cent of the API's CPU per fresh
 * order (a fingerprint per request).
 */
void
sha256_hex(const void *data, size_t len, char *out)
{
	u_int8_t		digest[32];
	unsigned int		i, dlen;
	static const char	hex[] = "0123456789abcdef";

	if (sha256_md == NULL &&
	    (sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL)) == NULL)
		fatal("%s: EVP_MD_fetch failed", __func__);
	if (sha256_ctx == NULL && (sha256_ctx = EVP_MD_CTX_new()) == NULL)
		fatal("%s: EVP_MD_CTX_new failed", __func__);

	if (!EVP_DigestInit_ex2(sha256_ctx, sha256_md, NULL) ||
	    !EVP_DigestUpdate(sha256_ctx, data, len) ||
	    !EVP_DigestFinal_ex(sha256_ctx, digest, &dlen))
		fatal("%s: SHA-256 failed", __func__);

	for (i = 0; i < dlen; i++) {
		out[i * 2] = hex[digest[i] >> 4];
		out[i * 2 + 1] = hex[digest[i] & 0x0f];
	}
	out[dlen * 2] = '\0';
}

static int
token_hash(struct http_request *req, char *out)
{
	const char	*header, *token;

	if (!http_request_header(req, "authorization", &header))
		return (KORE_RESULT_ERROR);

	if ((token = auth_bearer_token(header)) == NULL)
		return (KORE_RESULT_ERROR);

	sha256_hex(token, strlen(token), out);

	return (KORE_RESULT_OK);
}

static int
cache_bucket(const char *hash)
{
	static const char	hex[] = "0123456789abcdef";

	return ((int)((strchr(hex, hash[0]) - hex) * 16 +
	    (strchr(hex, hash[1]) - hex)));
}

/*
 * AUTH_OK with the token's client, AUTH_DENIED for a token known to be
 * unknown, AUTH_PENDING when it must be looked up.
 */
static int
cache_find(const char *hash, char *client_id)
{
	struct auth_entry	*e;
	struct auth_bucket	*b;

	b = &cache[cache_bucket(hash)];
	TAILQ_FOREACH(e, b, list) {
		if (strcmp(e->token_sha256, hash))
			continue;

		/* cppcheck-suppress uninitvar */
		if (e->expires <= kore_time_ms()) {
			cache_free(b, e);
			return (AUTH_PENDING);
		}

		if (e->unknown)
			return (AUTH_DENIED);

		(void)kore_strlcpy(client_id, e->client_id,
		    AUTH_CLIENT_ID_MAX + 1);
		return (AUTH_OK);
	}

	return (AUTH_PENDING);
}

static void
cache_free(struct auth_bucket *b, struct auth_entry *e)
{
	TAILQ_REMOVE(b, e, list);
	if (e->unknown)
		unknown_count--;
	cache_count--;
	kore_free(e);
}

static void
cache_add(const char *hash, const char *client_id, int unknown,
    u_int64_t started)
{
	struct auth_entry	*e;

	if (!unknown && settings.auth_cache_seconds == 0)
		return;
	if (unknown && unknown_count >= AUTH_UNKNOWN_MAX)
		return;

	if (cache_count >= AUTH_CACHE_MAX)
		cache_flush();

	e = kore_calloc(1, sizeof(*e));
	(void)kore_strlcpy(e->token_sha256, hash, sizeof(e->token_sha256));
	(void)kore_strlcpy(e->client_id, client_id, sizeof(e->client_id));
	e->unknown = unknown;
	e->expires = started + (unknown ? AUTH_UNKNOWN_MS :
	    (u_int64_t)settings.auth_cache_seconds * 1000);
	if (unknown)
		unknown_count++;

	TAILQ_INSERT_HEAD(&cache[cache_bucket(hash)], e, list);
	cache_count++;
}

static void
cache_flush(void)
{
	struct auth_entry	*e;
	int			i;

	for (i = 0; i < AUTH_BUCKETS; i++) {
		while ((e = TAILQ_FIRST(&cache[i])) != NULL) {
			TAILQ_REMOVE(&cache[i], e, list);
			kore_free(e);
		}
	}

	cache_count = 0;
	unknown_count = 0;
}
