/*
 * The lease protocol (src/lease/lease.c, sql/003_lease.sql) as the
 * contract states it after issue 28 (docs/API.md, the payments table), in
 * Promela for SPIN 6.5.2. model/README.md says how it maps to the code,
 * what it abstracts, why its bounds suffice and how scripts/model runs it.
 *
 * One client key of one client. Its actors:
 *   - CLIENTS attempts of the client (a request and its retries, each on
 *     any worker of any instance): proctype attempt, from LEASE_RESERVE;
 *   - the recovery job (recovery.c): the same proctype, from LEASE_CLAIM,
 *     round after round while the key is in_progress;
 *   - world: time (leases ending, the settle window, the provider's key
 *     retention, the service's retention and its cleanup) and what the
 *     provider does on its own (a request that goes on behind a gateway or
 *     a timeout, a late object, a list that lags, a key forgotten).
 *
 * The states of an attempt are lease_flow's (lease.h: LEASE_RESERVE ...
 * LEASE_RELEASE), each SQL function one atomic step (a statement is a
 * transaction; the row is locked by it), each provider call two steps:
 * sent, then answered (lease_attempt_call: a->calling).
 *
 * Mutants (spin -DMUTANT_x), each of which must be refuted with a trail:
 *   MUTANT_NO_FENCE        no fence: the writes do not check lease_id and
 *                          a call is sent whether or not the lease still
 *                          covers it
 *   MUTANT_ANY_5XX_KEPT    today's bug: any 5xx counts as kept by the
 *                          provider (indeterminate), a gateway's included
 *   MUTANT_NO_SETTLE       a generation without the settle window: the
 *                          list is read as soon as a kept 5xx is released
 *   MUTANT_RESEND_RETAINED a derived key re-sent past the provider's
 *                          retention of it, instead of listed first
 * and two more, of the same kind:
 *   MUTANT_RELEASE_RETRY   today's late worker on the release path: it
 *                          tells its client to retry whatever the key
 *                          holds now (a retry after the cleanup is a
 *                          second payment)
 *   MUTANT_NO_RECOVERY     no recovery job: a charge whose answer was lost
 *                          after the client gave up stays unknown (the
 *                          liveness property's own check: refuted by an
 *                          acceptance cycle)
 */

/*
 * Abstractions (model/README.md, "What the model leaves out"):
 *   - time is events, not durations: a lease ends, the settle window
 *     passes, a key ages past the provider's retention less the margin,
 *     the service's retention passes (world); each may come at any
 *     moment its assumption allows, never at a fixed one;
 *   - the settle window's assumption: what the provider makes of a kept
 *     5xx, and its list's lag, are over within the window (the residual
 *     risk); a request cut by a gateway or a timeout has no such bound;
 *   - the key retention's: older than the retention less the margin, no
 *     request of the key is still under way at the provider;
 *   - the lease's: it outlasts the provider timeout (checked at start),
 *     so a lease never ends during its holder's call;
 *   - a fencing token is the attempt that holds it (only equality of
 *     lease_id values matters); the provider's idempotency per derived
 *     key is exact (a replay, or 409 while the first is under way);
 *   - a charge is a number, the n-th of this client key; refusals (402,
 *     422) are saved outcomes like a success and are left out, as are a
 *     mismatched fingerprint, pagination and the job's backoff (any
 *     moment after the lease ends);
 *   - one client key: keys do not share rows or provider keys (item 4b's
 *     encoding), so a second key is a copy of the first.
 */

/*
 * Bounds (model/README.md says why they suffice). A fault is anything
 * that goes wrong: the run has FAULTS of them in all, so that the
 * provider and the workers end up working (the fairness the liveness
 * property needs); a kept 5xx is not a fault, it is bounded by GMAX.
 */
#ifndef CLIENTS
#define CLIENTS		2	/* a client's attempts (request, retries) */
#endif
#ifndef TRIES
#define TRIES		2	/* the tries of each of them */
#endif
#ifndef GMAX
#define GMAX		2	/* generations of the derived key */
#endif
#ifndef FAULTS
#define FAULTS		2	/* faults in all: lost answers, timeouts,
				   gateway 5xx, failed lists, stalls */
#endif

#if defined(MUTANT_NO_FENCE) || defined(MUTANT_ANY_5XX_KEPT) || \
    defined(MUTANT_NO_SETTLE) || defined(MUTANT_RESEND_RETAINED) || \
    defined(MUTANT_RELEASE_RETRY) || defined(MUTANT_NO_RECOVERY)
#define MUTANT
#endif

#define JOB		CLIENTS		/* the recovery job's attempt */
#if CLIENTS >= 3
#define NONE_TO_COME	(!to_come[0] && !to_come[1] && !to_come[2])
#else
#define NONE_TO_COME	(!to_come[0] && !to_come[1])
#endif
#define NATT		(CLIENTS + 1)

mtype = {
	/* lease.h: the states of the flow */
	LEASE_RESERVE, LEASE_CLAIM, LEASE_DECIDE, LEASE_RECONCILE,
	LEASE_GENERATION, LEASE_CALL, LEASE_SETTLE, LEASE_RELEASE,
	LEASE_END,

	/* provider_answer.h: the classes the model needs */
	PROVIDER_SUCCESS, PROVIDER_BUSY, PROVIDER_TRANSIENT,
	PROVIDER_INDETERMINATE,

	/* idempotency_keys.status; ABSENT: no row (never taken, or deleted) */
	ABSENT, IN_PROGRESS, DONE,

	/* the provider's state of one derived key */
	PK_NONE, PK_INFLIGHT, PK_CHARGED, PK_KEPT, PK_FORGOTTEN
};

/*
 * The key's row (idempotency_keys). The fencing token lease_id is kept as
 * the attempt that took it: an attempt runs one flow at a time, so
 * "lease_id = mine" is "row_holder = me" (the counter's values themselves
 * never matter, only their equality).
 */
mtype	row_status = ABSENT;
byte	row_holder = 255;	/* lease_id */
bit	row_locked;		/* locked_until > now() */
byte	row_gen = 1;		/* provider_generation */
bit	row_indeterminate;	/* indeterminate */
bit	row_settled;		/* indeterminate_at + the settle window < now() */
byte	row_charge;		/* the saved charge (the payment's charge_id) */

/*
 * The payment row of the key (its charge), kept after the cleanup deletes
 * the key; and how many payment rows lease_complete() made for it.
 */
byte	payment_charge;
byte	npayments;

/*
 * The provider, per generation g of the derived key (<client>:<key>,
 * <client>:<key>:<g>); index 0 unused. A charge is a number: the n-th
 * charge the provider made for this client key.
 */
mtype	pk[GMAX + 1] = PK_NONE;
byte	charge_of[GMAX + 1];	/* the charge made under key g, 0 none */
bit	listed[GMAX + 1];	/* it shows in the provider's list */
bit	late[GMAX + 1];		/* a kept 5xx's object still to appear */
bit	aged[GMAX + 1];		/* first sent before the retention less the
				   margin: lists first, never sent again */
byte	nchg;			/* charges made for this client key */

/* Attempts */
bit	live[NATT];		/* its lease still covers a whole call */
bit	calling[NATT];		/* a provider call sent, not answered */
byte	ncalling;
bit	to_come[CLIENTS];	/* a client that will still send a request */

byte	faults = FAULTS;

/* What a list finds of the key's generations 1..gen (listed()). */
#define SHOWN(g, gen)	((g) <= (gen) && charge_of[g] != 0 && listed[g])

/*
 * Whatever the provider will make of a kept 5xx has appeared and shows in
 * its list: what the settle window and the key retention wait for.
 */
#define QUIET(g)	(!late[g] && (charge_of[g] == 0 || listed[g]))
#if GMAX >= 3
#define ALL_QUIET	(QUIET(1) && QUIET(2) && QUIET(3))
#else
#define ALL_QUIET	(QUIET(1) && QUIET(2))
#endif

/*
 * In the settle window: a proven-kept 5xx was released and the window has
 * not passed; the key answers 503 outcome-pending and nothing is sent.
 */
#ifdef MUTANT_NO_SETTLE
#define SETTLING	0
#else
#define SETTLING	(row_indeterminate && !row_settled)
#endif

#ifdef MUTANT_NO_RECOVERY
#define NO_RECOVERY	1
#else
#define NO_RECOVERY	0
#endif

/*
 * A call is sent only while the attempt's lease covers the whole call,
 * and never with a key past the provider's retention less the margin.
 */
#ifdef MUTANT_NO_FENCE
#define LIVE(me)	1
#else
#define LIVE(me)	live[me]
#endif
#ifdef MUTANT_RESEND_RETAINED
#define RETAINED(g)	0
#else
#define RETAINED(g)	aged[g]
#endif

/* The fence of every write: the row is still this attempt's. */
#ifdef MUTANT_NO_FENCE
#define FENCE(me)	(row_status == IN_PROGRESS)
#else
#define FENCE(me)	(row_status == IN_PROGRESS && row_holder == (me))
#endif

/* The provider makes a charge under key g: at most one per client key. */
#define MAKE_CHARGE(g)						\
	nchg++;							\
	charge_of[g] = nchg;					\
	listed[g] = 0;						\
	printf("MSC: charge %d under generation %d\n", nchg, g);	\
	assert(nchg <= 1)

/* Every 201 names the one charge, the one the payment saved. */
#define ANSWER_201(id)						\
	printf("MSC: 201 charge %d\n", id);			\
	assert((id) != 0 && (id) == payment_charge && nchg == 1)

/*
 * The world's steps for generation g: the provider's own progress and the
 * time that passes for its key.
 */
#define WORLD_G(g)							\
	/* a request that goes on behind a gateway 5xx or a timeout ends */ \
	:: atomic { pk[g] == PK_INFLIGHT ->				\
		if							\
		:: MAKE_CHARGE(g); pk[g] = PK_CHARGED			\
		:: (g) < GMAX -> pk[g] = PK_KEPT;			\
			if :: late[g] = 1 :: skip fi			\
		:: pk[g] = PK_NONE	/* failed, not kept: key free */ \
		fi }							\
	/* a late object: what the request of a kept 5xx made appears */ \
	:: atomic { late[g] -> late[g] = 0; MAKE_CHARGE(g) }		\
	/* the list catches up with a charge */				\
	:: atomic { charge_of[g] != 0 && !listed[g] -> listed[g] = 1 }	\
	/* the key is past the provider's retention less the margin */	\
	:: atomic { row_status == IN_PROGRESS && row_gen == (g) &&	\
	    (g) < GMAX && !aged[g] && pk[g] != PK_INFLIGHT &&		\
	    ncalling == 0 && QUIET(g) -> aged[g] = 1 }			\
	/* the provider forgets the key */				\
	:: atomic { aged[g] && (pk[g] == PK_CHARGED || pk[g] == PK_KEPT) \
	    -> pk[g] = PK_FORGOTTEN }

/*
 * The client is told to retry with the same key (409, 502, 503, 504): it
 * will, before the service's retention ends.
 */
inline told_retry()
{
	retry = 1;
	if
	:: me != JOB -> to_come[me] = 1
	:: else
	fi
}

/* What the key holds now, answered by a late (fenced) attempt. */
inline answer_now()
{
	if
	:: row_status == DONE -> ANSWER_201(row_charge); retry = 0
	:: row_status == IN_PROGRESS -> told_retry()	/* 409 */
	:: row_status == ABSENT -> retry = 0		/* 410 key-expired */
	fi
}

/* The key taken by this attempt (lease_reserve_v2, lease_recover_claim_v2). */
inline take()
{
	row_holder = me;
	row_locked = 1;
	live[me] = 1;
	gen = row_gen;
	reconcile = row_indeterminate || RETAINED(row_gen);
	state = LEASE_DECIDE
}

proctype attempt(byte me)
{
	mtype	state, class;
	byte	gen, id, tries;
	bit	reconcile, retry;

	if
	:: me == JOB -> state = LEASE_CLAIM
	:: else -> state = LEASE_RESERVE
	fi;

end_flow:
	do
	/* reserve (flow_reserve, lease_reserve_v2()) */
	:: atomic { state == LEASE_RESERVE ->
		to_come[me] = 0;
		retry = 0;
		if
		:: row_status == ABSENT ->
			row_status = IN_PROGRESS;
			row_gen = 1;
			row_indeterminate = 0;
			row_settled = 0;
			take()
		:: row_status == DONE ->
			ANSWER_201(row_charge);
			state = LEASE_END
		:: row_status == IN_PROGRESS && row_locked ->
			told_retry();		/* 409 in_flight */
			state = LEASE_END
		:: row_status == IN_PROGRESS && !row_locked && SETTLING ->
			told_retry();		/* 503 outcome-pending */
			state = LEASE_END
		:: row_status == IN_PROGRESS && !row_locked && !SETTLING ->
			take()			/* taken_over */
		fi }

	/*
	 * claim (flow_claim, lease_recover_claim_v2()): an abandoned key, not
	 * one in its settle window (its recover_at is the window's end).
	 */
	:: atomic { state == LEASE_CLAIM && row_status == IN_PROGRESS &&
	    !row_locked && !SETTLING && !NO_RECOVERY -> take() }

	/* decide (flow_decide): reconcile first, or call */
	:: atomic { state == LEASE_DECIDE ->
		if
		:: reconcile -> state = LEASE_RECONCILE
		:: else -> state = LEASE_CALL
		fi }

	/*
	 * reconcile (flow_reconcile, listed()): a page is read only while a
	 * whole call fits in the lease.
	 */
	:: atomic { state == LEASE_RECONCILE ->
		if
		:: !LIVE(me) ->
			/* provider_answer_unresolved: the key stays as it is */
			class = PROVIDER_TRANSIENT;
			state = LEASE_RELEASE
		:: LIVE(me) ->
			assert(ncalling == 0);
			if
			:: faults > 0 ->		/* LISTED_FAILED */
				faults--;
				class = PROVIDER_TRANSIENT;
				state = LEASE_RELEASE
			:: true ->
				if
				:: SHOWN(1, gen) ->	/* LISTED_FOUND */
					id = charge_of[1];
					class = PROVIDER_SUCCESS;
					state = LEASE_SETTLE
				:: !SHOWN(1, gen) && SHOWN(2, gen) ->
					id = charge_of[2];
					class = PROVIDER_SUCCESS;
					state = LEASE_SETTLE
#if GMAX >= 3
				:: !SHOWN(1, gen) && !SHOWN(2, gen) &&
				    SHOWN(3, gen) ->
					id = charge_of[3];
					class = PROVIDER_SUCCESS;
					state = LEASE_SETTLE
#endif
				:: else ->		/* LISTED_NONE */
					state = LEASE_GENERATION
				fi
			fi
		fi }

	/*
	 * generation (flow_generation, lease_generation()): under the
	 * lease, from the generation it reconciled, only while that one
	 * must be listed (indeterminate, or past the retention).
	 */
	:: atomic { state == LEASE_GENERATION ->
		if
		:: FENCE(me) && row_gen == gen &&
		    (row_indeterminate || RETAINED(gen)) ->
#ifdef MUTANT
			/* a mutant's run past the bound is cut here */
			row_gen < GMAX;
#else
			assert(row_gen < GMAX);	/* the bound holds */
#endif
			row_gen++;
			gen = row_gen;
			row_indeterminate = 0;
			row_settled = 0;
			row_locked = 1;		/* a new lease */
			live[me] = 1;
			state = LEASE_CALL
		:: else ->			/* LEASE_END_FENCED */
			answer_now();
			state = LEASE_END
		fi }

	/*
	 * call (flow_call, lease_attempt_call): sent only while the lease
	 * covers the whole call, and never with a key past its retention.
	 */
	:: atomic { state == LEASE_CALL && !calling[me] ->
		if
		:: !LIVE(me) ->			/* not within its lease */
			class = PROVIDER_TRANSIENT;
			state = LEASE_RELEASE
		:: LIVE(me) && RETAINED(gen) ->	/* list first */
			state = LEASE_RECONCILE
		:: LIVE(me) && !RETAINED(gen) ->
			assert(ncalling == 0);	/* one caller per key */
			ncalling++;
			calling[me] = 1
		fi }

	/*
	 * The provider answers the call on key gen: every behaviour a
	 * choice. The class is provider_answer_classify()'s.
	 */
	:: atomic { state == LEASE_CALL && calling[me] ->
		if
		:: pk[gen] == PK_NONE || pk[gen] == PK_FORGOTTEN ->
			if
			:: MAKE_CHARGE(gen);	/* answered: MATCH_ID */
				pk[gen] = PK_CHARGED;
				id = charge_of[gen];
				class = PROVIDER_SUCCESS
			:: faults > 0 ->	/* made, the answer lost */
				faults--;
				MAKE_CHARGE(gen);
				pk[gen] = PK_CHARGED;
				class = PROVIDER_TRANSIENT
			:: faults > 0 ->	/* MATCH_TIMED_OUT, goes on */
				faults--;
				pk[gen] = PK_INFLIGHT;
				class = PROVIDER_TRANSIENT
			:: faults > 0 ->	/* a gateway 5xx, goes on */
				faults--;
				pk[gen] = PK_INFLIGHT;
#ifdef MUTANT_ANY_5XX_KEPT
				class = PROVIDER_INDETERMINATE
#else
				class = PROVIDER_TRANSIENT
#endif
			:: faults > 0 ->	/* MATCH_NO_ANSWER: not sent */
				faults--;
				class = PROVIDER_TRANSIENT
			:: gen < GMAX ->	/* MATCH_KEPT: a proven 5xx */
				pk[gen] = PK_KEPT;
				if :: late[gen] = 1 :: skip fi;
				class = PROVIDER_INDETERMINATE
			fi
		:: pk[gen] == PK_INFLIGHT ->
			if
			:: class = PROVIDER_BUSY	/* its 409 */
			:: faults > 0 ->		/* a gateway 5xx */
				faults--;
#ifdef MUTANT_ANY_5XX_KEPT
				class = PROVIDER_INDETERMINATE
#else
				class = PROVIDER_TRANSIENT
#endif
			fi
		:: pk[gen] == PK_CHARGED ->
			if
			:: id = charge_of[gen];		/* replayed */
				class = PROVIDER_SUCCESS
			:: faults > 0 ->		/* the answer lost */
				faults--;
				class = PROVIDER_TRANSIENT
			fi
		:: pk[gen] == PK_KEPT ->
			if
			:: class = PROVIDER_INDETERMINATE	/* replayed */
			:: faults > 0 ->
				faults--;
				class = PROVIDER_TRANSIENT
			fi
		fi;
		calling[me] = 0;
		ncalling--;
		if
		:: class == PROVIDER_SUCCESS -> state = LEASE_SETTLE
		:: else -> state = LEASE_RELEASE
		fi }

	/* settle (flow_settle, lease_complete()) */
	:: atomic { state == LEASE_SETTLE ->
		if
		:: FENCE(me) ->			/* completed */
			row_status = DONE;
			row_locked = 0;
			live[me] = 0;
			row_charge = id;
			payment_charge = id;
			npayments++;
			assert(npayments <= 1);	/* one payment per key */
			ANSWER_201(id);
			retry = 0
		:: else ->			/* fenced */
			answer_now()
		fi;
		state = LEASE_END }

	/* release (flow_release, lease_release()) */
	:: atomic { state == LEASE_RELEASE ->
		if
		:: FENCE(me) ->
			row_locked = 0;
			live[me] = 0;
			if
			:: class == PROVIDER_INDETERMINATE ->
				/* a kept 5xx: the settle window starts */
				row_indeterminate = 1;
				row_settled = 0
			:: else
			fi;
			told_retry()		/* 409, 502, 503, 504 */
		:: else ->			/* fenced */
#ifdef MUTANT_RELEASE_RETRY
			told_retry()
#else
			answer_now()
#endif
		fi;
		state = LEASE_END }

	/*
	 * The end of a flow: a client retries while told to, a few times
	 * (the job finishes what it leaves); the job goes on to its next
	 * round.
	 */
	:: atomic { state == LEASE_END ->
		id = 0;
		class = 0;
		reconcile = 0;
		if
		:: me == JOB -> state = LEASE_CLAIM
		:: me != JOB && retry && tries + 1 < TRIES ->
			tries++;
			state = LEASE_RESERVE
		:: me != JOB && !(retry && tries + 1 < TRIES) ->
			to_come[me] = 0;	/* it gives up */
			break
		fi }
	od
}

/*
 * Time and the provider's own steps. Each is bounded (the faults, the
 * generations), so that weak fairness makes every one that stays enabled
 * happen.
 */
proctype world()
{
end_world:
	do
	/*
	 * A lease ends under its holder (a stall: GC, SIGSTOP, a slow disk),
	 * never during its call: the lease outlasts the provider timeout.
	 */
	:: atomic { faults > 0 && row_status == IN_PROGRESS && row_locked &&
	    !calling[row_holder] ->
		faults--;
		row_locked = 0;
		live[row_holder] = 0 }

	/*
	 * The settle window of the last kept 5xx passes: what the provider
	 * made of it has appeared and shows in its list (the residual risk:
	 * model/README.md). A request cut by a gateway or a timeout has no
	 * such bound: it is not waited for.
	 */
	:: atomic { row_status == IN_PROGRESS && row_indeterminate &&
	    !row_settled && ALL_QUIET -> row_settled = 1 }

	WORLD_G(1)
	WORLD_G(2)
#if GMAX >= 3
	WORLD_G(3)
#endif

	/*
	 * idempotency_cleanup(): a done key past the service's retention,
	 * by which time every retry of the client has come (the contract:
	 * a retry after the retention is a new operation).
	 */
	:: atomic { row_status == DONE && NONE_TO_COME ->
		row_status = ABSENT;
		row_locked = 0 }

#ifdef LIVENESS
	/*
	 * Time goes on once nothing else can happen: a run that stops is
	 * an infinite one for the LTL property (SPIN's own stutter of an
	 * end state is not checked under weak fairness, -f).
	 */
	:: timeout -> skip
#endif
	od
}

init
{
	byte	i;

	atomic {
		for (i : 0 .. CLIENTS - 1) {
			to_come[i] = 1
		}
		for (i : 0 .. CLIENTS) {
			run attempt(i)
		}
		run world()
	}
}

/*
 * Nothing the provider made is left unknown forever: under weak fairness
 * every charge ends as the payment's (pan -a -f).
 */
ltl all_known { <> [] (nchg == 0 || payment_charge != 0) }
