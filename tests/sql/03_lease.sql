-- The SQL of the lease strategy (lease_reserve_v2, lease_complete,
-- lease_release, here with payments.create): reserve, take-over, complete,
-- release and the fencing rule; and the fake provider's one charge and one
-- refund per key, and its 409.
begin;
select plan(93);

create temporary table r1 as select * from lease_reserve_v2('shop-1', 'p-1',
    'payments.create', repeat('a', 64),
    '{"amount":100,"currency":"RUB","recipient":"acc"}', 30, 10000);
select is((select outcome from r1), 'reserved', 'a new key is reserved');
select is((select lease_id from r1), 1::bigint, 'with lease 1');
select is((select request from r1),
    '{"amount":100,"currency":"RUB","recipient":"acc"}'::jsonb,
    'and the request to send the provider');
select is((select status from idempotency_keys where idem_key = 'p-1'),
    'in_progress', 'the key is in_progress');
select ok((select locked_until > now() + interval '29 seconds'
    from idempotency_keys where idem_key = 'p-1'), 'leased for 30 seconds');

create temporary table r2 as select * from lease_reserve_v2('shop-1', 'p-1',
    'payments.create', repeat('a', 64), '{}', 30, 10000);
select is((select outcome from r2), 'in_flight', 'a duplicate while the lease holds');
select is((select retry_after from r2), 10,
    'is told to retry when the holder''s provider call gives up (10 s), not when '
    'its lease ends (30 s)');
select is((select lease_id from idempotency_keys where idem_key = 'p-1'), 1::bigint,
    'and does not touch the lease');
select is((select outcome from lease_reserve_v2('shop-1', 'p-1', 'payments.create',
    repeat('b', 64), '{}', 30, 10000)), 'mismatch', 'another fingerprint is a mismatch');
select is((select outcome from lease_reserve_v2('shop-1', 'p-1', 'demo.naive',
    repeat('a', 64), '{}', 30, 10000)), 'mismatch', 'another operation is a mismatch');

update idempotency_keys set call_deadline = now() - interval '1 second'
 where idem_key = 'p-1';
select is((select retry_after from lease_reserve_v2('shop-1', 'p-1', 'payments.create',
    repeat('a', 64), '{}', 30, 10000)), 1,
    'once the holder''s call has given up (it is releasing, or died): 1 s');
update idempotency_keys set call_deadline = now() + interval '1 hour'
 where idem_key = 'p-1';
select is((select retry_after from lease_reserve_v2('shop-1', 'p-1', 'payments.create',
    repeat('a', 64), '{}', 30, 10000)), 30, 'never past the end of the lease');

-- The first worker dies; its lease runs out.
update idempotency_keys set locked_until = now() - interval '1 second'
 where idem_key = 'p-1';
select is((select outcome from lease_reserve_v2('shop-1', 'p-1', 'payments.create',
    repeat('b', 64), '{}', 30, 10000)), 'mismatch',
    'an expired lease is not taken over by another request');
create temporary table r3 as select * from lease_reserve_v2('shop-1', 'p-1',
    'payments.create', repeat('a', 64), '{}', 30, 10000);
select is((select outcome from r3), 'taken_over', 'the same request takes an expired lease over');
select is((select lease_id from r3), 2::bigint, 'with the next fencing token');
select is((select request from r3),
    '{"amount":100,"currency":"RUB","recipient":"acc"}'::jsonb,
    'and the request kept when the key was taken, not the retry''s');

-- The first worker comes back late with lease 1.
select results_eq($$select outcome, status from lease_complete('shop-1', 'p-1', 1,
    'ch_late', 201, null)$$, $$values ('fenced'::text, 'in_progress'::text)$$,
    'completing with a lost lease is fenced');
select is((select count(*)::int from payments where idem_key = 'p-1'), 0,
    'and writes no payment');
select is((select status from idempotency_keys where idem_key = 'p-1'), 'in_progress',
    'nor the key');
select is(lease_release('shop-1', 'p-1', 1), false, 'nor can it release the lease');
select ok((select locked_until > now() from idempotency_keys where idem_key = 'p-1'),
    'which the new holder keeps');

create temporary table c1 as select * from lease_complete('shop-1', 'p-1', 2,
    'ch_1', 201, null);
select is((select outcome from c1), 'completed', 'the holder completes');
select is((select response::jsonb - 'payment_id' from c1),
    '{"charge_id":"ch_1","status":"succeeded","amount":100,"currency":"RUB"}'::jsonb,
    'with the payment''s body, from the fields kept at reserve');
select is((select count(*)::int from payments where idem_key = 'p-1' and charge_id = 'ch_1'),
    1, 'one payment row with the charge');
select results_eq($$select status, status_code, locked_until from idempotency_keys
    where idem_key = 'p-1'$$, $$values ('done'::text, 201, null::timestamptz)$$,
    'the key is done, lease cleared');
select results_eq($$select outcome, status_code, response from lease_reserve_v2('shop-1',
    'p-1', 'payments.create', repeat('a', 64), '{}', 30, 10000)$$,
    $$select 'replayed'::text, 201, response from c1$$,
    'a retry after completion gets the saved response');
select results_eq($$select outcome, status from lease_complete('shop-1', 'p-1', 1,
    'ch_late', 201, null)$$, $$values ('fenced'::text, 'done'::text)$$,
    'a late worker after completion is fenced and told the key is done');
select is((select count(*)::int from payments where idem_key = 'p-1'), 1,
    'still one payment');

-- With a short retention the key the new holder finished may be deleted
-- before the late worker comes back.
savepoint cleaned;
delete from idempotency_keys where idem_key = 'p-1';
select results_eq($$select outcome, status_code, response, status from lease_complete(
    'shop-1', 'p-1', 1, 'ch_late', 201, null)$$,
    $$values ('fenced'::text, null::int, null::text, 'gone'::text)$$,
    'a late worker whose key was finished and deleted gets one row: fenced, gone');
select is((select count(*)::int from payments where charge_id = 'ch_late'), 0,
    'and writes no payment');
rollback to savepoint cleaned;

-- A provider failure: the lease is given back at once.
select is((select lease_id from lease_reserve_v2('shop-1', 'p-2', 'payments.create',
    repeat('a', 64), '{"amount":5,"currency":"EUR","recipient":"x"}', 30, 10000)), 1::bigint,
    'p-2 reserved');
select is(lease_release('shop-1', 'p-2', 1), true, 'the holder releases');
select results_eq($$select status, status_code from idempotency_keys where idem_key = 'p-2'$$,
    $$values ('in_progress'::text, null::int)$$, 'nothing is saved');
create temporary table r4 as select * from lease_reserve_v2('shop-1', 'p-2',
    'payments.create', repeat('a', 64), '{}', 30, 10000);
select results_eq($$select outcome, lease_id from r4$$,
    $$values ('taken_over'::text, 2::bigint)$$, 'a retry takes the key at once, fenced anew');

-- A decline is saved and replayed.
select is((select outcome from lease_complete('shop-1', 'p-2', 2, null, 402,
    '{"type":"x","status":402}')), 'completed', 'a decline completes');
select results_eq($$select status_code, response from idempotency_keys where idem_key = 'p-2'$$,
    $$values (402, '{"type":"x","status":402}'::text)$$, 'as a saved 402');
select is((select count(*)::int from payments where idem_key = 'p-2'), 0,
    'with no payment row');

select is((select outcome from lease_reserve_v2('shop-2', 'p-1', 'payments.create',
    repeat('a', 64), '{}', 30, 10000)), 'reserved', 'the same key of another client is its own');

-- The run function writes before the key row is locked: a take-over while
-- it wrote (simulated here by a run that bumps the lease itself) fences
-- the late result and undoes its writes; run's own errors reach the caller.
create function test_taken_over_run(p_client text, p_key text,
    p_request jsonb, p_id text, p_status int, p_problem text)
returns table (status_code int, response text)
language sql as $$
	insert into payments (client_id, idem_key, charge_id, amount, currency,
	    recipient)
	values (p_client, p_key, p_id, 1, 'RUB', 'acc');
	update idempotency_keys k set lease_id = k.lease_id + 1
	 where k.client_id = p_client and k.idem_key = p_key;
	select 201, '{}'::text;
$$;
create function test_failing_run(p_client text, p_key text,
    p_request jsonb, p_id text, p_status int, p_problem text)
returns table (status_code int, response text)
language plpgsql as $$
begin
	raise exception 'run failed' using errcode = '22012';
end;
$$;
select idem_operation('test.taken-over', 'lease', 'test_taken_over_run');
select idem_operation('test.failing', 'lease', 'test_failing_run');
select is((select outcome from lease_reserve_v2('shop-1', 'p-3', 'test.taken-over',
    repeat('a', 64), '{}', 30, 10000)), 'reserved', 'p-3 reserved');
select results_eq($$select outcome, status from lease_complete('shop-1', 'p-3', 1,
    'ch_3', 201, null)$$, $$values ('fenced'::text, 'in_progress'::text)$$,
    'a lease taken over while run wrote is fenced');
select is((select count(*)::int from payments where charge_id = 'ch_3'), 0,
    'and what run wrote is undone');
select is((select outcome from lease_reserve_v2('shop-1', 'p-4', 'test.failing',
    repeat('a', 64), '{}', 30, 10000)), 'reserved', 'p-4 reserved');
select throws_ok($$select * from lease_complete('shop-1', 'p-4', 1, 'ch_4', 201,
    null)$$, '22012', 'run failed', 'an error of run is the caller''s, not a fence');

-- Generations of the derived key: an indeterminate answer marks the key
-- (lease_release with p_indeterminate), a reconciliation that found nothing
-- moves it to the next generation under the lease, once.
select is((select outcome from lease_reserve_v2('shop-1', 'g-1', 'payments.create',
    repeat('a', 64), '{"amount":100,"currency":"RUB","recipient":"acc"}', 30, 10000)),
    'reserved', 'g-1 reserved');
select results_eq($$select generation, reconcile from lease_answer_v2('shop-1', 'g-1',
    'payments.create', repeat('a', 64))$$, $$values (1, false)$$,
    'a new key is at generation 1, nothing to reconcile');
select is((select lease_generation('shop-1', 'g-1', 1, 1, 30, 10000)), null::int,
    'a key whose last answer was not indeterminate keeps its generation');
select results_eq($$select released, attempts from lease_release('shop-1', 'g-1', 1,
    true, null, null)$$, $$values (true, 0)$$,
    'an indeterminate answer releases the key, no recovery attempt counted');
select ok((select indeterminate_at between now() - interval '1 second' and now()
    from idempotency_keys where idem_key = 'g-1'), 'and records when it came');
select ok((select settle_until > now() + interval '299 seconds' from idempotency_keys
    where idem_key = 'g-1'), 'the six-argument release (the previous release''s) '
    'starts a settle window of 300 s');
select results_eq($$select outcome, settling, retry_after > 290 from lease_reserve_v2('shop-1',
    'g-1', 'payments.create', repeat('a', 64), '{}', 30, 10000)$$,
    $$values ('in_flight'::text, true, true)$$,
    'in the window a retry takes nothing: in flight, settling, Retry-After its end');
select results_eq($$select outcome, retry_after > 290 from lease_reserve('shop-1',
    'g-1', 'payments.create', repeat('a', 64), '{}', 30, 10000)$$,
    $$values ('in_flight'::text, true)$$,
    'the previous release''s lease_reserve() (its columns) takes nothing either: '
    'in flight, Retry-After the window''s end');
-- The window passes, as time would.
update idempotency_keys set settle_until = now() where idem_key = 'g-1';
create temporary table g2 as select * from lease_reserve_v2('shop-1', 'g-1',
    'payments.create', repeat('a', 64), '{}', 30, 10000);
select results_eq($$select outcome, lease_id, generation, reconcile from g2$$,
    $$values ('taken_over'::text, 2::bigint, 1, true)$$,
    'the retry takes it over, told to reconcile generation 1 first');
select ok((select taken_at between extract(epoch from now()) - 60 and
    extract(epoch from now()) + 1 and reconcile_until >= taken_at from g2),
    'with when the key was taken and when the indeterminate answer came');
select is((select lease_generation('shop-1', 'g-1', 1, 1, 30, 10000)), null::int,
    'the fenced attempt cannot move the generation');

-- The cursor of an unfinished reconciliation (041_reconcile_cursor.sql):
-- kept under the lease for the key's generation, read by the next attempt.
select is((select count(*)::int from lease_reconcile_cursor('shop-1', 'g-1', 2, 1)),
    0, 'no cursor kept: a reconciliation starts at the first page');
select is(lease_reconcile_save('shop-1', 'g-1', 1, 1, 'ch_1', 1700000000), false,
    'a fenced attempt keeps no cursor');
select is(lease_reconcile_save('shop-1', 'g-1', 2, 2, 'ch_1', 1700000000), false,
    'nor one of a generation the key is not at');
select is(lease_reconcile_save('shop-1', 'g-1', 2, 1, 'ch_1', 1700000000), true,
    'the holder keeps where it stopped');
select results_eq($$select after, window_end from lease_reconcile_cursor('shop-1',
    'g-1', 2, 1)$$, $$values ('ch_1'::text, 1700000000::double precision)$$,
    'the next attempt reads it back, with the end of its window');
select is((select count(*)::int from lease_reconcile_cursor('shop-1', 'g-1', 1, 1)),
    0, 'a fenced attempt reads none');
select is(lease_reconcile_save('shop-1', 'g-1', 2, 1, null, 0), true,
    'a reconciliation that found none clears it');
select ok((select reconcile_cursor is null and reconcile_cursor_generation is null
    and reconcile_window_end is null from idempotency_keys where idem_key = 'g-1'),
    'cursor, generation and window');
select is(lease_reconcile_save('shop-1', 'g-1', 2, 1, 'ch_2', 1700000000), true,
    'and keeps one again');
update idempotency_keys set locked_until = now() + interval '1 second'
 where idem_key = 'g-1';
select is((select lease_generation('shop-1', 'g-1', 2, 1, 30, 10000)), 2,
    'the holder moves it to generation 2');
select is((select count(*)::int from lease_reconcile_cursor('shop-1', 'g-1', 2, 2)),
    0, 'a cursor of generation 1 is never generation 2''s');
select ok((select locked_until > now() + interval '29 seconds' and
    call_deadline > now() + interval '9 seconds' from idempotency_keys
    where idem_key = 'g-1'), 'with a new lease and call deadline');
select is((select lease_generation('shop-1', 'g-1', 2, 1, 30, 10000)), null::int,
    'once: a generation is never skipped');
select is((select outcome from lease_reserve_v2('shop-1', 'g-1:2', 'payments.create',
    repeat('a', 64), '{}', 30, 10000)), 'collides',
    'a new key "g-1:2" would be g-1''s generation 2 at the provider: refused');
select is((select outcome from lease_reserve('shop-1', 'g-1:2', 'payments.create',
    repeat('a', 64), '{}', 30, 10000)), 'mismatch',
    'the previous release''s lease_reserve() refuses it as a mismatch (its 422)');
select results_eq($$select released, attempts, wait_seconds from lease_release('shop-1',
    'g-1', 2, false, 5, 60)$$, $$values (true, 1, 5)$$,
    'the recovery job''s release counts its attempt and backs off 5 s');
select results_eq($$select released from lease_release('shop-1', 'g-1', 1, false,
    null, null)$$, $$values (false)$$, 'a fenced release changes nothing');

-- The fake provider: one charge per key, and a 409 while the request that
-- made it still thinks (here 60 s).
create temporary table ch as select * from provider.charge('k-1', 100, 'RUB', 'acc',
    null, 60000);
select results_eq($$select status, created from ch$$, $$values (201, true)$$,
    'the provider charges a new key');
select results_eq($$select status, charge_id, retry_after between 59 and 60
    from provider.charge('k-1', 100, 'RUB', 'acc', null, 0)$$,
    $$values (409, (select charge_id from ch), true)$$,
    'the same key while its first request thinks: 409, retry when it is done');
update provider.charges set answered_at = now() - interval '1 second'
 where idempotency_key = 'k-1';
select results_eq($$select status, created, charge_id
    from provider.charge('k-1', 100, 'RUB', 'acc', null, 0)$$,
    $$select 201, false, charge_id from ch$$,
    'once it has answered, the same key gets the same charge again');
select is((select status from provider.charge('k-1', 999, 'RUB', 'acc', null, 0)), 422,
    'the same key with other parameters: 422');
select is((select count(*)::int from provider.charges where idempotency_key = 'k-1'), 1,
    'one charge row');
select is((provider.charges_of('k-1')::jsonb -> 'charges' -> 0 ->> 'charge_id'),
    (select charge_id from ch), 'charges_of lists it');
select results_eq($$select status, created, charge_id
    from provider.charge('k-2', 100, 'RUB', 'reject', 400, 0)$$,
    $$values (400, false, null::text)$$, 'a refusal is answered as asked');
select is((select count(*)::int from provider.charges where idempotency_key = 'k-2'), 0,
    'and keeps no charge');
select results_eq($$select status from provider.requests where idempotency_key = 'k-1'
    order by request_id$$, $$values (201), (409), (201), (422)$$,
    'every call of a key is logged with its answer');
select results_eq($$select status from provider.requests where idempotency_key = 'k-2'$$,
    $$values (400)$$, 'refusals too');

-- Refunds of k-1's charge of 100: the same per key, never past the charge.
create temporary table re as select * from provider.refund('r-1',
    (select charge_id from ch), 60, null, 60000);
select results_eq($$select status, created, charge_id, amount from re$$,
    $$select 201, true, charge_id, 60::bigint from ch$$,
    'a refund is made');
select ok((select refund_id like 're\_%' from re), 'its id is re_...');
select results_eq($$select status, refund_id, retry_after between 59 and 60
    from provider.refund('r-1', (select charge_id from ch), 60, null, 0)$$,
    $$select 409, refund_id, true from re$$,
    'the same key while its first request thinks: 409');
update provider.refunds set answered_at = now() - interval '1 second'
 where idempotency_key = 'r-1';
select results_eq($$select status, created, refund_id
    from provider.refund('r-1', (select charge_id from ch), 60, null, 0)$$,
    $$select 201, false, refund_id from re$$,
    'once it has answered, the same refund again');
select is((select status from provider.refund('r-1', (select charge_id from ch),
    50, null, 0)), 422, 'the same key with another amount: 422');
select results_eq($$select status, detail
    from provider.refund('r-2', (select charge_id from ch), 41, null, 0)$$,
    $$select 400, format('a refund of 41 is past the 40 left of charge %s',
    charge_id) from ch$$, 'past what is left of the charge: 400');
select results_eq($$select status, detail
    from provider.refund('r-3', 'ch_none', 1, null, 0)$$,
    $$values (400, 'no charge ch_none')$$, 'an unknown charge: 400');
select is((select status from provider.refund('r-4', (select charge_id from ch),
    1, 500, 0)), 500, 'a refusal is answered as asked');
select is((select count(*)::int from provider.refunds where idempotency_key
    in ('r-2', 'r-3', 'r-4')), 0, 'and none of them keeps a refund');
select results_eq($$select kind, idempotency_key, recipient, status
    from provider.requests where idempotency_key like 'r-%' order by request_id$$,
    $$values ('refund', 'r-1', 'acc', 201), ('refund', 'r-1', 'acc', 409),
    ('refund', 'r-1', 'acc', 201), ('refund', 'r-1', 'acc', 422),
    ('refund', 'r-2', 'acc', 400), ('refund', 'r-3', null, 400),
    ('refund', 'r-4', 'acc', 500)$$,
    'every refund call is logged as one, with its charge''s recipient');
select is((select count(*)::int from provider.requests where kind = 'charge'
    and idempotency_key in ('k-1', 'k-2')), 5,
    'the five charge calls are logged as charges');
select is((provider.refunds_of('r-1')::jsonb -> 'refunds' -> 0 ->> 'refund_id'),
    (select refund_id from re), 'refunds_of lists the refund');

select * from finish();
rollback;
