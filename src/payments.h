/*
 * POST /v1/payments, the lease strategy, and the pieces the demo strategies
 * reuse to compare with it.
 */

#ifndef __H_PAYMENTS_H
#define __H_PAYMENTS_H

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "provider_answer.h"
#include "provider_client.h"

/* How the provider's Idempotency-Key is made. */
#define PROVIDER_KEY_DERIVED	0
#define PROVIDER_KEY_FRESH	1

struct payment {
	int				provider_key_kind;
	char				provider_key[AUTH_CLIENT_ID_MAX +
					    IDEM_KEY_MAX + 2];
	char				lease_id[24];
	struct provider_call		call;
	int				calling;
	const struct provider_answer	*answer;
	int				released;
};

/*
 * The call that settles an attempt: complete with a charge or a refusal,
 * or release the lease after any other answer.
 */
struct payment_settle {
	const char		*sql;
	const char		*params[6];
	int			nparams;
	char			status[8];
	struct kore_buf		problem;
};

#define PAYMENT_NFIELDS		4

extern const struct idem_field	payment_fields[PAYMENT_NFIELDS];

int		payment_run(struct http_request *, int,
		    const struct idem_operation *, int);
struct payment	*payment_start(struct http_request *, int,
		    const struct idem_operation *, int);
int		payment_charge(struct http_request *);
int		payment_fail_provider(struct http_request *);
void		payment_refusal_body(struct provider_call *,
		    const struct provider_answer *, struct kore_buf *);
void		payment_settle_init(struct payment_settle *,
		    struct provider_call *, const struct provider_answer *,
		    const char *, const char *, const char *);
void		payment_settle_cleanup(struct payment_settle *);
void		payment_derived_key(char *, size_t, const char *, const char *);
void		payment_provider_body(struct kore_buf *, const char *,
		    const char *, const char *);

#endif
