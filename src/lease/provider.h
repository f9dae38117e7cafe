/*
 * Payment providers as data: what a provider is sent for each lease
 * operation, how, with which secret and key, how its answers are read and
 * classified, and how it is asked whether an operation exists. The lease
 * flow (lease.c) is the same for every provider; adding one is a table in
 * provider.c, chosen by IDEM_PROVIDER_KIND.
 */

#ifndef __H_PROVIDER_H
#define __H_PROVIDER_H

#include <kore/kore.h>

#include "json.h"
#include "provider_answer.h"

#define PROVIDER_PARAMS_MAX	8
#define PROVIDER_PATH_MAX	3

/* How a request body is written. */
#define BODY_JSON		1	/* a JSON object, application/json */
#define BODY_FORM		2	/* application/x-www-form-urlencoded */

/* Where a parameter's value comes from. */
#define FROM_MEMBER		1	/* that member of the saved request */
#define FROM_KEY		2	/* the derived key of this attempt */
#define FROM_CLIENT		3	/* the client's id */
#define FROM_GENERATION		4	/* the derived key's generation */

/* A parameter's flags. */
#define PARAM_LOWER		0x01	/* sent in lower case */
#define PARAM_REQUIRED		0x02	/* a request without it: 400, untaken */

/* How the provider is asked whether an operation of a key exists. */
#define LIST_BY_KEY		1	/* ?idempotency_key=K&prefix=1 */
#define LIST_SINCE		2	/* ?limit=100&created[gte]=T&created[lte]=U */
#define LIST_BY_MEMBER		3	/* ?limit=100&<arg>=<member>, paged */

struct provider_param {
	const char	*name;
	int		from;
	const char	*member;
	int		flags;
};

/* One lease operation at one provider. */
struct provider_op {
	const char		*operation;
	const char		*path;
	struct provider_param	params[PROVIDER_PARAMS_MAX];

	/* The member of a success, and of a listed item, that names it. */
	const char		*id;

	/* Its list: how it is asked, the member of the items. */
	int			list;
	const char		*list_items;
	const char		*list_arg;
	const char		*list_member;
};

struct provider {
	const char			*kind;
	int				body;
	int				bearer;

	/* It keeps a 5xx under the key and replays it (Stripe API v1). */
	int				keeps_5xx;

	/*
	 * What proves a 5xx is its own, kept under the key (MATCH_KEPT): its
	 * error type (error_type's path) and a header it sets on every
	 * answer. A 5xx without them is a gateway's, or a proxy's: transient.
	 */
	const char			*kept_type;
	const char			*kept_header;

	/*
	 * The settle window after a kept 5xx, and how long it remembers an
	 * idempotency key (0: for ever), in seconds: the defaults of
	 * IDEM_PROVIDER_SETTLE_SECONDS and IDEM_PROVIDER_KEY_RETENTION_SECONDS.
	 */
	u_int32_t			settle_seconds;
	u_int32_t			key_retention_seconds;

	const struct answer_rule	*rules;
	size_t				nrules;

	/* Where its error answers say why, and which error they are. */
	const char			*reason[PROVIDER_PATH_MAX];
	const char			*error_type[PROVIDER_PATH_MAX];
	const char			*decline_code[PROVIDER_PATH_MAX];

	/*
	 * The longest Idempotency-Key it takes (0: no limit); a key whose
	 * derived keys could be longer is sent as <client>~sha256:<the
	 * key's SHA-256> (lease.c, provider_key()).
	 */
	size_t				key_max;

	/*
	 * In a listed item: the derived key, its generation (NULL: it keeps
	 * none), its status; more pages.
	 */
	const char			*item_key[PROVIDER_PATH_MAX];
	const char			*item_generation[PROVIDER_PATH_MAX];
	const char			*item_status;
	const char			*has_more;

	const struct provider_op	*ops;
	size_t				nops;
};

extern const struct provider	*provider;

/* The provider's settle window and key retention, as configured. */
extern u_int32_t		provider_settle_seconds;
extern u_int32_t		provider_key_retention_seconds;

u_int32_t		provider_key_stale_seconds(void);

void			provider_select(void);
const struct provider_op *provider_op(const char *);
int			provider_check(const char *, struct json_value *,
			    char *, size_t);
void			provider_body(struct kore_buf *,
			    const struct provider_op *, struct json_value *,
			    const char *, const char *, u_int32_t);
struct json_value	*provider_path(struct json_value *,
			    const char *const *);
void			provider_url_escape(struct kore_buf *, const char *,
			    size_t);

#endif
