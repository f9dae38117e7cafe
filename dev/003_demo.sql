-- The demo strategies' own SQL (dev build only, like their routes). Loaded
-- with the dev data by make db, make run and make test; never by the
-- migrations in sql/, so a production database has none of it.

-- The check-then-write of the naive demo strategy: the key is written only
-- after the provider call, by a plain insert that fails for the second of
-- two concurrent requests, too late to stop its charge.
create or replace function demo_naive_save(p_client text, p_key text,
    p_fingerprint text, p_request jsonb, p_charge_id text)
returns table (status_code int, response text)
language plpgsql as $$
declare
	v_response	text;
begin
	insert into payments (client_id, idem_key, charge_id, amount, currency,
	    recipient, purpose)
	values (p_client, p_key, p_charge_id, (p_request->>'amount')::bigint,
	    p_request->>'currency', p_request->>'recipient',
	    p_request->>'purpose')
	returning format('{"payment_id":%s,"charge_id":%s,'
	    '"status":"succeeded","amount":%s,"currency":%s}', payment_id,
	    to_json(charge_id), amount, to_json(currency))
	into v_response;

	insert into idempotency_keys (client_id, idem_key, operation,
	    fingerprint, status, status_code, response, finished_at)
	values (p_client, p_key, 'demo.naive', p_fingerprint, 'done', 201,
	    v_response, now());

	return query select 201, v_response;
end;
$$;

comment on function demo_naive_save(text, text, text, jsonb, text) is
    'Demo only: saves a payment and its key after the charge (the race).';

-- The fresh-provider-key demo is the lease strategy with another provider
-- key: its keys are settled like a payment's, and never recovered.
select idem_operation('demo.fresh-provider-key', 'lease', 'payment_settle',
    null, false);
