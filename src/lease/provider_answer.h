/*
 * What an answer of the payment provider means for a payment. Every answer
 * falls in exactly one of four classes, by the first row of the one table
 * in provider_answer.c that matches it.
 */

#ifndef __H_PROVIDER_ANSWER_H
#define __H_PROVIDER_ANSWER_H

#include "provider_client.h"

/* The four classes. */
#define PROVIDER_SUCCESS	1	/* a charge, a refund: saved, 201 */
#define PROVIDER_REFUSED	2	/* refused for good: saved and replayed */
#define PROVIDER_BUSY		3	/* still in progress there: released, 409 */
#define PROVIDER_TRANSIENT	4	/* failed for now: released, 502 or 504 */

/* The problem of a success: none. */
#define PROVIDER_NO_PROBLEM	-1

struct provider_answer {
	int		class;
	int		problem;
	const char	*what;
};

const struct provider_answer	*provider_answer_classify(
				    struct provider_call *, const char *,
				    const char *);
int				provider_answer_saved(
				    const struct provider_answer *);

#endif
