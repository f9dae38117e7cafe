/*
 * The flows whose client left (issue 28, item 5): the settle does not
 * depend on the client.
 *
 * When a client's connection closes, Kore 4.1 marks its request
 * HTTP_REQUEST_DELETE and wakes it (kore_connection_remove()), and its next
 * http_process() frees it (http_request_free(), whose onfree is idem.c's
 * request_free()) without running its handler again. Until now the lease
 * flow went with it: the provider call was taken out of libcurl and the
 * key stayed in_progress until the recovery job claimed it, minutes later.
 *
 * Once the provider call has been sent (the flow is calling, or settling
 * or releasing an answer), a departing request hands its flow here
 * instead (lease_request_free()): the flow loses its request (f->req is
 * NULL, so the provider call wakes nobody), its database call in flight
 * is moved to this runner's own (db_call_move(): the statement, its
 * connection, its place in the queue), and it is run to its end as the
 * recovery job runs its flows (polled, lease.c's states unchanged), then
 * freed. Its further database calls are from the request pool, which
 * every worker has. Each flow held here holds the worker's reload
 * (reload_hold()), as its request did; a worker that stops meanwhile
 * loses the flow, and the key's lease and the recovery job cover it as
 * they always did.
 */

#include <sys/types.h>

#include <stdio.h>
#include <string.h>

#include <kore/kore.h>

#include "lease.h"
#include "metrics.h"
#include "reload.h"

/* How often the flows are run on (a job's poll, jobs.c). */
#define HANDOFF_POLL_MS		20

struct handoff {
	struct lease_flow	*flow;
	struct db_call		db;
	int			db_active;
	TAILQ_ENTRY(handoff)	list;
};

TAILQ_HEAD(handoff_list, handoff);

static void	handoff_tick(void *, u_int64_t);
static void	handoff_report(struct lease_flow *);
static void	handoff_free(struct handoff *);

static struct handoff_list	handoffs = TAILQ_HEAD_INITIALIZER(handoffs);
static struct kore_timer	*timer = NULL;

/*
 * Takes the flow of a request that is being freed, if its provider call
 * was sent and its outcome is not saved yet: true when it is this
 * runner's now (the caller neither cleans nor frees it).
 */
int
lease_handoff(struct lease_flow *f)
{
	struct handoff		*h;

	if (f->db == NULL || f->end != 0 || f->req == NULL)
		return (0);

	if (!(f->state == LEASE_CALL && f->attempt.calling) &&
	    f->state != LEASE_SETTLE && f->state != LEASE_RELEASE)
		return (0);

	h = kore_calloc(1, sizeof(*h));
	h->flow = f;

	if (*f->db_active) {
		db_call_move(&h->db, f->db);
		h->db_active = 1;
		*f->db_active = 0;
	}

	f->db = &h->db;
	f->db_active = &h->db_active;
	f->req = NULL;
	f->handed = 1;
	f->attempt.pcall.req = NULL;

	kore_log(LOG_NOTICE, "the client of %s:%s left in '%s'; this worker "
	    "finishes its %s", f->attempt.client_id, f->attempt.key,
	    lease_state_name(f->state), f->attempt.call->noun);

	reload_hold();
	TAILQ_INSERT_TAIL(&handoffs, h, list);
	if (timer == NULL) {
		timer = kore_timer_add(handoff_tick, HANDOFF_POLL_MS, NULL,
		    KORE_TIMER_ONESHOT);
	}

	return (1);
}

static void
handoff_tick(void *arg, u_int64_t now)
{
	struct handoff		*h, *next;
	struct lease_flow	*f;

	/* Kore frees a one-shot timer after this callback. */
	timer = NULL;

	for (h = TAILQ_FIRST(&handoffs); h != NULL; h = next) {
		next = TAILQ_NEXT(h, list);
		f = h->flow;

		switch (lease_flow_run(f)) {
		case LEASE_WAIT:
			continue;
		case LEASE_FAILED:
			kore_log(LOG_NOTICE, "%s:%s, whose client left: "
			    "database call failed in '%s'; its lease and the "
			    "recovery job finish it", f->attempt.client_id,
			    f->attempt.key, lease_state_name(f->state));
			break;
		default:
			handoff_report(f);
			break;
		}

		handoff_free(h);
	}

	if (!TAILQ_EMPTY(&handoffs)) {
		timer = kore_timer_add(handoff_tick, HANDOFF_POLL_MS, NULL,
		    KORE_TIMER_ONESHOT);
	}
}

static void
handoff_report(struct lease_flow *f)
{
	struct lease_attempt	*a = &f->attempt;

	switch (f->end) {
	case LEASE_END_SETTLED:
		if (db_call_rows(f->db) == 1 &&
		    !strcmp(db_call_field(f->db, "outcome"), "completed")) {
			kore_log(LOG_NOTICE, "%s:%s, whose client left, "
			    "completed with status %s", a->client_id, a->key,
			    db_call_field(f->db, "status_code"));
		} else {
			metrics_count(COUNTER_LEASE_FENCED, 1);
			kore_log(LOG_NOTICE, "%s:%s, whose client left, was "
			    "taken over meanwhile (now %s); not written",
			    a->client_id, a->key, db_call_rows(f->db) == 1 ?
			    db_call_field(f->db, "status") : "gone");
		}
		break;
	case LEASE_END_RELEASED:
		kore_log(LOG_NOTICE, "%s:%s, whose client left, not finished "
		    "(%s); its lease %s", a->client_id, a->key,
		    a->answer->what, !strcmp(db_call_field(f->db, "released"),
		    "t") ? "released" : "was taken over meanwhile");
		break;
	case LEASE_END_FENCED:
		metrics_count(COUNTER_LEASE_FENCED, 1);
		kore_log(LOG_NOTICE, "%s:%s, whose client left, was taken "
		    "over before its next generation", a->client_id, a->key);
		break;
	default:
		break;
	}
}

static void
handoff_free(struct handoff *h)
{
	TAILQ_REMOVE(&handoffs, h, list);

	if (h->db_active)
		db_call_cleanup(&h->db);
	lease_flow_cleanup(h->flow);
	kore_free(h->flow);
	kore_free(h);

	reload_release();
}
