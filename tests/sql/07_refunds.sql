-- refunds.create through the lease strategy's SQL: refund_admit holds the
-- amount when the key is taken (or refuses, leaving no key), refund_settle
-- turns the hold into a refund or frees it, and payment_read shows them.
begin;
select plan(42);

-- A payment of 10000 of shop-1, as payments.create saves it.
do $$ begin perform lease_reserve_v2('shop-1', 'pay-r', 'payments.create',
    repeat('a', 64), '{"amount":10000,"currency":"RUB","recipient":"acc"}', 30,
    10000); end $$;
create temporary table pay as
select (regexp_match(response, '"payment_id":(\d+)'))[1]::bigint as id
  from lease_complete('shop-1', 'pay-r', 1, 'ch_r', 201, null);

create function pg_temp.refund(p_key text, p_amount bigint,
    p_client text default 'shop-1', p_payment bigint default null)
returns table (outcome text, status_code int, response text, request jsonb,
    retry_after int)
language sql as $$
	select r.outcome, r.status_code, r.response, r.request, r.retry_after
	  from lease_reserve_v2(p_client, p_key, 'refunds.create', md5(p_key) || md5(p_key),
	      jsonb_build_object('payment_id', coalesce(p_payment,
		  (select id from pay)), 'amount', p_amount), 30, 10000) r;
$$;

-- Refused before anything is taken.
select results_eq($$select outcome, status_code from pg_temp.refund('r-other', 100,
    'shop-2')$$, $$values ('refused'::text, 404)$$,
    'another client''s payment: refused, 404');
select ok((select response like '%/problems/payment-not-found"%' from
    pg_temp.refund('r-other', 100, 'shop-2')), 'payment-not-found');
select results_eq($$select outcome, status_code from pg_temp.refund('r-none', 100,
    'shop-1', 999999999)$$, $$values ('refused'::text, 404)$$,
    'an unknown payment: 404');
select results_eq($$select outcome, status_code from pg_temp.refund('r-big', 10001)$$,
    $$values ('refused'::text, 422)$$, 'more than the payment: 422');
select ok((select response like '%/problems/refund-exceeds-payment"%"refunded":0}' from
    pg_temp.refund('r-big', 10001)), 'refund-exceeds-payment, with what is refunded');
select is((select count(*) from idempotency_keys
    where idem_key in ('r-other', 'r-none', 'r-big')), 0::bigint,
    'a refused refund leaves no key');
select is((select count(*) from refunds where payment_id = (select id from pay)),
    0::bigint, 'and holds nothing');

-- A refund of 6000 is taken: its amount is held.
create temporary table r1 as select * from pg_temp.refund('r-1', 6000);
select is((select outcome from r1), 'reserved', 'a refund that fits is reserved');
select is((select request->>'charge_id' from r1), 'ch_r',
    'the request to send names the payment''s charge');
select is((select (request->>'refund_id')::bigint from r1),
    (select refund_id from refunds where idem_key = 'r-1'),
    'and the held refund');
select is((select request from idempotency_keys where idem_key = 'r-1'),
    (select request from r1), 'the key keeps that request for a retry or the recovery');
select results_eq($$select status, amount from refunds where idem_key = 'r-1'$$,
    $$values ('pending'::text, 6000::bigint)$$, 'the hold: a pending refund of 6000');

-- While it is held, 6000 more fits only if it fails: 409. 4000 fits.
select results_eq($$select outcome, status_code from pg_temp.refund('r-2', 6000)$$,
    $$values ('refused'::text, 409)$$, 'a second 6000 while the first is held: 409');
select ok((select response like '%/problems/refund-in-progress"%"pending":6000}' from
    pg_temp.refund('r-2', 6000)), 'refund-in-progress, with what is held');
select is((select count(*) from idempotency_keys where idem_key = 'r-2'), 0::bigint,
    'not taken');
select ok((select retry_after from pg_temp.refund('r-2', 6000)) between 9 and 10,
    'told to retry when the held refund''s provider call gives up (10 s), not in 1 s');
update idempotency_keys set locked_until = now() - interval '1 second'
 where idem_key = 'r-1';
select is((select retry_after from pg_temp.refund('r-2', 6000)), 30,
    'once it is released (a provider failure), in 30 s at the soonest');
update idempotency_keys set locked_until = now() + interval '30 seconds'
 where idem_key = 'r-1';
select is((select outcome from pg_temp.refund('r-3', 4000)), 'reserved',
    '4000 more fits beside the hold');

-- The provider refunds the first; it refuses the second.
select results_eq($$select outcome, status_code from lease_complete('shop-1', 'r-1', 1,
    're_1', 201, null)$$, $$values ('completed'::text, 201)$$, 'the refund is completed');
select is((select response from idempotency_keys where idem_key = 'r-1'),
    format('{"refund_id":%s,"payment_id":%s,"provider_refund_id":"re_1","amount":6000,'
    '"status":"succeeded"}', (select refund_id from refunds where idem_key = 'r-1'),
    (select id from pay)), 'its saved 201');
select results_eq($$select status, provider_refund_id from refunds where idem_key = 'r-1'$$,
    $$values ('succeeded'::text, 're_1'::text)$$, 'the refund row succeeded');
select results_eq($$select outcome, status_code from lease_complete('shop-1', 'r-3', 1,
    null, 422, '{"type":"x"}')$$, $$values ('completed'::text, 422)$$,
    'a refusal is completed');
select is((select status from refunds where idem_key = 'r-3'), 'rejected',
    'and frees its hold');

-- 6000 refunded: 6000 more is more than the payment, 4000 fits.
select is((select status_code from pg_temp.refund('r-4', 6000)), 422,
    'now 6000 more can never fit: 422');
select is((select outcome from pg_temp.refund('r-5', 4000)), 'reserved',
    'the rest, 4000, is reserved');
select is((select outcome from lease_complete('shop-1', 'r-5', 1, 're_5', 201, null)),
    'completed', 'and refunded');
select is((select status_code from pg_temp.refund('r-6', 1)), 422,
    'a fully refunded payment refuses even 1');

-- A late worker fenced after the take-over finished the refund.
select is((select outcome from pg_temp.refund('r-7', 1, 'shop-1',
    (select id from pay))), 'refused', 'nothing left for r-7');
do $$ begin
	perform lease_reserve_v2('shop-1', 'pay-s', 'payments.create', repeat('a', 64),
	    '{"amount":500,"currency":"RUB","recipient":"acc"}', 30, 10000);
	perform lease_complete('shop-1', 'pay-s', 1, 'ch_s', 201, null);
	perform pg_temp.refund('r-8', 500, 'shop-1', (select payment_id from payments
	    where charge_id = 'ch_s'));
end $$;
update idempotency_keys set locked_until = now() - interval '1 second'
 where idem_key = 'r-8';
select is((select outcome from pg_temp.refund('r-8', 500, 'shop-1',
    (select payment_id from payments where charge_id = 'ch_s'))), 'taken_over',
    'an abandoned refund is taken over, its hold kept');
select is((select count(*) from refunds where idem_key = 'r-8'), 1::bigint,
    'one hold, not two');
select is((select outcome from lease_complete('shop-1', 'r-8', 2, 're_8', 201, null)),
    'completed', 'the new holder completes it');
select is((select outcome from lease_complete('shop-1', 'r-8', 1, 're_8', 201, null)),
    'fenced', 'the late worker is fenced');

-- A run that finds its work done while its attempt still holds the key is
-- an error (data changed by hand), not a fence that would leave the key
-- unfinished for good; the same for a refusal whose hold is gone.
do $$ begin
	perform lease_reserve_v2('shop-1', 'pay-t', 'payments.create', repeat('a', 64),
	    '{"amount":900,"currency":"RUB","recipient":"acc"}', 30, 10000);
	perform lease_complete('shop-1', 'pay-t', 1, 'ch_t', 201, null);
	perform pg_temp.refund('r-9', 100, 'shop-1', (select payment_id from payments
	    where charge_id = 'ch_t'));
	perform pg_temp.refund('r-10', 100, 'shop-1', (select payment_id from payments
	    where charge_id = 'ch_t'));
end $$;
update refunds set status = 'succeeded', provider_refund_id = 're_hand'
 where idem_key = 'r-9';
select throws_like($$select * from lease_complete('shop-1', 'r-9', 1, 're_9', 201,
    null)$$, '%found its work done while lease 1 still holds it%',
    'a success whose refund was settled by hand, under its own lease: an error');
update refunds set status = 'rejected' where idem_key = 'r-10';
select throws_like($$select * from lease_complete('shop-1', 'r-10', 1, null, 422,
    '{}')$$, '%found its work done while lease 1 still holds it%',
    'a refusal whose hold is gone, under its own lease: an error');
select is((select count(*) from idempotency_keys where idem_key in ('r-9', 'r-10')
    and status = 'in_progress'), 2::bigint, 'and the keys are not finished');

-- A lease operation that is not registered takes no key; an admit that
-- answers no row is an error, not a yes; so is an unknown problem type.
select throws_like($$select * from lease_reserve_v2('shop-1', 'x-1', 'refunds.creat',
    repeat('a', 64), '{}', 30, 10000)$$, '%no lease operation refunds.creat%',
    'an unregistered lease operation is an error');
select is((select count(*) from idempotency_keys where idem_key = 'x-1'), 0::bigint,
    'before its key is taken (nothing reaches the provider)');
create function pg_temp.admit_none(p_client text, p_key text, p_request jsonb)
returns table (status_code int, response text, request jsonb, retry_after int)
language sql as $$ select null::int, null::text, null::jsonb, null::int where false $$;
select idem_operation('test.admit-none', 'lease', 'payment_settle',
    'pg_temp.admit_none');
select throws_ok($$select * from lease_reserve_v2('shop-1', 'x-2', 'test.admit-none',
    repeat('a', 64), '{}', 30, 10000)$$, 'P0002', null,
    'an admit that answers no row is an error');
select is((select count(*) from idempotency_keys where idem_key = 'x-2'), 0::bigint,
    'and takes no key');
select throws_like($$select * from idem_problem('refund-in-progres', 'x')$$,
    '%no problem type refund-in-progres%', 'an unknown problem type is an error');

-- The read.
select is(payment_read('shop-1', (select id from pay))::jsonb,
    jsonb_build_object('payment_id', (select id from pay), 'charge_id', 'ch_r',
    'status', 'succeeded', 'amount', 10000, 'currency', 'RUB', 'refunded', 10000,
    'refunds', (select jsonb_agg(jsonb_build_object('refund_id', refund_id, 'amount',
    amount, 'status', status) order by refund_id) from refunds
    where payment_id = (select id from pay))),
    'payment_read: the payment, what is refunded, every refund with its status');
select is(payment_read('shop-2', (select id from pay)), null,
    'another client''s payment reads as none');

select * from finish();
rollback;
