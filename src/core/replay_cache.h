/*
 * The answers of finished keys, kept in each worker, so that a retry of a
 * finished key is answered without the database (see replay_cache.c).
 */

#ifndef __H_REPLAY_CACHE_H
#define __H_REPLAY_CACHE_H

#include <kore/kore.h>
#include <kore/http.h>

/* An answer's body past this is not kept: it is read from the database. */
#define REPLAY_CACHE_BODY_MAX		4096

/* The room all entries (bodies included) may take in one worker. */
#define REPLAY_CACHE_BYTES_MAX		(4 * 1024 * 1024)

/*
 * An entry ends this long before the cleanup may delete its key: the
 * answer's way from the database, and clocks that tick apart.
 */
#define REPLAY_CACHE_MARGIN_MS		5000

/* How often worker 1 asks whether commits wait for a standby. */
#define REPLAY_CACHE_STANDBY_MS		1000

struct idem_request;

void	replay_cache_init(void);
void	replay_cache_unload(void);
int	replay_cache_answer(struct http_request *);
void	replay_cache_put(const struct idem_request *, int, const char *,
	    size_t, u_int64_t, int);
void	replay_cache_standby(int);
size_t	replay_cache_count(void);

#endif
