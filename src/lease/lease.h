/*
 * The lease strategy, for operations outside this database: reserve the
 * key, call the provider, settle (complete, refuse, release), reconcile an
 * indeterminate answer, fencing and recovery: one flow of named states,
 * run by a client's request and by the recovery job alike (lease.c).
 */

#ifndef __H_LEASE_H
#define __H_LEASE_H

#include <kore/kore.h>
#include <kore/http.h>

#include "idem.h"
#include "provider.h"
#include "provider_answer.h"
#include "provider_client.h"

/*
 * An operation's side of its provider call: what it asks for in messages
 * ("the provider refused the payment") and its problems for the
 * provider's refusals. What the provider is sent is the provider's table
 * (provider.c), found by the operation's name.
 */
struct lease_call {
	const char	*noun;
	int		declined;
	int		rejected;

	/* The fresh-provider-key demo: a new provider key per attempt. */
	int		fresh_key;

	/*
	 * The provider call it makes, when not its own operation's (the demos
	 * charge as payments.create does).
	 */
	const char	*provider_op;
};

/*
 * A listing by creation time reaches this far past its bounds: the
 * provider's clock is not ours (seconds).
 */
#define LEASE_CLOCK_SLACK	300

#define LEASE_PROVIDER_KEY_MAX	(AUTH_CLIENT_ID_MAX + IDEM_KEY_MAX + 16)

/* One call at the provider: a request's, the recovery job's, a demo's. */
struct lease_attempt {
	const struct lease_call		*call;
	const struct provider_op	*op;
	char				client_id[AUTH_CLIENT_ID_MAX + 1];
	char				key[IDEM_KEY_MAX + 1];
	char				lease_id[24];
	u_int32_t			generation;
	char				provider_key[LEASE_PROVIDER_KEY_MAX];
	struct provider_call		pcall;
	int				calling;
	const struct provider_answer	*answer;
};

/* The states of the flow (lease.c: lease_states). */
#define LEASE_RESERVE		0	/* a client's request takes the key */
#define LEASE_CLAIM		1	/* the recovery job takes one */
#define LEASE_DECIDE		2
#define LEASE_RECONCILE		3
#define LEASE_GENERATION	4
#define LEASE_CALL		5
#define LEASE_SETTLE		6
#define LEASE_RELEASE		7
#define LEASE_NOW		8	/* fenced: what the key holds now */
#define LEASE_STATES		9

/* How a flow ended. */
#define LEASE_END_ANSWERED	1	/* the key row answered (f->db) */
#define LEASE_END_NOTHING	2	/* the job found no abandoned key */
#define LEASE_END_SETTLED	3	/* lease_complete() ran (f->db) */
#define LEASE_END_RELEASED	4	/* lease_release() ran (f->db) */
#define LEASE_END_FENCED	5	/* taken over before a new generation */

/* What a run of the flow returns. */
#define LEASE_WAIT		1	/* a database or provider call pending */
#define LEASE_NEXT		2	/* f->state moved: run it now */
#define LEASE_DONE		3	/* ended: f->end */
#define LEASE_FAILED		4	/* the database call failed: f->db */

struct lease_flow {
	int				state;
	int				end;

	/* NULL: the recovery job. */
	struct http_request		*req;
	struct db_call			*db;
	int				*db_active;

	const struct idem_operation	*op;
	char				operation[64];
	struct lease_attempt		attempt;
	struct kore_buf			request;
	int				reconcile;
	int64_t				taken_at;
	int64_t				reconcile_until;

	/*
	 * When this attempt's lease ends, by this worker's clock (ms),
	 * measured from before the statement that took it (stmt_started):
	 * never later than the database's end of it.
	 */
	u_int64_t			lease_ends;
	u_int64_t			stmt_started;

	/* Its generation is past the provider's key retention: listed. */
	int				stale;

	/*
	 * A reconciliation: the pages this attempt read, where the next one
	 * starts (kept in the key's row when an attempt stops paging,
	 * reconcile_cursor), the end of its window (epoch seconds), and its
	 * steps of the database: the cursor read, saved or cleared.
	 */
	int				pages;
	char				after[PROVIDER_ID_MAX + 1];
	int64_t				window_end;
	int				cursor_read;
	int				cursor_kept;
	int				cursor_then;

	/* What a request's reserve sends. */
	const char			*fingerprint;

	/* Its client left: run on by lease_handoff() (handoff.c). */
	int				handed;

	/*
	 * The late scan of a finished key (late.c): every success listed
	 * but the key's saved one (settled, "" if none) is late.
	 */
	int				late_scan;
	char				settled[PROVIDER_ID_MAX + 1];
};

int	lease_run(struct http_request *);
int	lease_problem(const struct lease_attempt *);

void	lease_flow_init(struct lease_flow *, int, struct http_request *,
	    struct db_call *, int *);
int	lease_flow_run(struct lease_flow *);
void	lease_flow_cleanup(struct lease_flow *);
const char *lease_state_name(int);
int	lease_handoff(struct lease_flow *);
int	lease_late_list(struct lease_flow *);
void	lease_late_found(const struct lease_flow *, const char *, u_int32_t,
	    const char *, const int64_t *, const char *);

void	lease_attempt_init(struct lease_attempt *, const struct lease_call *,
	    const char *, const char *, const char *, const char *,
	    u_int32_t);
int	lease_attempt_call(struct lease_attempt *, const char *, size_t,
	    struct http_request *);
void	lease_attempt_cleanup(struct lease_attempt *);

const struct idem_operation	*lease_operation(const char *);

#endif
