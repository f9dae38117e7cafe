-- Refunds through the provider: a lease operation (003_lease.sql) with an
-- admit function. A refund takes part or all of a succeeded payment back.
--
-- The amount a refund takes is held when its key is taken, in the same
-- transaction (refund_admit: a pending refunds row), and the payment's
-- row is locked while the hold is decided, so that refunds of one payment
-- are admitted one at a time: two refunds that together exceed the
-- payment never both reach the provider. The hold is a refund's until
-- its outcome: kept while it is unfinished (a provider failure, a dead
-- worker: the retry or the recovery job finishes it), turned into a
-- refund when the provider refunds, and freed when it refuses.

create table if not exists refunds (
	refund_id	bigint generated always as identity primary key,
	payment_id	bigint not null references payments (payment_id),
	client_id	text not null,
	idem_key	text not null,
	amount		bigint not null
			check (amount > 0 and amount <= 9007199254740991),
	reason		text,
	status		text not null default 'pending'
			check (status in ('pending', 'succeeded', 'rejected')),
	provider_refund_id text,
	created_at	timestamptz not null default now(),
	finished_at	timestamptz,
	check ((status = 'succeeded') = (provider_refund_id is not null))
);

comment on table refunds is
    'Refunds of payments: pending (its amount held, the provider call not '
    'finished), succeeded (with the provider''s refund) or rejected (the '
    'provider refused; nothing held).';

create index if not exists refunds_payment on refunds (payment_id);

select idem_problem_type('payment-not-found', 404,
    'No such payment of this client');
select idem_problem_type('refund-exceeds-payment', 422,
    'The refund exceeds what is left of the payment');
select idem_problem_type('refund-in-progress', 409,
    'Other refunds of this payment are in progress');

-- refunds.create, admit: runs in lease_reserve()'s transaction once the
-- key is taken. Refuses (the key is then deleted again: nothing taken)
-- a payment that is not this client's, a refund larger than what the
-- payment's succeeded refunds leave (422: it can never succeed), or one
-- that fits only if refunds now in flight fail (409: retry). Otherwise
-- holds the amount and gives the request to keep: the client's, with the
-- refund's id and the payment's charge, which the provider is sent.
drop function if exists refund_admit(text, text, jsonb);

create or replace function refund_admit(p_client text, p_key text,
    p_request jsonb)
returns table (status_code int, response text, request jsonb,
    retry_after int)
language plpgsql as $$
declare
	v_payment	payments;
	v_amount	bigint := (p_request->>'amount')::bigint;
	v_refunded	bigint;
	v_held		bigint;
	v_refund	bigint;
	v_retry		int;
begin
	-- The lock that admits the refunds of one payment one at a time.
	select p.* into v_payment
	  from payments p
	 where p.payment_id = (p_request->>'payment_id')::bigint
	   and p.client_id = p_client
	   for update;

	if not found then
		return query select p.*, null::jsonb, null::int
		  from idem_problem('payment-not-found', format('no payment %s '
		      'of this client', p_request->>'payment_id')) p;
		return;
	end if;

	select coalesce(sum(r.amount) filter (where r.status = 'succeeded'),
		   0),
	       coalesce(sum(r.amount) filter (where r.status = 'pending'), 0)
	  into v_refunded, v_held
	  from refunds r
	 where r.payment_id = v_payment.payment_id;

	if v_amount > v_payment.amount - v_refunded then
		return query select p.*, null::jsonb, null::int
		  from idem_problem('refund-exceeds-payment', format('payment '
		      '%s of %s has %s refunded: at most %s more can be '
		      'refunded, not %s', v_payment.payment_id,
		      v_payment.amount, v_refunded,
		      v_payment.amount - v_refunded, v_amount),
		      format(',"payment_id":%s,"payment_amount":%s,'
		      '"refunded":%s', v_payment.payment_id, v_payment.amount,
		      v_refunded)) p;
		return;
	end if;

	if v_amount > v_payment.amount - v_refunded - v_held then
		-- When to try again: when the first of the refunds in flight
		-- ends its provider call (it settles, or is released at once).
		-- Refunds released after a provider failure wait for a retry
		-- of their own client or for the recovery job: at least 30 s,
		-- or until the job's next attempt. Measured from now, not from
		-- this transaction's start (now()): it may have waited for the
		-- first refund's hold to commit, and its Retry-After would be
		-- that much too long.
		select greatest(1, ceil(extract(epoch from min(
			   case when k.locked_until > clock_timestamp() then
				   least(k.locked_until, coalesce(k.call_deadline,
				       k.locked_until))
			   else greatest(k.recover_at,
				   clock_timestamp() + interval '30 seconds') end) -
			   clock_timestamp())))::int
		  into v_retry
		  from refunds r
		  join idempotency_keys k
		    on k.client_id = r.client_id and k.idem_key = r.idem_key
		 where r.payment_id = v_payment.payment_id
		   and r.status = 'pending' and k.status = 'in_progress';

		return query select p.*, null::jsonb, coalesce(v_retry, 1)
		  from idem_problem('refund-in-progress', format('payment %s of '
		      '%s has %s refunded and %s in refunds not finished yet: '
		      'a refund of %s fits only if some of those fail; retry '
		      'once they are done', v_payment.payment_id,
		      v_payment.amount, v_refunded, v_held, v_amount),
		      format(',"payment_id":%s,"payment_amount":%s,'
		      '"refunded":%s,"pending":%s', v_payment.payment_id,
		      v_payment.amount, v_refunded, v_held)) p;
		return;
	end if;

	insert into refunds (payment_id, client_id, idem_key, amount, reason)
	values (v_payment.payment_id, p_client, p_key, v_amount,
	    p_request->>'reason')
	returning refund_id into v_refund;

	return query select null::int, null::text, p_request ||
	    jsonb_build_object('refund_id', v_refund, 'charge_id',
	    v_payment.charge_id), null::int;
end;
$$;

comment on function refund_admit(text, text, jsonb) is
    'refunds.create (lease), when its key is taken: holds the amount on the '
    'client''s payment (a pending refund), or refuses: payment-not-found '
    '404, refund-exceeds-payment 422, refund-in-progress 409.';

-- refunds.create, run: the provider's refund makes the held refund
-- succeeded (201); a refusal saves its problem and frees the hold.
create or replace function refund_settle(p_client text, p_key text,
    p_request jsonb, p_provider_refund text, p_status int, p_problem text)
returns table (status_code int, response text)
language plpgsql as $$
begin
	if p_provider_refund is null then
		update refunds r
		   set status = 'rejected', finished_at = now()
		 where r.refund_id = (p_request->>'refund_id')::bigint
		   and r.status = 'pending';
		-- As below: the hold is freed here or it was settled already.
		if not found then
			raise exception 'refund % of %:% was finished by another '
			    'attempt', p_request->>'refund_id', p_client, p_key
			    using errcode = 'IDF02';
		end if;
		return query select p_status, p_problem;
		return;
	end if;

	return query
	update refunds r
	   set status = 'succeeded', provider_refund_id = p_provider_refund,
	       finished_at = now()
	 where r.refund_id = (p_request->>'refund_id')::bigint
	   and r.status = 'pending'
	returning 201, format('{"refund_id":%s,"payment_id":%s,'
	    '"provider_refund_id":%s,"amount":%s,"status":"succeeded"}',
	    r.refund_id, r.payment_id, to_json(r.provider_refund_id),
	    r.amount);

	-- Finished meanwhile: an attempt that took the key over has saved
	-- it (this update waited for its commit). This attempt is fenced:
	-- IDF02, which lease_complete() answers as such once it has seen
	-- that the lease did move.
	if not found then
		raise exception 'refund % of %:% was finished by another attempt',
		    p_request->>'refund_id', p_client, p_key
		    using errcode = 'IDF02';
	end if;
end;
$$;

comment on function refund_settle(text, text, jsonb, text, int, text) is
    'refunds.create (lease): saves the provider''s refund (201) or its '
    'refusal (the problem; the hold freed).';

select idem_operation('refunds.create', 'lease', 'refund_settle',
    'refund_admit');

-- GET /v1/payments/{payment_id}: the client's payment with its refunds
-- (every refund, with its status; refunded sums the succeeded ones), or
-- NULL when there is no such payment of this client.
create or replace function payment_read(p_client text, p_payment bigint)
returns text
language sql stable as $$
	select format('{"payment_id":%s,"charge_id":%s,"status":"succeeded",'
	    '"amount":%s,"currency":%s,"refunded":%s,"refunds":[%s]}',
	    p.payment_id, to_json(p.charge_id), p.amount, to_json(p.currency),
	    coalesce(r.refunded, 0), coalesce(r.list, ''))
	  from payments p
	  left join lateral (
		select sum(x.amount) filter (where x.status = 'succeeded')
			   as refunded,
		       string_agg(format('{"refund_id":%s,"amount":%s,'
			   '"status":%s}', x.refund_id, x.amount,
			   to_json(x.status)), ',' order by x.refund_id)
			   as list
		  from refunds x
		 where x.payment_id = p.payment_id) r on true
	 where p.payment_id = p_payment and p.client_id = p_client;
$$;

comment on function payment_read(text, bigint) is
    'The body of GET /v1/payments/{payment_id}, or NULL for an unknown '
    'payment or another client''s.';
