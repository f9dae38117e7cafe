/*
 * Bearer tokens: a token maps to one client. Only its SHA-256 is stored
 * and compared; a worker keeps known tokens for IDEM_AUTH_CACHE_SECONDS.
 */

#ifndef __H_AUTH_H
#define __H_AUTH_H

#include "db.h"

#define AUTH_CLIENT_ID_MAX	64

#define AUTH_PENDING		1
#define AUTH_OK			2
#define AUTH_DENIED		3
#define AUTH_FAILED		4

struct auth_lookup {
	struct db_call	db;
	int		querying;
	u_int64_t	started;
	char		token_sha256[65];
};

void	auth_init(void);
void	auth_unload(void);
int	auth_step(struct http_request *, struct auth_lookup *, char *);
void	auth_cleanup(struct auth_lookup *);
void	sha256_hex(const void *, size_t, char *);
const char	*auth_bearer_token(const char *);

#endif
