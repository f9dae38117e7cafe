/*
 * What an answer of the payment provider means for an operation. Every
 * answer falls in exactly one class, by the first row of its provider's
 * answer table (provider.c) that matches it.
 */

#ifndef __H_PROVIDER_ANSWER_H
#define __H_PROVIDER_ANSWER_H

#include "provider_client.h"

/* The classes. */
#define PROVIDER_SUCCESS	1	/* a charge, a refund: saved, 201 */
#define PROVIDER_REFUSED	2	/* refused for good: saved and replayed */
#define PROVIDER_BUSY		3	/* still in progress there: released, 409 */
#define PROVIDER_TRANSIENT	4	/* failed for now: released, same key */
#define PROVIDER_INDETERMINATE	5	/* a 5xx it keeps: released, reconciled */
#define PROVIDER_CONFIG		6	/* our fault (secret, URL): released */
#define PROVIDER_KEY_CONFLICT	7	/* the key met other parameters */

/* The problem of a success: none. */
#define PROVIDER_NO_PROBLEM	-1

/* What a row of an answer table matches. */
#define MATCH_TIMED_OUT		1	/* no answer within the timeout */
#define MATCH_NO_ANSWER		2	/* no HTTP answer at all */
#define MATCH_ID		3	/* a status in range with the id */
#define MATCH_STATUS		4	/* a status in range */
#define MATCH_TYPE		5	/* a status in range, this error type */
#define MATCH_KEPT		6	/* a status in range its provider keeps */

struct provider_answer {
	int		class;
	int		problem;
	const char	*what;
};

struct answer_rule {
	int			match;
	long			min;
	long			max;
	const char		*type;
	struct provider_answer	answer;
};

struct provider;

const struct provider_answer	*provider_answer_classify(
				    const struct provider *,
				    struct provider_call *, const char *,
				    const char *);
int				provider_answer_saved(
				    const struct provider_answer *);
int				provider_answer_logged_error(
				    const struct provider_answer *);

/* The answers a reconciliation gives itself. */
extern const struct provider_answer	provider_answer_reconciled;
extern const struct provider_answer	provider_answer_pending;
extern const struct provider_answer	provider_answer_unresolved;
extern const struct provider_answer	provider_answer_unsent;

#endif
