/*
 * The lease strategy, for operations outside this database: reserve the
 * key, call the provider, settle (complete, refuse, release), fencing and
 * recovery, written once for every such operation.
 */

#ifndef __H_LEASE_H
#define __H_LEASE_H

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "provider_answer.h"
#include "provider_client.h"

#define LEASE_MEMBERS_MAX	6

/*
 * An operation's provider call, as data: the path it posts to, the
 * members of its saved request sent in the body (by name), the member of
 * a success that names it, what it asks for in messages ("the provider
 * refused the payment"), and its problems for the provider's refusals.
 */
struct lease_call {
	const char	*path;
	const char	*members[LEASE_MEMBERS_MAX];
	const char	*id;
	const char	*noun;
	int		declined;
	int		rejected;

	/* The fresh-provider-key demo: a new provider key per attempt. */
	int		fresh_key;
};

/* One attempt at the provider: a request's, or the recovery job's. */
struct lease_attempt {
	const struct lease_call		*call;
	char				client_id[AUTH_CLIENT_ID_MAX + 1];
	char				key[IDEM_KEY_MAX + 1];
	char				lease_id[24];
	char				provider_key[AUTH_CLIENT_ID_MAX +
					    IDEM_KEY_MAX + 2];
	struct provider_call		pcall;
	int				calling;
	const struct provider_answer	*answer;
};

/* The call that settles an attempt: complete, or release. */
struct lease_settle {
	const char		*sql;
	const char		*params[6];
	int			nparams;
	char			status[8];
	struct kore_buf		problem;
};

int	lease_run(struct http_request *);
int	lease_problem(const struct lease_attempt *);

void	lease_attempt_init(struct lease_attempt *, const struct lease_call *,
	    const char *, const char *, const char *);
int	lease_attempt_call(struct lease_attempt *, const char *, size_t,
	    struct http_request *);
void	lease_attempt_cleanup(struct lease_attempt *);
void	lease_settle_init(struct lease_settle *, struct lease_attempt *);
void	lease_settle_cleanup(struct lease_settle *);

const struct idem_operation	*lease_operation(const char *);

#endif
