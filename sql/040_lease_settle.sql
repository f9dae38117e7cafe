-- The lease strategy's settle window and the provider's key retention
-- (issue 28; model/lease.pml's LEASE_RESERVE, LEASE_CLAIM, LEASE_RELEASE,
-- LEASE_GENERATION and answer_now()).
--
-- A 5xx the provider keeps under the key and proves as its own
-- (indeterminate) starts a settle window (settle_until): until it ends no
-- attempt takes the key, a retry is answered "outcome pending", the
-- recovery job passes the key over; what the provider made of the request
-- may still appear meanwhile. After it, the next attempt lists first.
--
-- A generation whose derived key was first sent longer ago than the
-- provider keeps keys (less a margin) is never sent again: the attempt
-- lists first, and only a listing that finds nothing moves the key to its
-- next generation (generation_at: when the current one was taken).
--
-- The functions of 003_lease.sql keep their names, arguments and result
-- types, and none is dropped, so that the instances of a rolling upgrade
-- that still call them keep working: a call of the previous release may be
-- running inside one of them while this file commits (waiting on the lock
-- of the alter table below), and its next statement then runs the new
-- definitions. The ones that answer rows answer this release's rows in
-- new functions (lease_answer_v2, lease_reserve_v2,
-- lease_recover_claim_v2: two more columns), and the old ones become
-- their older columns (a key in its settle window is in_flight to them);
-- the ones whose arguments change get an overload with one more argument.
-- (This file once dropped lease_answer and made it again with more
-- columns: the previous release's lease_reserve(), waiting on the alter
-- table, then ran "select * from lease_answer()" into its own result
-- type and failed, 42804: make test-upgrade.)

alter table idempotency_keys add column if not exists settle_until
    timestamptz;
alter table idempotency_keys add column if not exists generation_at
    timestamptz;

comment on column idempotency_keys.settle_until is
    'Lease strategy: after a 5xx the provider kept under the key and proved '
    'as its own, the end of the settle window; until then no attempt takes '
    'the key (retries: 503 outcome-pending) and the recovery job passes it '
    'over.';
comment on column idempotency_keys.generation_at is
    'Lease strategy: when the key moved to its current generation (null: '
    'generation 1, taken at created_at). A generation older than the '
    'provider''s key retention less a margin is listed, never sent again.';

-- As in 003_lease.sql, and: a key in its settle window is in_flight with
-- settling true, retry_after the seconds until the window ends (an older
-- instance answers it as a 409 with that Retry-After); generation_age is
-- the age of the current generation, by the database's clock.
create or replace function lease_answer_v2(p_client text, p_key text,
    p_operation text, p_fingerprint text)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int, request jsonb, generation int,
    reconcile boolean, taken_at double precision,
    reconcile_until double precision, age_ms bigint, standby boolean,
    settling boolean, generation_age double precision)
language sql stable as $$
	select case when k.operation <> p_operation or
		    k.fingerprint <> p_fingerprint then 'mismatch'
		    when k.status = 'done' then 'replayed'
		    when k.locked_until > now() then 'in_flight'
		    when k.settle_until > now() then 'in_flight'
		    else 'expired' end,
	       k.lease_id, k.status_code, k.response,
	       case when k.locked_until <= now() and k.settle_until > now()
		    then greatest(1, ceil(extract(epoch from
			k.settle_until - now())))::int
		    else greatest(1, ceil(extract(epoch from
			least(k.locked_until, coalesce(k.call_deadline,
			k.locked_until)) - now())))::int end,
	       null::jsonb, k.provider_generation, k.indeterminate,
	       extract(epoch from k.created_at)::double precision,
	       extract(epoch from k.indeterminate_at)::double precision,
	       greatest(0, (extract(epoch from clock_timestamp() -
		   k.created_at) * 1000)::bigint),
	       idem_standby(),
	       k.status = 'in_progress' and k.locked_until <= now() and
		   coalesce(k.settle_until > now(), false),
	       extract(epoch from now() - coalesce(k.generation_at,
		   k.created_at))::double precision
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
$$;

comment on function lease_answer_v2(text, text, text, text) is
    'The state of an existing key as lease_reserve_v2() answers it; age_ms '
    'and standby as tx_execute() answers them, for the replay cache; '
    'settling: in its settle window (in_flight, retry_after until it ends).';

-- As in 003_lease.sql, and a key in its settle window is not taken over.
create or replace function lease_reserve_v2(p_client text, p_key text,
    p_operation text, p_fingerprint text, p_request jsonb,
    p_lease_seconds int, p_call_ms int)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int, request jsonb, generation int,
    reconcile boolean, taken_at double precision,
    reconcile_until double precision, age_ms bigint, standby boolean,
    settling boolean, generation_age double precision)
language plpgsql as $$
declare
	v_lease		bigint;
	v_request	jsonb;
	v_generation	int;
	v_reconcile	boolean;
	v_taken		double precision;
	v_until		double precision;
	v_age		double precision;
	v_admit		regproc;
	v_status	int;
	v_response	text;
	v_retry		int;
	v_base		text;
begin
	-- A retry that can be answered from the row is answered without the
	-- upsert below, which would lock the row (and serialise replays).
	return query select * from lease_answer_v2(p_client, p_key, p_operation,
	    p_fingerprint) a where a.outcome <> 'expired';
	if found then
		perform idem_confirm();
		return;
	end if;

	select o.admit into v_admit
	  from idem_operations o
	 where o.operation = p_operation and o.strategy = 'lease';
	if not found then
		raise exception 'no lease operation %', p_operation;
	end if;

	-- A new key "K:<n>" derives the provider key of generation n of the
	-- key K (<client>:K:<n>, src/lease/lease.c, provider_key()): refused
	-- once K has reached that generation, so that no two keys share a
	-- provider key. Under the lock lease_generation() takes for K.
	if p_key ~ ':[1-9][0-9]{0,8}$' then
		v_base := regexp_replace(p_key, ':[0-9]+$', '');
		perform pg_advisory_xact_lock(hashtextextended(p_client || ':' ||
		    v_base, 0));
		if not exists (select 1 from idempotency_keys k
			 where k.client_id = p_client and k.idem_key = p_key)
		   and exists (select 1 from idempotency_keys b
			 where b.client_id = p_client and b.idem_key = v_base
			   and b.provider_generation >=
			       substring(p_key from ':([0-9]+)$')::int
			   and b.operation in (select o.operation
				 from idem_operations o
				where o.strategy = 'lease')) then
			return query select 'collides'::text, null::bigint,
			    null::int, null::text, null::int, null::jsonb,
			    null::int, null::boolean, null::double precision,
			    null::double precision, null::bigint, null::boolean,
			    false, null::double precision;
			return;
		end if;
	end if;

	insert into idempotency_keys as k (client_id, idem_key, operation,
	    fingerprint, status, lease_id, locked_until, call_deadline,
	    request)
	values (p_client, p_key, p_operation, p_fingerprint, 'in_progress', 1,
	    now() + make_interval(secs => p_lease_seconds),
	    now() + make_interval(secs => p_call_ms / 1000.0), p_request)
	on conflict (client_id, idem_key) do update
	   set lease_id = k.lease_id + 1,
	       locked_until = now() + make_interval(secs => p_lease_seconds),
	       call_deadline = excluded.call_deadline
	 where k.status = 'in_progress' and k.locked_until <= now()
	   and (k.settle_until is null or k.settle_until <= now())
	   and k.operation = excluded.operation
	   and k.fingerprint = excluded.fingerprint
	returning k.lease_id, k.request, k.provider_generation, k.indeterminate,
	    extract(epoch from k.created_at), extract(epoch from k.indeterminate_at),
	    extract(epoch from now() - coalesce(k.generation_at, k.created_at))
	  into v_lease, v_request, v_generation, v_reconcile, v_taken, v_until,
	    v_age;

	if not found then
		-- Another attempt took or finished the key meanwhile, or it
		-- is in its settle window.
		return query select * from lease_answer_v2(p_client, p_key,
		    p_operation, p_fingerprint);
		perform idem_confirm();
		return;
	end if;

	if v_lease > 1 then
		return query select 'taken_over'::text, v_lease, null::int,
		    null::text, null::int, v_request, v_generation,
		    v_reconcile, v_taken, v_until, null::bigint, null::boolean,
		    false, v_age;
		return;
	end if;

	if v_admit is not null then
		-- Exactly one row, saying yes (a request) or no (a status):
		-- anything else is a fault of the admit function, not a yes.
		execute format('select status_code, response, request, '
		    'retry_after from %s($1, $2, $3)', v_admit)
		   into strict v_status, v_response, v_request, v_retry
		  using p_client, p_key, p_request;

		if v_status is not null then
			delete from idempotency_keys k
			 where k.client_id = p_client and k.idem_key = p_key;
			return query select 'refused'::text, null::bigint,
			    v_status, v_response, v_retry, null::jsonb,
			    null::int, null::boolean, null::double precision,
			    null::double precision, null::bigint, null::boolean,
			    false, null::double precision;
			return;
		end if;

		if v_request is null then
			raise exception '% admitted %:% without a request',
			    v_admit, p_client, p_key;
		end if;

		update idempotency_keys k set request = v_request
		 where k.client_id = p_client and k.idem_key = p_key;
	end if;

	return query select 'reserved'::text, v_lease, null::int, null::text,
	    null::int, v_request, v_generation, v_reconcile, v_taken, v_until,
	    null::bigint, null::boolean, false, v_age;
end;
$$;

comment on function lease_reserve_v2(text, text, text, text, jsonb, int, int) is
    'Lease strategy, step 1: reserved or taken_over (with the lease_id that '
    'fences this attempt, the request to send, the generation of the '
    'provider key, whether it must be reconciled first and the age of the '
    'generation), refused (by the operation''s admit: not taken), else '
    'mismatch, in_flight (with retry_after: the seconds until the holder''s '
    'provider call gives up, or with settling until its settle window '
    'ends) or replayed (with the saved response).';

-- As in 003_lease.sql, and a key in its settle window is passed over.
create or replace function lease_recover_claim_v2(p_after_seconds int,
    p_lease_seconds int, p_call_ms int, p_operations text[] default null)
returns table (client_id text, idem_key text, lease_id bigint,
    operation text, request jsonb, generation int, reconcile boolean,
    taken_at double precision, reconcile_until double precision,
    generation_age double precision)
language sql as $$
	with a as materialized (
		select c.client_id, c.idem_key
		  from idempotency_keys c
		 where c.locked_until < now()
		   and coalesce(c.recover_at, c.locked_until +
			   make_interval(secs => p_after_seconds)) < now()
		   and c.status = 'in_progress'
		   and (c.settle_until is null or c.settle_until <= now())
		   and c.operation in (select o.operation from idem_operations o
			where o.strategy = 'lease' and o.recover)
		   and (p_operations is null or c.operation = any (p_operations))
		 order by coalesce(c.recover_at, c.locked_until +
			   make_interval(secs => p_after_seconds))
		 limit 1
		   for update skip locked)
	update idempotency_keys k
	   set lease_id = k.lease_id + 1,
	       locked_until = now() + make_interval(secs => p_lease_seconds),
	       call_deadline = now() + make_interval(secs => p_call_ms / 1000.0)
	  from a
	 where k.client_id = a.client_id and k.idem_key = a.idem_key
	returning k.client_id, k.idem_key, k.lease_id, k.operation, k.request,
	    k.provider_generation, k.indeterminate,
	    extract(epoch from k.created_at)::double precision,
	    extract(epoch from k.indeterminate_at)::double precision,
	    extract(epoch from now() - coalesce(k.generation_at,
		k.created_at))::double precision;
$$;

comment on function lease_recover_claim_v2(int, int, int, text[]) is
    'Recovery: claims one key abandoned for more than p_after_seconds (or, '
    'after an attempt of the job, due again at recover_at), never one in '
    'its settle window, with a new lease and fencing token, and returns '
    'what is needed to call the provider again with the same derived key.';

-- A development database that ran this file's first version has these
-- three with this release's columns (never a released one: 1.0.0's have
-- no generation_age): they are dropped there, to be made as 1.0.0's.
do $$
declare
	v_fn	regprocedure;
begin
	for v_fn in select p.oid::regprocedure from pg_proc p
	     where p.proname in ('lease_answer', 'lease_reserve',
		   'lease_recover_claim')
	       and p.pronamespace = current_schema()::regnamespace
	       and pg_get_function_result(p.oid) like '%generation_age%'
	loop
		execute format('drop function %s', v_fn);
	end loop;
end;
$$;

-- The previous release's three, as it reads them: this release's rows
-- without their last two columns (a key in its settle window is in_flight,
-- retry_after until the window ends; an older instance answers it 409; a
-- new key "K:<n>" refused as another key's provider key is a mismatch to
-- it, 422 idempotency-key-reused, as to this release).
create or replace function lease_answer(p_client text, p_key text,
    p_operation text, p_fingerprint text)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int, request jsonb, generation int,
    reconcile boolean, taken_at double precision,
    reconcile_until double precision, age_ms bigint, standby boolean)
language sql stable as $$
	select a.outcome, a.lease_id, a.status_code, a.response,
	       a.retry_after, a.request, a.generation, a.reconcile, a.taken_at,
	       a.reconcile_until, a.age_ms, a.standby
	  from lease_answer_v2(p_client, p_key, p_operation, p_fingerprint) a;
$$;

create or replace function lease_reserve(p_client text, p_key text,
    p_operation text, p_fingerprint text, p_request jsonb,
    p_lease_seconds int, p_call_ms int)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int, request jsonb, generation int,
    reconcile boolean, taken_at double precision,
    reconcile_until double precision, age_ms bigint, standby boolean)
language sql as $$
	select case r.outcome when 'collides' then 'mismatch'
		    else r.outcome end, r.lease_id, r.status_code, r.response,
	       r.retry_after, r.request, r.generation, r.reconcile, r.taken_at,
	       r.reconcile_until, r.age_ms, r.standby
	  from lease_reserve_v2(p_client, p_key, p_operation, p_fingerprint,
	      p_request, p_lease_seconds, p_call_ms) r;
$$;

create or replace function lease_recover_claim(p_after_seconds int,
    p_lease_seconds int, p_call_ms int, p_operations text[] default null)
returns table (client_id text, idem_key text, lease_id bigint,
    operation text, request jsonb, generation int, reconcile boolean,
    taken_at double precision, reconcile_until double precision)
language sql as $$
	select c.client_id, c.idem_key, c.lease_id, c.operation, c.request,
	       c.generation, c.reconcile, c.taken_at, c.reconcile_until
	  from lease_recover_claim_v2(p_after_seconds, p_lease_seconds,
	      p_call_ms, p_operations) c;
$$;

comment on function lease_answer(text, text, text, text) is
    'The previous release''s lease_answer(): lease_answer_v2() without '
    'settling and generation_age.';
comment on function lease_reserve(text, text, text, text, jsonb, int, int) is
    'The previous release''s lease_reserve(), for its instances during a '
    'rolling upgrade: lease_reserve_v2() without settling and '
    'generation_age (a key in its settle window is in_flight).';
comment on function lease_recover_claim(int, int, int, text[]) is
    'The previous release''s lease_recover_claim(), for its recovery jobs '
    'during a rolling upgrade: lease_recover_claim_v2() without '
    'generation_age.';

-- As lease_release(text, text, bigint, boolean, int, int), and a proven
-- indeterminate answer (p_indeterminate) starts the settle window of
-- p_settle_seconds.
create or replace function lease_release(p_client text, p_key text,
    p_lease bigint, p_indeterminate boolean, p_base int, p_cap int,
    p_settle_seconds int)
returns table (released boolean, attempts int, wait_seconds int)
language plpgsql as $$
begin
	return query
	update idempotency_keys k
	   set locked_until = now(),
	       indeterminate = k.indeterminate or p_indeterminate,
	       indeterminate_at = case when p_indeterminate then now()
		   else k.indeterminate_at end,
	       settle_until = case when p_indeterminate then now() +
		   make_interval(secs => p_settle_seconds)
		   else k.settle_until end,
	       recovery_attempts = k.recovery_attempts +
		   case when p_base is null then 0 else 1 end,
	       recover_at = case when p_base is null then k.recover_at
		   else now() + make_interval(secs => least(p_cap,
		       p_base * power(2, least(k.recovery_attempts, 30)))) end
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	returning true, k.recovery_attempts, coalesce(extract(epoch from
	    k.recover_at - k.locked_until)::int, 0);

	if not found then
		return query select false, null::int, null::int;
	end if;
end;
$$;

comment on function lease_release(text, text, bigint, boolean, int, int,
    int) is
    'Lease strategy, when an attempt ends without an outcome: ends the '
    'lease now; an indeterminate answer marks the key for reconciliation '
    'and starts its settle window; with p_base backs the recovery job off '
    'the key. released false if fenced.';

-- As lease_generation(text, text, bigint, int, int, int), and also moves a
-- generation that is p_stale_seconds old or more (the provider's key
-- retention less a margin; null: the provider forgets no key) once its
-- listing found nothing. The new generation's clock starts now.
create or replace function lease_generation(p_client text, p_key text,
    p_lease bigint, p_generation int, p_lease_seconds int, p_call_ms int,
    p_stale_seconds int)
returns int
language plpgsql as $$
declare
	v_next	int := p_generation + 1;
	v_gen	int;
begin
	-- A generation n whose provider key <client>:<key>:<n> is already the
	-- client key "<key>:<n>"'s generation 1 is passed over (see
	-- lease_reserve_v2()), under the same lock.
	perform pg_advisory_xact_lock(hashtextextended(p_client || ':' ||
	    p_key, 0));
	while exists (select 1 from idempotency_keys o
		 where o.client_id = p_client
		   and o.idem_key = p_key || ':' || v_next) loop
		v_next := v_next + 1;
	end loop;

	update idempotency_keys k
	   set provider_generation = v_next,
	       indeterminate = false,
	       settle_until = null,
	       generation_at = now(),
	       locked_until = now() + make_interval(secs => p_lease_seconds),
	       call_deadline = now() + make_interval(secs => p_call_ms / 1000.0)
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	   and k.provider_generation = p_generation
	   and (k.indeterminate or p_stale_seconds is not null and
		coalesce(k.generation_at, k.created_at) <=
		now() - make_interval(secs => p_stale_seconds))
	returning k.provider_generation into v_gen;

	return v_gen;
end;
$$;

comment on function lease_generation(text, text, bigint, int, int, int,
    int) is
    'Lease strategy, after a reconciliation found nothing: moves the key to '
    'the next generation of its provider key, under the lease, from an '
    'indeterminate generation or one past the provider''s key retention '
    '(p_stale_seconds), with a new lease and call deadline; a generation '
    'whose provider key is another client key''s is passed over. Null if '
    'fenced.';

-- What a key holds now, for an attempt that lost it (fenced) on any path:
-- one row, the key's status, its saved answer when done, 'gone' when the
-- cleanup has deleted it since.
create or replace function lease_now(p_client text, p_key text)
returns table (outcome text, status_code int, response text, status text)
language plpgsql stable as $$
begin
	return query select 'fenced'::text, k.status_code, k.response,
	    k.status
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
	if not found then
		return query select 'fenced'::text, null::int, null::text,
		    'gone'::text;
	end if;
end;
$$;

comment on function lease_now(text, text) is
    'Lease strategy: the state of a key as a fenced attempt answers it '
    '(as lease_complete() does when fenced). Always one row.';

-- The instances of the previous release (1.0.0) call these two during a
-- rolling upgrade: they now keep the rules above too. A release of an
-- answer it marks indeterminate starts a settle window of 300 s (Stripe's
-- default: 1.0.0 took any 5xx for a kept one), and its next generation
-- passes over another key's provider key and starts its own clock.
create or replace function lease_release(p_client text, p_key text,
    p_lease bigint, p_indeterminate boolean, p_base int, p_cap int)
returns table (released boolean, attempts int, wait_seconds int)
language sql as $$
	select * from lease_release(p_client, p_key, p_lease, p_indeterminate,
	    p_base, p_cap, 300);
$$;

create or replace function lease_generation(p_client text, p_key text,
    p_lease bigint, p_generation int, p_lease_seconds int, p_call_ms int)
returns int
language sql as $$
	select lease_generation(p_client, p_key, p_lease, p_generation,
	    p_lease_seconds, p_call_ms, null::int);
$$;
