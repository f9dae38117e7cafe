-- Payments through an external provider: a lease operation
-- (003_lease.sql). Its own SQL is the table and what a provider's answer
-- saves.

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

-- payments.create: a charge is a payment row and its 201 body; a refusal
-- (card declined, payment rejected) is saved as its problem.
create or replace function payment_settle(p_client text, p_key text,
    p_request jsonb, p_charge_id text, p_status int, p_problem text)
returns table (status_code int, response text)
language plpgsql as $$
begin
	if p_charge_id is null then
		return query select p_status, p_problem;
		return;
	end if;

	return query
	insert into payments (client_id, idem_key, charge_id, amount, currency,
	    recipient, purpose)
	values (p_client, p_key, p_charge_id, (p_request->>'amount')::bigint,
	    p_request->>'currency', p_request->>'recipient',
	    p_request->>'purpose')
	returning 201, format('{"payment_id":%s,"charge_id":%s,'
	    '"status":"succeeded","amount":%s,"currency":%s}',
	    payments.payment_id, to_json(payments.charge_id), payments.amount,
	    to_json(payments.currency));
end;
$$;

comment on function payment_settle(text, text, jsonb, text, int, text) is
    'payments.create (lease): saves a charge as a payment (201) or a '
    'refusal as its problem.';

select idem_operation('payments.create', 'lease', 'payment_settle');
