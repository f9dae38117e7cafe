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

comment on table provider.requests is
    'Every POST /v1/charges the fake provider answered and the status it '
    'answered, refusals included: the provider calls tests count.';

-- The four-argument charge() of databases made before the 409.
drop function if exists provider.charge(text, bigint, text, text);

-- One POST /v1/charges: a refusal (p_refusal, decided by the magic
-- recipients) is answered as it is and keeps no charge; otherwise the key
-- makes its charge (201), or finds the one it made: 409 while the request
-- that made it still thinks, 422 for other parameters, else that charge.
-- Every call is logged in provider.requests.
create or replace function provider.charge(p_key text, p_amount bigint,
    p_currency text, p_recipient text, p_refusal int, p_think_ms int)
returns table (status int, created boolean, charge_id text, amount bigint,
    retry_after int)
language plpgsql as $$
declare
	v_charge	provider.charges;
begin
	created := false;

	if p_refusal is not null then
		status := p_refusal;
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

	insert into provider.requests (idempotency_key, recipient, status)
	values (p_key, p_recipient, status);

	return next;
end;
$$;

comment on function provider.charge(text, bigint, text, text, int, int) is
    'One charge request: status 201 (created, or the key''s charge again), '
    '409 with retry_after while the request that made it still thinks, 422 '
    'for other parameters, or the refusal asked for. Logged in requests.';

create or replace function provider.charges_of(p_key text)
returns text
language sql stable as $$
	select '{"charges":[' || coalesce(string_agg(format(
	    '{"charge_id":%s,"idempotency_key":%s,"amount":%s,"currency":%s,'
	    '"recipient":%s,"created_at":%s}', to_json(c.charge_id),
	    to_json(c.idempotency_key), c.amount, to_json(c.currency),
	    to_json(c.recipient), to_json(c.created_at)), ','
	    order by c.created_at), '') || ']}'
	  from provider.charges c where c.idempotency_key = p_key;
$$;

comment on function provider.charges_of(text) is
    'The body of GET /v1/charges?idempotency_key=K.';
