-- The fake payment provider's own state, in its own schema: killing the
-- API leaves it, as a real provider would be. Dev data: a production
-- database talks to a real provider and has none of this.

create schema if not exists provider;

comment on schema provider is
    'State of the fake payment provider used in development and tests.';

create table if not exists provider.charges (
	charge_id	text primary key
			default 'ch_' || replace(gen_random_uuid()::text, '-', ''),
	idempotency_key	text not null unique,
	amount		bigint not null check (amount > 0),
	currency	text not null,
	recipient	text not null,
	created_at	timestamptz not null default now(),
	answered_at	timestamptz not null default now()
);

-- A database made before the provider answered 409 gets the column too.
alter table provider.charges
    add column if not exists answered_at timestamptz not null default now();

comment on table provider.charges is
    'Every charge the fake provider made; at most one per Idempotency-Key.';
comment on column provider.charges.answered_at is
    'When the request that made the charge is done thinking. Until then '
    'another request with the same key gets 409, as from a real provider '
    'still processing it; after it, the charge.';

create table if not exists provider.requests (
	request_id	bigint generated always as identity primary key,
	idempotency_key	text not null,
	recipient	text not null,
	status		int not null,
	received_at	timestamptz not null default now()
);

create index if not exists requests_key on provider.requests (idempotency_key);

-- A database made before refunds: its rows were all charges. A refund of
-- an unknown charge has no recipient to log.
alter table provider.requests
    add column if not exists kind text not null default 'charge'
    check (kind in ('charge', 'refund'));
alter table provider.requests alter column recipient drop not null;

comment on table provider.requests is
    'Every POST /v1/charges and /v1/refunds the fake provider answered and '
    'the status it answered, refusals included: the provider calls tests '
    'count.';
comment on column provider.requests.recipient is
    'The charge''s recipient, whose magic decides the answer; null for a '
    'refund of an unknown charge.';

create table if not exists provider.kept_answers (
	kind		text not null check (kind in ('charge', 'refund')),
	idempotency_key	text not null,
	status		int not null,
	primary key (kind, idempotency_key)
);

comment on table provider.kept_answers is
    'With IDEM_FAKE_PROVIDER_KEEPS_5XX=1: the 500 a key got, replayed to '
    'every later request with that key, as Stripe API v1 does.';

-- What a request is answered before anything is made: the 500 kept under
-- its key (with p_keeps), else its refusal (decided by the magic
-- recipients), else a 500 when its magic recipient fails the first two
-- keys that ask (fail-twice..., for charges; refund-fail-twice..., the
-- charge's, for refunds: an answer kept under its key that a later key
-- gets past); null to go on. With p_keeps a 5xx is kept under the key.
create or replace function provider.refused(p_kind text, p_key text,
    p_recipient text, p_refusal int, p_keeps boolean)
returns int
language plpgsql as $$
declare
	v_status	int;
begin
	select k.status into v_status from provider.kept_answers k
	 where p_keeps and k.kind = p_kind and k.idempotency_key = p_key;
	if found then
		return v_status;
	end if;

	v_status := coalesce(p_refusal, case
	    when p_recipient like (case p_kind when 'charge' then 'fail-twice%'
		else 'refund-fail-twice%' end)
		and (select count(distinct q.idempotency_key)
		       from provider.requests q
		      where q.kind = p_kind and q.recipient = p_recipient
			and q.status = 500 and q.idempotency_key <> p_key) < 2
	    then 500 end);

	if p_keeps and v_status >= 500 then
		insert into provider.kept_answers
		values (p_kind, p_key, v_status)
		on conflict do nothing;
	end if;

	return v_status;
end;
$$;

drop function if exists provider.fails(text, text, text, int);

drop function if exists provider.charge(text, bigint, text, text, int, int);
drop function if exists provider.refund(text, text, bigint, int, int);
drop function if exists provider.charges_of(text);
drop function if exists provider.refunds_of(text);

-- The four-argument charge() of databases made before the 409.
drop function if exists provider.charge(text, bigint, text, text);

-- One POST /v1/charges: a refusal (p_refusal, decided by the magic
-- recipients) is answered as it is and keeps no charge; otherwise the key
-- makes its charge (201), or finds the one it made: 409 while the request
-- that made it still thinks, 422 for other parameters, else that charge.
-- Every call is logged in provider.requests.
create or replace function provider.charge(p_key text, p_amount bigint,
    p_currency text, p_recipient text, p_refusal int, p_think_ms int,
    p_keeps boolean default false)
returns table (status int, created boolean, charge_id text, amount bigint,
    retry_after int)
language plpgsql as $$
declare
	v_charge	provider.charges;
begin
	created := false;

	status := provider.refused('charge', p_key, p_recipient, p_refusal,
	    p_keeps);

	if status is not null then
		null;
	else
		insert into provider.charges as c (idempotency_key, amount,
		    currency, recipient, answered_at)
		values (p_key, p_amount, p_currency, p_recipient,
		    now() + make_interval(secs => p_think_ms / 1000.0))
		on conflict (idempotency_key) do nothing
		returning c.* into v_charge;
		created := found;

		if not created then
			select c.* into v_charge from provider.charges c
			 where c.idempotency_key = p_key;
		end if;

		charge_id := v_charge.charge_id;
		amount := v_charge.amount;

		if created then
			status := 201;
		elsif (v_charge.amount, v_charge.currency, v_charge.recipient)
		    is distinct from (p_amount, p_currency, p_recipient) then
			status := 422;
		elsif v_charge.answered_at > now() then
			status := 409;
			retry_after := greatest(1, ceil(extract(epoch from
			    v_charge.answered_at - now())))::int;
		else
			status := 201;
		end if;
	end if;

	insert into provider.requests (kind, idempotency_key, recipient, status)
	values ('charge', p_key, p_recipient, status);

	return next;
end;
$$;

comment on function provider.charge(text, bigint, text, text, int, int,
    boolean) is
    'One charge request: status 201 (created, or the key''s charge again), '
    '409 with retry_after while the request that made it still thinks, 422 '
    'for other parameters, or the refusal asked for (a 500 kept under the '
    'key with p_keeps). Logged in requests.';

-- Whether p_candidate is p_key or one of its generations, as the lease
-- strategy derives them from the first one (src/lease/lease.c,
-- provider_key()): K, then K:2, K:3, ...
create or replace function provider.of_generations(p_key text,
    p_candidate text)
returns boolean
language sql immutable as $$
	select p_candidate = p_key
	    or (left(p_candidate, length(p_key) + 1) = p_key || ':'
		and substr(p_candidate, length(p_key) + 2) ~ '^[1-9][0-9]*$');
$$;

-- p_prefix: the charges of the key's generations too (provider.of_generations).
create or replace function provider.charges_of(p_key text,
    p_prefix boolean default false)
returns text
language sql stable as $$
	select '{"charges":[' || coalesce(string_agg(format(
	    '{"charge_id":%s,"idempotency_key":%s,"amount":%s,"currency":%s,'
	    '"recipient":%s,"created_at":%s}', to_json(c.charge_id),
	    to_json(c.idempotency_key), c.amount, to_json(c.currency),
	    to_json(c.recipient), to_json(c.created_at)), ','
	    order by c.created_at), '') || ']}'
	  from provider.charges c
	 where c.idempotency_key = p_key
	    or (p_prefix and provider.of_generations(p_key,
		c.idempotency_key));
$$;

comment on function provider.charges_of(text, boolean) is
    'The body of GET /v1/charges?idempotency_key=K[&prefix=1].';

create table if not exists provider.refunds (
	refund_id	text primary key
			default 're_' || replace(gen_random_uuid()::text, '-', ''),
	idempotency_key	text not null unique,
	charge_id	text not null references provider.charges,
	amount		bigint not null check (amount > 0),
	created_at	timestamptz not null default now(),
	answered_at	timestamptz not null default now()
);

create index if not exists refunds_charge on provider.refunds (charge_id);

comment on table provider.refunds is
    'Every refund the fake provider made; at most one per Idempotency-Key, '
    'and never past the charge''s amount in total.';
comment on column provider.refunds.answered_at is
    'As provider.charges.answered_at: 409 for the key until then.';

-- One POST /v1/refunds, as charge() is one POST /v1/charges: a refusal
-- (p_refusal, decided by the magic recipient of the charge) keeps no
-- refund; otherwise the key makes its refund (201) or finds the one it
-- made (409, 422 or that refund, as for charges). A refund of an unknown
-- charge or past what is left of it is a 400 and keeps nothing, so that
-- the key can be used again once it would pass.
create or replace function provider.refund(p_key text, p_charge_id text,
    p_amount bigint, p_refusal int, p_think_ms int,
    p_keeps boolean default false)
returns table (status int, created boolean, refund_id text, charge_id text,
    amount bigint, retry_after int, detail text)
language plpgsql as $$
declare
	v_charge	provider.charges;
	v_refund	provider.refunds;
	v_refunded	bigint;
begin
	created := false;

	-- Refunds of one charge wait for each other here: two at once cannot
	-- both see the amount that is left.
	select c.* into v_charge from provider.charges c
	 where c.charge_id = p_charge_id
	   for update;

	status := provider.refused('refund', p_key, v_charge.recipient,
	    p_refusal, p_keeps);

	if status is not null then
		null;
	else
		select r.* into v_refund from provider.refunds r
		 where r.idempotency_key = p_key;

		if v_refund.refund_id is null and v_charge.charge_id is null then
			status := 400;
			detail := format('no charge %s', p_charge_id);
		elsif v_refund.refund_id is null then
			select coalesce(sum(r.amount), 0) into v_refunded
			  from provider.refunds r
			 where r.charge_id = p_charge_id;

			if v_refunded + p_amount > v_charge.amount then
				status := 400;
				detail := format('a refund of %s is past the %s '
				    'left of charge %s', p_amount,
				    v_charge.amount - v_refunded, p_charge_id);
			else
				-- A refund of another charge under this key
				-- may commit meanwhile: then it is the key's.
				insert into provider.refunds as r
				    (idempotency_key, charge_id, amount,
				    answered_at)
				values (p_key, p_charge_id, p_amount,
				    now() + make_interval(secs =>
				    p_think_ms / 1000.0))
				on conflict (idempotency_key) do nothing
				returning r.* into v_refund;
				created := found;

				if not created then
					select r.* into v_refund
					  from provider.refunds r
					 where r.idempotency_key = p_key;
				end if;
			end if;
		end if;

		if status is null then
			refund_id := v_refund.refund_id;
			charge_id := v_refund.charge_id;
			amount := v_refund.amount;

			if created then
				status := 201;
			elsif (v_refund.charge_id, v_refund.amount)
			    is distinct from (p_charge_id, p_amount) then
				status := 422;
			elsif v_refund.answered_at > now() then
				status := 409;
				retry_after := greatest(1, ceil(extract(epoch
				    from v_refund.answered_at - now())))::int;
			else
				status := 201;
			end if;
		end if;
	end if;

	insert into provider.requests (kind, idempotency_key, recipient, status)
	values ('refund', p_key, v_charge.recipient, status);

	return next;
end;
$$;

comment on function provider.refund(text, text, bigint, int, int, boolean) is
    'One refund request: status 201 (created, or the key''s refund again), '
    '409 with retry_after while the request that made it still thinks, 422 '
    'for other parameters, 400 with a detail for an unknown charge or one '
    'refunded past its amount, or the refusal asked for. Logged in requests.';

create or replace function provider.refunds_of(p_key text,
    p_prefix boolean default false)
returns text
language sql stable as $$
	select json_build_object('refunds',
	    coalesce(json_agg(r order by r.created_at), '[]'))::text
	  from (select refund_id, idempotency_key, charge_id, amount, created_at
		  from provider.refunds
		 where idempotency_key = p_key
		    or (p_prefix and provider.of_generations(p_key,
			idempotency_key))) r;
$$;

comment on function provider.refunds_of(text, boolean) is
    'The body of GET /v1/refunds?idempotency_key=K[&prefix=1].';
