-- The lease strategy, for operations outside this database (a charge, a
-- refund at a payment provider). The key is taken first (lease_reserve:
-- in_progress, a lease and a fencing token lease_id), the provider is
-- called outside any transaction with a key derived from the client's,
-- then the outcome is saved (lease_complete) or the lease given back
-- (lease_release). Abandoned keys are finished by the recovery job
-- (lease_recover_claim, lease_recover_release), which backs off per key.
--
-- An operation is registered with idem_operation('name', 'lease', run,
-- admit): run(p_client, p_key, p_request, p_provider_id, p_status,
-- p_problem) returns table (status_code int, response text) saves a
-- success (p_provider_id: the provider's id of it) or a refusal (p_status,
-- p_problem: the saved problem); the optional admit(p_client, p_key,
-- p_request) returns table (status_code int, response text, request jsonb,
-- retry_after int), one row, runs when a new key is taken, and refuses it
-- (a status and its problem; retry_after for a 409) or gives the request
-- to keep (with what the provider call needs).

drop function if exists payment_answer(text, text, text, text);
drop function if exists payment_reserve(text, text, text, text, jsonb, int);
drop function if exists payment_reserve(text, text, text, text, jsonb, int,
    int);
drop function if exists payment_complete(text, text, bigint, text, int,
    text);
drop function if exists payment_release(text, text, bigint);
drop function if exists payment_recover_claim(int, int);
drop function if exists payment_recover_claim(int, int, int);
drop function if exists payment_recover_release(text, text, bigint, int,
    int);

-- The generation of the derived key: 1 sends <client>:<key>, n > 1 sends
-- <client>:<key>:<n>. It moves only from an indeterminate answer (a 5xx
-- the provider keeps under the key and replays) once the provider has
-- said that no operation of this key exists (lease_generation()).
-- (No check constraint: adding one would scan the table under its lock.)
alter table idempotency_keys add column if not exists provider_generation
    int not null default 1;
alter table idempotency_keys add column if not exists indeterminate boolean
    not null default false;
alter table idempotency_keys add column if not exists indeterminate_at
    timestamptz;

comment on column idempotency_keys.provider_generation is
    'Lease strategy: the generation of the provider key this key sends '
    '(1: <client>:<key>; n: <client>:<key>:<n>). Moves only under the lease, '
    'after a reconciliation found no operation of the earlier ones.';
comment on column idempotency_keys.indeterminate is
    'Lease strategy: the last answer of the provider for this generation '
    'was indeterminate (a 5xx the provider keeps under the key): the next '
    'attempt asks the provider whether the operation exists before it '
    'sends anything.';
comment on column idempotency_keys.indeterminate_at is
    'Lease strategy: when the last indeterminate answer came; a '
    'reconciliation lists what the provider made up to then.';

-- The shapes before generations answered fewer columns: dropped once,
-- so that these can be made with the new ones.
do $$
declare
	v_fn	regprocedure;
begin
	for v_fn in select p.oid::regprocedure from pg_proc p
	     where p.proname in ('lease_answer', 'lease_reserve',
		   'lease_recover_claim')
	       and p.pronamespace = current_schema()::regnamespace
	       and (pg_get_function_result(p.oid) not like '%reconcile_until%'
		    or p.proname in ('lease_answer', 'lease_reserve') and
		       pg_get_function_result(p.oid) not like '%age_ms%'
		    or p.proname = 'lease_recover_claim' and p.pronargs = 3)
	loop
		execute format('drop function %s', v_fn);
	end loop;
end;
$$;

-- What the row of an existing key answers to another attempt: mismatch,
-- replayed (done), in_flight (its lease holds) or expired (it may be taken
-- over). No row when the key is new. In flight, retry_after is the seconds
-- until the holder's provider call gives up, at least 1: a holder that has
-- given up is releasing the key (or has died and keeps it until its lease
-- ends), so a retry may go on in a second.
create or replace function lease_answer(p_client text, p_key text,
    p_operation text, p_fingerprint text)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int, request jsonb, generation int,
    reconcile boolean, taken_at double precision,
    reconcile_until double precision, age_ms bigint, standby boolean)
language sql stable as $$
	select case when k.operation <> p_operation or
		    k.fingerprint <> p_fingerprint then 'mismatch'
		    when k.status = 'done' then 'replayed'
		    when k.locked_until > now() then 'in_flight'
		    else 'expired' end,
	       k.lease_id, k.status_code, k.response,
	       greatest(1, ceil(extract(epoch from least(k.locked_until,
		   coalesce(k.call_deadline, k.locked_until)) - now())))::int,
	       null::jsonb, k.provider_generation, k.indeterminate,
	       extract(epoch from k.created_at)::double precision,
	       extract(epoch from k.indeterminate_at)::double precision,
	       greatest(0, (extract(epoch from clock_timestamp() -
		   k.created_at) * 1000)::bigint),
	       idem_standby()
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
$$;

comment on function lease_answer(text, text, text, text) is
    'The state of an existing key as lease_reserve() answers it; age_ms '
    'and standby as tx_execute() answers them, for the replay cache.';

-- Takes the key for one attempt: inserts it in_progress with a lease, or
-- takes over a row whose lease expired (its worker died, or gave the lease
-- back) if it is the same request. Otherwise says why not. p_call_ms is
-- the provider timeout of this attempt's call. A new key runs the
-- operation's admit function with the key taken: a refusal deletes the
-- key again in the same transaction (refused: nothing taken, nothing
-- saved; retry_after is the admit's, for a 409), so a duplicate that
-- waited on it takes it anew. An operation that is not registered is an
-- error before anything is taken: a key the strategy could never settle
-- or recover must not reach the provider.
create or replace function lease_reserve(p_client text, p_key text,
    p_operation text, p_fingerprint text, p_request jsonb,
    p_lease_seconds int, p_call_ms int)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int, request jsonb, generation int,
    reconcile boolean, taken_at double precision,
    reconcile_until double precision, age_ms bigint, standby boolean)
language plpgsql as $$
declare
	v_lease		bigint;
	v_request	jsonb;
	v_generation	int;
	v_reconcile	boolean;
	v_taken		double precision;
	v_until		double precision;
	v_admit		regproc;
	v_status	int;
	v_response	text;
	v_retry		int;
begin
	-- A retry that can be answered from the row is answered without the
	-- upsert below, which would lock the row (and serialise replays).
	return query select * from lease_answer(p_client, p_key, p_operation,
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
	   and k.operation = excluded.operation
	   and k.fingerprint = excluded.fingerprint
	returning k.lease_id, k.request, k.provider_generation, k.indeterminate,
	    extract(epoch from k.created_at), extract(epoch from k.indeterminate_at)
	  into v_lease, v_request, v_generation, v_reconcile, v_taken, v_until;

	if not found then
		-- Another attempt took or finished the key meanwhile.
		return query select * from lease_answer(p_client, p_key,
		    p_operation, p_fingerprint);
		perform idem_confirm();
		return;
	end if;

	if v_lease > 1 then
		return query select 'taken_over'::text, v_lease, null::int,
		    null::text, null::int, v_request, v_generation,
		    v_reconcile, v_taken, v_until, null::bigint, null::boolean;
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
			    null::double precision, null::bigint, null::boolean;
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
	    null::bigint, null::boolean;
end;
$$;

comment on function lease_reserve(text, text, text, text, jsonb, int, int) is
    'Lease strategy, step 1: reserved or taken_over (with the lease_id that '
    'fences this attempt, the request to send, the generation of the '
    'provider key and whether it must be reconciled first), refused (by the '
    'operation''s admit: not taken), else mismatch, in_flight (with '
    'retry_after: the seconds until the holder''s provider call gives up) '
    'or replayed (with the saved response).';

-- Saves the outcome of an attempt, only if it still holds its lease. The
-- operation's run function writes first and the key row is locked last,
-- by the update that checks the lease: a late worker held up in its writes
-- (a lock, a slow disk) holds no lock on the key meanwhile, so a retry can
-- still take the key over once the lease ends. If it has, the update finds
-- another lease, and the block's savepoint undoes what run wrote.
create or replace function lease_complete(p_client text, p_key text,
    p_lease bigint, p_provider_id text, p_status_code int, p_problem text)
returns table (outcome text, status_code int, response text, status text)
language plpgsql as $$
declare
	v_key		idempotency_keys;
	v_run		regproc;
	v_status	int;
	v_response	text;
	v_saved		boolean := false;
begin
	select * into v_key
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;

	-- Fenced already: nothing is run.
	if found and v_key.lease_id = p_lease and
	    v_key.status = 'in_progress' then
		select o.run into v_run
		  from idem_operations o
		 where o.operation = v_key.operation and o.strategy = 'lease';
		if v_run is null then
			raise exception 'no lease operation %', v_key.operation;
		end if;

		begin
			execute format('select status_code, response from '
			    '%s($1, $2, $3, $4, $5, $6)', v_run)
			   into v_status, v_response
			  using p_client, p_key, v_key.request, p_provider_id,
			    p_status_code, p_problem;

			update idempotency_keys k
			   set status = 'done', status_code = v_status,
			       response = v_response, locked_until = null,
			       finished_at = now()
			 where k.client_id = p_client and k.idem_key = p_key
			   and k.lease_id = p_lease and k.status = 'in_progress';

			-- Taken over while run wrote: undo its writes. Only
			-- this SQLSTATE and run's IDF02 (its work done by
			-- another attempt) are caught; run's other errors go to
			-- the caller.
			if not found then
				raise exception 'lease % of %:% was taken over',
				    p_lease, p_client, p_key
				    using errcode = 'IDF01';
			end if;
			v_saved := true;
		exception when sqlstate 'IDF01' then
			v_saved := false;
		when sqlstate 'IDF02' then
			-- run found its work done by another attempt (it waited
			-- for that attempt's commit): fenced if the lease did
			-- move. While this attempt still holds the key it is a
			-- fault in the data (a change by hand), not a fence.
			perform 1
			   from idempotency_keys k
			  where k.client_id = p_client and k.idem_key = p_key
			    and k.lease_id = p_lease and k.status = 'in_progress';
			if found then
				raise exception 'the run of %:% found its work '
				    'done while lease % still holds it',
				    p_client, p_key, p_lease;
			end if;
			v_saved := false;
		end;

		if v_saved then
			return query select 'completed'::text, v_status,
			    v_response, 'done'::text;
			return;
		end if;
	end if;

	-- The lease was taken over: this late result is not written.
	return query select 'fenced'::text, k.status_code, k.response, k.status
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;

	-- The attempt that took it over finished it, and the cleanup has
	-- deleted it since (a short retention): still one row, saying so.
	if not found then
		return query select 'fenced'::text, null::int, null::text,
		    'gone'::text;
	end if;
end;
$$;

comment on function lease_complete(text, text, bigint, text, int, text) is
    'Lease strategy, step 3: saves a success (p_provider_id) or a refusal '
    '(p_status_code, p_problem) through the operation''s run function if '
    'p_lease still holds the key: completed. Otherwise writes nothing: '
    'fenced, with the key''s current state (status gone when it has been '
    'finished and deleted since). Always one row.';

-- Gives the lease back at once after a provider failure (it ends now),
-- keeping lease_id so that a late worker of this attempt stays fenced.
create or replace function lease_release(p_client text, p_key text,
    p_lease bigint)
returns boolean
language plpgsql as $$
begin
	update idempotency_keys
	   set locked_until = now()
	 where client_id = p_client and idem_key = p_key
	   and lease_id = p_lease and status = 'in_progress';
	return found;
end;
$$;

comment on function lease_release(text, text, bigint) is
    'Lease strategy, on a provider failure: ends the lease now, saving '
    'nothing, so that a retry can take the key at once. False if fenced.';

-- Takes over the key that has been due longest, of any lease operation
-- that is recovered, exactly as a retry would (lease_id + 1, and the
-- deadline of its provider call of p_call_ms). A key is due p_after_seconds
-- after its lease ended, the client's time to retry on its own; once the
-- job has tried it, at recover_at. p_operations: the lease operations the
-- calling build can run (a key of another is left to an instance that
-- knows it; null: any).
create or replace function lease_recover_claim(p_after_seconds int,
    p_lease_seconds int, p_call_ms int, p_operations text[] default null)
returns table (client_id text, idem_key text, lease_id bigint,
    operation text, request jsonb, generation int, reconcile boolean,
    taken_at double precision, reconcile_until double precision)
language sql as $$
	-- Chosen once (see idempotency_cleanup()): as a subquery of the
	-- update it could run again for every row and claim several keys,
	-- of which the job would call the provider for the first only.
	with a as materialized (
		select c.client_id, c.idem_key
		  from idempotency_keys c
		 where c.locked_until < now()
		   and coalesce(c.recover_at, c.locked_until +
			   make_interval(secs => p_after_seconds)) < now()
		   and c.status = 'in_progress'
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
	    extract(epoch from k.indeterminate_at)::double precision;
$$;

comment on function lease_recover_claim(int, int, int, text[]) is
    'Recovery: claims one key abandoned for more than p_after_seconds (or, '
    'after an attempt of the job, due again at recover_at) with a new lease '
    'and fencing token, and returns what is needed to call the provider '
    'again with the same derived key.';

-- Ends the job's attempt without an outcome: the lease ends now, so that a
-- client's retry can take the key at once, and the job waits
-- min(p_cap, p_base * 2^n) seconds before its next attempt, n the attempts
-- that failed before this one. Always one row: released false if fenced.
create or replace function lease_recover_release(p_client text,
    p_key text, p_lease bigint, p_base int, p_cap int)
returns table (released boolean, attempts int, wait_seconds int)
language plpgsql as $$
begin
	return query
	update idempotency_keys k
	   set locked_until = now(),
	       recovery_attempts = k.recovery_attempts + 1,
	       recover_at = now() + make_interval(secs => least(p_cap,
		   p_base * power(2, least(k.recovery_attempts, 30))))
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	returning true, k.recovery_attempts, extract(epoch from
	    k.recover_at - k.locked_until)::int;

	if not found then
		return query select false, null::int, null::int;
	end if;
end;
$$;

comment on function lease_recover_release(text, text, bigint, int, int) is
    'Recovery, when the provider failed or still processes the key: '
    'releases the lease like lease_release() and puts the next attempt of '
    'the job off by min(p_cap, p_base * 2^n) seconds, doubling per failed '
    'attempt.';

-- Ends an attempt without an outcome, if it still holds its lease: the
-- lease ends now (a retry may take the key at once) and lease_id stays,
-- so that a late worker of this attempt stays fenced. p_indeterminate
-- marks the provider's answer indeterminate (a 5xx it keeps under the
-- key): the next attempt reconciles before it sends anything. With
-- p_base (the recovery job's attempts), the job's next attempt at the key
-- waits min(p_cap, p_base * 2^n) seconds, n the attempts that failed
-- before this one. Always one row: released false if fenced. The older
-- lease_release(text, text, bigint) and lease_recover_release() stay for
-- the instances of a rolling deploy that still call them.
create or replace function lease_release(p_client text, p_key text,
    p_lease bigint, p_indeterminate boolean, p_base int, p_cap int)
returns table (released boolean, attempts int, wait_seconds int)
language plpgsql as $$
begin
	return query
	update idempotency_keys k
	   set locked_until = now(),
	       indeterminate = k.indeterminate or p_indeterminate,
	       indeterminate_at = case when p_indeterminate then now()
		   else k.indeterminate_at end,
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

comment on function lease_release(text, text, bigint, boolean, int, int) is
    'Lease strategy, when an attempt ends without an outcome: ends the '
    'lease now, marks the key for reconciliation if the answer was '
    'indeterminate, and with p_base backs the recovery job off the key. '
    'released false if fenced.';

-- After a reconciliation found no operation of the key's generations:
-- the next attempt sends the next generation of the provider key. Only
-- under this attempt's lease, only from the generation p_generation it
-- reconciled and only while that one is indeterminate, so that a
-- generation is never skipped nor sent again once given up. The lease and
-- the call's deadline start again, as when the key was taken: the
-- reconciliation took some of them. Null if fenced or moved meanwhile.
create or replace function lease_generation(p_client text, p_key text,
    p_lease bigint, p_generation int, p_lease_seconds int, p_call_ms int)
returns int
language sql as $$
	update idempotency_keys k
	   set provider_generation = k.provider_generation + 1,
	       indeterminate = false,
	       locked_until = now() + make_interval(secs => p_lease_seconds),
	       call_deadline = now() + make_interval(secs => p_call_ms / 1000.0)
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	   and k.provider_generation = p_generation and k.indeterminate
	returning k.provider_generation;
$$;

drop function if exists lease_generation(text, text, bigint, int);

comment on function lease_generation(text, text, bigint, int, int, int) is
    'Lease strategy, after a reconciliation found nothing: moves the key to '
    'the next generation of its provider key, under the lease, with a new '
    'lease and call deadline. Null if fenced.';
