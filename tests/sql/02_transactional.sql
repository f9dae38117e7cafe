-- The SQL functions of the transactional strategy: what they write and what
-- they return on a replay, a mismatch and an insufficient balance. Every
-- operation runs through tx_run(), as the service calls it.
begin;
select plan(54);

-- The base of problem type URLs, as the service sets it on its connections.
set local idem.public_url = 'http://x';

create temporary table r1 as select * from tx_run('shop-1', 'o-1',
    'orders.create', repeat('a', 64), jsonb_build_object('customer_id', 'c-1',
    'amount', 150000, 'currency', 'RUB', 'comment', 'first'));

select is((select outcome from r1), 'created', 'a new key creates');
select is((select status_code from r1), 201, 'with status 201');
select is((select response from r1),
    format('{"order_id":%s,"customer_id":"c-1","amount":150000,"currency":"RUB","bonus_points":1500}',
    (select order_id from orders where idem_key = 'o-1')),
    'and the response body, built in the same transaction');
select is((select count(*)::int from orders where idem_key = 'o-1'), 1, 'one order row');
select is((select bonus_points from orders where idem_key = 'o-1'), 1500::bigint,
    'floor(150000 / 100) points');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-1'), 1500::bigint, 'the balance holds the accrual');
select is((select count(*)::int from bonus_ledger where idem_key = 'o-1'), 1,
    'one ledger row for the accrual');
select is((select status from idempotency_keys where idem_key = 'o-1'), 'done',
    'the key is saved done with the order');
select is((select response from idempotency_keys where idem_key = 'o-1'),
    (select response from r1), 'the saved response is the one returned');

select results_eq($$select outcome, status_code, response from tx_run('shop-1',
    'o-1', 'orders.create', repeat('a', 64), jsonb_build_object('customer_id',
    'c-1', 'amount', 150000, 'currency', 'RUB', 'comment', 'first'))$$,
    $$select 'replayed'::text, 201, response from r1$$,
    'the same key and fingerprint replays the saved response');
select is((select count(*)::int from orders where idem_key = 'o-1'), 1,
    'the replay wrote no order');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-1'), 1500::bigint, 'nor points');

select is((select outcome from tx_run('shop-1', 'o-1', 'orders.create',
    repeat('b', 64), jsonb_build_object('customer_id', 'c-1', 'amount', 150001,
    'currency', 'RUB', 'comment', 'first'))), 'mismatch',
    'another fingerprint is a mismatch');
select is((select count(*)::int from orders where idem_key = 'o-1'), 1,
    'the mismatch wrote nothing');
select is((select outcome from tx_run('shop-2', 'o-1', 'orders.create',
    repeat('a', 64), jsonb_build_object('customer_id', 'c-1', 'amount', 150000,
    'currency', 'RUB', 'comment', 'first'))), 'created',
    'the same key of another client creates');
select is((select balance from bonus_accounts where client_id = 'shop-2'
    and customer_id = 'c-1'), 1500::bigint, 'in that client''s own ledger');

select is((select outcome from tx_run('shop-1', 'o-small', 'orders.create',
    repeat('a', 64), jsonb_build_object('customer_id', 'c-1', 'amount', 99,
    'currency', 'RUB'))), 'created', 'an order of 99 minor units');
select is((select count(*)::int from bonus_ledger where idem_key = 'o-small'), 0,
    'accrues nothing and writes no ledger row');
select is((select comment from orders where idem_key = 'o-small'), null,
    'an absent comment is saved as none');

create temporary table b1 as select * from tx_run('shop-1', 'b-1',
    'bonuses.apply', repeat('c', 64), jsonb_build_object('customer_id', 'c-1',
    'points', -500, 'reason', 'redeem'));
select is((select status_code from b1), 201, 'a redemption within the balance');
select is((select response::jsonb - 'entry_id' from b1),
    '{"customer_id":"c-1","points":-500,"balance":1000}'::jsonb,
    'answers the new balance');
select is((select reason from bonus_ledger where idem_key = 'b-1'), 'redeem',
    'with the reason in its ledger row');

create temporary table b2 as select * from tx_run('shop-1', 'b-2',
    'bonuses.apply', repeat('d', 64), jsonb_build_object('customer_id', 'c-1',
    'points', -5000, 'reason', 'redeem'));
select is((select outcome from b2), 'created', 'an insufficient balance is an outcome');
select is((select status_code from b2), 422, 'saved as 422');
select is((select response::jsonb from b2),
    '{"type":"http://x/problems/insufficient-balance","title":"Insufficient bonus balance",'
    '"status":422,"detail":"customer c-1 has 1000 points and cannot redeem 5000",'
    '"balance":1000}'::jsonb, 'as an insufficient-balance problem');
select is((select count(*)::int from bonus_ledger where idem_key = 'b-2'), 0,
    'with no ledger row');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-1'), 1000::bigint, 'and the balance unchanged');
-- Another base URL now: a replay is the saved bytes, not a new problem.
set local idem.public_url = 'http://other';
select results_eq($$select outcome, status_code, response from tx_run('shop-1',
    'b-2', 'bonuses.apply', repeat('d', 64), jsonb_build_object('customer_id',
    'c-1', 'points', -5000, 'reason', 'redeem'))$$,
    $$select 'replayed'::text, 422, response from b2$$,
    'the saved 422 is replayed byte for byte');
set local idem.public_url = 'http://x';
select is((select count(*)::int from bonus_post('shop-1', 'nobody', -1, 'x', null, 'k')),
    0, 'redeeming from an unknown customer posts nothing');

select is((select outcome from tx_run('shop-1', 'o-1', 'bonuses.apply',
    repeat('a', 64), jsonb_build_object('customer_id', 'c-1', 'points', 10,
    'reason', 'gift'))), 'mismatch',
    'a key used for an order is a mismatch for a bonus, even with its fingerprint');

-- tx_run() runs only registered transactional operations.
select throws_ok($$select * from tx_run('shop-1', 'u-1', 'orders.nope',
    repeat('a', 64), '{}'::jsonb)$$, 'P0001',
    'no transactional operation orders.nope',
    'tx_run refuses an unknown operation');
select throws_ok($$select * from tx_run('shop-1', 'u-2', 'payments.create',
    repeat('a', 64), '{"amount":1,"currency":"RUB","recipient":"a"}'::jsonb)$$,
    'P0001', 'no transactional operation payments.create',
    'and an operation of the lease strategy');
select is((select count(*)::int from idempotency_keys where idem_key in ('u-1', 'u-2')),
    0, 'neither refusal leaves a key behind');

select is(order_list('shop-1', 'c-1')::jsonb -> 'orders' -> 0 ->> 'comment', 'first',
    'order_list shows the client''s orders');
select is(order_list('shop-2', 'nobody'), '{"orders":[]}', 'and an empty list');
select is(bonus_balance('shop-1', 'nobody'), '{"customer_id":"nobody","balance":0}',
    'bonus_balance of an unknown customer is 0');

-- tx_execute(), what the service calls: tx_run()'s columns, the key's age
-- and whether commits wait for a synchronous standby (the workers' replay
-- caches use both).
create temporary table x1 as select * from tx_execute('shop-1', 'x-1',
    'orders.create', repeat('c', 64), jsonb_build_object('customer_id', 'c-9',
    'amount', 1000, 'currency', 'RUB'));
select is((select outcome || ' ' || status_code from x1), 'created 201',
    'tx_execute creates');
select ok((select age_ms >= 0 and standby = false from x1),
    'with an age of at least 0 ms and no standby on this server');
update idempotency_keys set created_at = created_at - interval '90 seconds'
 where idem_key = 'x-1';
select ok((select age_ms between 90000 and 100000 from tx_execute('shop-1',
    'x-1', 'orders.create', repeat('c', 64), '{}'::jsonb)),
    'a replay says how old the key is, from its first request');
select is((select outcome from tx_execute('shop-1', 'x-1', 'orders.create',
    repeat('d', 64), '{}'::jsonb)), 'mismatch', 'and another request is a mismatch');
select is((select entry.reason || ' ' || (entry.order_id = o.order_id)
             from bonus_ledger entry join orders o on o.idem_key = entry.idem_key
            where entry.idem_key = 'x-1'),
    'order ' || (select order_id from orders where idem_key = 'x-1') || ' true',
    'the order''s accrual names it in the ledger');

-- The dispatcher follows the registry.
create function test_tx_echo(p_client text, p_key text, p_request jsonb)
returns table (status_code int, response text)
language sql as $$ select 201, p_request::text $$;
select lives_ok($$select idem_operation('test.echo', 'transactional',
    'test_tx_echo')$$, 'a new transactional operation registers');
select is((select response from tx_execute('shop-1', 'e-1', 'test.echo',
    repeat('e', 64), '{"a":1}'::jsonb)), '{"a": 1}', 'and runs through tx_execute');
select throws_ok($$select idem_operation('test.$body$x', 'transactional',
    'test_tx_echo')$$, 'P0001', null,
    'an operation name that is not plain words is refused');
select lives_ok($$select idem_operation('test.echo', 'lease', 'test_tx_echo')$$,
    'moved to the lease strategy');
select throws_ok($$select * from tx_execute('shop-1', 'e-2', 'test.echo',
    repeat('e', 64), '{}'::jsonb)$$, 'P0001', 'no transactional operation test.echo',
    'it is no longer run as a transactional one');

-- tx_execute() is one function, written from the registry, that calls the
-- operation's function itself; an operation written with OUT parameters
-- runs the same as one that returns a table.
select is((select count(*)::int
             from pg_proc p
            where p.oid = 'tx_execute(text, text, text, text, jsonb)'::regprocedure
              and (p.prosrc ~ 'idem_tx_dispatch|tx_replay'
                   or p.prosrc !~ 'from order_create\(p_client, p_key, p_request\)')),
    0, 'tx_execute calls the operation itself, with nothing in between');
create function test_tx_out(p_client text, p_key text, p_request jsonb,
    out status_code int, out response text)
language plpgsql as $$
begin
	status_code := 201;
	response := p_request::text;
end;
$$;
select lives_ok($$select idem_operation('test.out', 'transactional',
    'test_tx_out')$$, 'an operation with OUT parameters registers');
select is((select outcome || ' ' || status_code || ' ' || response
             from tx_execute('shop-1', 'out-1', 'test.out', repeat('e', 64),
               '{"b":2}'::jsonb)), 'created 201 {"b": 2}',
    'and runs through tx_execute');
select is((select outcome || ' ' || response from tx_execute('shop-1', 'out-1',
    'test.out', repeat('e', 64), '{"b":3}'::jsonb)), 'replayed {"b": 2}',
    'and replays its saved answer');
select is((select count(*)::int from tx_execute('shop-1', 'out-1', 'test.out',
    repeat('f', 64), '{}'::jsonb)), 1, 'one row for a mismatch too');
select throws_ok($$select * from tx_execute('shop-1', 'n-1', null,
    repeat('e', 64), '{}'::jsonb)$$, 'P0001', 'no transactional operation <NULL>',
    'a null operation is refused');

-- The ledger names an order without a foreign key (010_orders_bonuses.sql):
-- every order's ledger row names an order that exists.
select is((select count(*)::int from bonus_ledger l
            where l.order_id is not null
              and not exists (select from orders o where o.order_id = l.order_id)),
    0, 'no ledger row names a missing order');
select is((select count(*)::int from pg_constraint
            where conname = 'bonus_ledger_order_id_fkey'), 0,
    'and the ledger has no foreign key to orders');

select * from finish();
rollback;
