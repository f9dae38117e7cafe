-- Payments through an external provider: the lease strategy. The key is
-- taken first (reserve), the provider is called outside any transaction,
-- then the outcome is saved (complete) or the lease given back (release).

create table if not exists payments (
	payment_id	bigint generated always as identity primary key,
	client_id	text not null,
	idem_key	text not null,
	charge_id	text not null,
	amount		bigint not null
			check (amount > 0 and amount <= 9007199254740991),
	currency	text not null check (currency ~ '^[A-Z]{3}$'),
	recipient	text not null,
	purpose		text,
	created_at	timestamptz not null default now()
);

comment on table payments is
    'Succeeded payments, one per completed key, with the provider''s charge.';

create index if not exists payments_key on payments (client_id, idem_key);

-- A duplicate is told to come back when the holder's provider call gives
-- up, not when its lease ends: the lease outlasts the call by design, and
-- a released key can be taken at once.
alter table idempotency_keys add column if not exists call_deadline timestamptz;

comment on column idempotency_keys.call_deadline is
    'When the provider call of the attempt that holds the lease gives up '
    '(taken + IDEM_PROVIDER_TIMEOUT_MS): what a duplicate''s Retry-After '
    'counts down to, never past locked_until.';

-- What the row of an existing key answers to another attempt: mismatch,
-- replayed (done), in_flight (its lease holds) or expired (it may be taken
-- over). No row when the key is new. In flight, retry_after is the seconds
-- until the holder's provider call gives up, at least 1: a holder that has
-- given up is releasing the key (or has died and keeps it until its lease
-- ends), so a retry may go on in a second.
create or replace function payment_answer(p_client text, p_key text,
    p_operation text, p_fingerprint text)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int)
language sql stable as $$
	select case when k.operation <> p_operation or
		    k.fingerprint <> p_fingerprint then 'mismatch'
		    when k.status = 'done' then 'replayed'
		    when k.locked_until > now() then 'in_flight'
		    else 'expired' end,
	       k.lease_id, k.status_code, k.response,
	       greatest(1, ceil(extract(epoch from least(k.locked_until,
		   coalesce(k.call_deadline, k.locked_until)) - now())))::int
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
$$;

comment on function payment_answer(text, text, text, text) is
    'The state of an existing key as payment_reserve() answers it.';

-- The six-argument reserve of databases made before call_deadline.
drop function if exists payment_reserve(text, text, text, text, jsonb, int);

-- Takes the key for one attempt: inserts it in_progress with a lease, or
-- takes over a row whose lease expired (its worker died, or gave the lease
-- back) if it is the same request. Otherwise says why not. p_call_ms is
-- the provider timeout of this attempt's call.
create or replace function payment_reserve(p_client text, p_key text,
    p_operation text, p_fingerprint text, p_request jsonb,
    p_lease_seconds int, p_call_ms int)
returns table (outcome text, lease_id bigint, status_code int,
    response text, retry_after int)
language plpgsql as $$
declare
	v_lease		bigint;
begin
	-- A retry that can be answered from the row is answered without the
	-- upsert below, which would lock the row (and serialise replays).
	return query select * from payment_answer(p_client, p_key, p_operation,
	    p_fingerprint) a where a.outcome <> 'expired';
	if found then
		return;
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
	returning k.lease_id into v_lease;

	if found then
		return query select case when v_lease = 1 then 'reserved'
		    else 'taken_over' end, v_lease, null::int, null::text,
		    null::int;
		return;
	end if;

	-- Another attempt took or finished the key meanwhile.
	return query select * from payment_answer(p_client, p_key, p_operation,
	    p_fingerprint);
end;
$$;

comment on function payment_reserve(text, text, text, text, jsonb, int, int) is
    'Lease strategy, step 1: reserved or taken_over (with the lease_id that '
    'fences this attempt), else mismatch, in_flight (with retry_after: the '
    'seconds until the holder''s provider call gives up) or replayed (with '
    'the saved response).';

-- Saves the outcome of an attempt, only if it still holds its lease. A
-- charge is written as a payment first, so that a late worker blocked on
-- that write cannot get ahead of the one that took its key over.
create or replace function payment_complete(p_client text, p_key text,
    p_lease bigint, p_charge_id text, p_status_code int, p_problem text)
returns table (outcome text, status_code int, response text, status text)
language plpgsql as $$
declare
	v_payment	bigint;
	v_response	text := p_problem;
begin
	if p_charge_id is not null then
		insert into payments (client_id, idem_key, charge_id, amount,
		    currency, recipient, purpose)
		select p_client, p_key, p_charge_id, (k.request->>'amount')::bigint,
		       k.request->>'currency', k.request->>'recipient',
		       k.request->>'purpose'
		  from idempotency_keys k
		 where k.client_id = p_client and k.idem_key = p_key
		returning format('{"payment_id":%s,"charge_id":%s,'
		    '"status":"succeeded","amount":%s,"currency":%s}',
		    payment_id, to_json(charge_id), amount, to_json(currency)),
		    payment_id
		into v_response, v_payment;
	end if;

	update idempotency_keys k
	   set status = 'done', status_code = p_status_code,
	       response = v_response, locked_until = null,
	       finished_at = now()
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress';

	if found then
		return query select 'completed'::text, p_status_code,
		    v_response, 'done'::text;
		return;
	end if;

	-- The lease was taken over: this late result is not written.
	delete from payments where payment_id = v_payment;

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

comment on function payment_complete(text, text, bigint, text, int, text) is
    'Lease strategy, step 3: saves a charge (as a payment and its 201 body) '
    'or a refusal (p_problem) if p_lease still holds the key: completed. '
    'Otherwise writes nothing: fenced, with the key''s current state '
    '(status gone when it has been finished and deleted since). Always '
    'one row.';

-- Gives the lease back at once after a provider failure (it ends now),
-- keeping lease_id so that a late worker of this attempt stays fenced.
create or replace function payment_release(p_client text, p_key text,
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

comment on function payment_release(text, text, bigint) is
    'Lease strategy, on a provider failure: ends the lease now, saving '
    'nothing, so that a retry can take the key at once. False if fenced.';
