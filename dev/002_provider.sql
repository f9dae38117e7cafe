-- The fake payment provider's own state, in its own schema: killing the
-- API leaves it, as a real provider would be.

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
	created_at	timestamptz not null default now()
);

comment on table provider.charges is
    'Every charge the fake provider made; at most one per Idempotency-Key.';

-- Makes the charge for a key, or finds the one already made for it.
create or replace function provider.charge(p_key text, p_amount bigint,
    p_currency text, p_recipient text)
returns table (created boolean, charge_id text, amount bigint,
    currency text, recipient text)
language plpgsql as $$
begin
	return query
	insert into provider.charges as c (idempotency_key, amount, currency,
	    recipient)
	values (p_key, p_amount, p_currency, p_recipient)
	on conflict (idempotency_key) do nothing
	returning true, c.charge_id, c.amount, c.currency, c.recipient;

	if not found then
		return query select false, c.charge_id, c.amount, c.currency,
		    c.recipient
		  from provider.charges c where c.idempotency_key = p_key;
	end if;
end;
$$;

comment on function provider.charge(text, bigint, text, text) is
    'One charge per Idempotency-Key: created, or the existing one.';

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
