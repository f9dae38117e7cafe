-- The SQL functions of the transactional strategy: what they write and what
-- they return on a replay, a mismatch and an insufficient balance.
begin;
select plan(31);

create temporary table r1 as select * from order_create('shop-1', 'o-1',
    repeat('a', 64), 'c-1', 150000, 'RUB', 'first',
    'http://x/problems/balance-limit-exceeded', 'Limit');

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

select results_eq($$select outcome, status_code, response from order_create('shop-1',
    'o-1', repeat('a', 64), 'c-1', 150000, 'RUB', 'first',
    'http://x/problems/balance-limit-exceeded', 'Limit')$$,
    $$select 'replayed'::text, 201, response from r1$$,
    'the same key and fingerprint replays the saved response');
select is((select count(*)::int from orders where idem_key = 'o-1'), 1,
    'the replay wrote no order');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-1'), 1500::bigint, 'nor points');

select is((select outcome from order_create('shop-1', 'o-1', repeat('b', 64), 'c-1',
    150001, 'RUB', 'first',
    'http://x/problems/balance-limit-exceeded', 'Limit')), 'mismatch', 'another fingerprint is a mismatch');
select is((select count(*)::int from orders where idem_key = 'o-1'), 1,
    'the mismatch wrote nothing');
select is((select outcome from order_create('shop-2', 'o-1', repeat('a', 64), 'c-1',
    150000, 'RUB', 'first',
    'http://x/problems/balance-limit-exceeded', 'Limit')), 'created', 'the same key of another client creates');
select is((select balance from bonus_accounts where client_id = 'shop-2'
    and customer_id = 'c-1'), 1500::bigint, 'in that client''s own ledger');

select is((select outcome from order_create('shop-1', 'o-small', repeat('a', 64),
    'c-1', 99, 'RUB', null, 'http://x/problems/balance-limit-exceeded', 'Limit')), 'created', 'an order of 99 minor units');
select is((select count(*)::int from bonus_ledger where idem_key = 'o-small'), 0,
    'accrues nothing and writes no ledger row');

create temporary table b1 as select * from bonus_apply('shop-1', 'b-1',
    repeat('c', 64), 'c-1', -500, 'redeem', 'http://x/problems/insufficient-balance',
    'Insufficient bonus balance', 'http://x/problems/balance-limit-exceeded', 'Limit');
select is((select status_code from b1), 201, 'a redemption within the balance');
select is((select response::jsonb - 'entry_id' from b1),
    '{"customer_id":"c-1","points":-500,"balance":1000}'::jsonb,
    'answers the new balance');

create temporary table b2 as select * from bonus_apply('shop-1', 'b-2',
    repeat('d', 64), 'c-1', -5000, 'redeem', 'http://x/problems/insufficient-balance',
    'Insufficient bonus balance', 'http://x/problems/balance-limit-exceeded', 'Limit');
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
select results_eq($$select outcome, status_code, response from bonus_apply('shop-1',
    'b-2', repeat('d', 64), 'c-1', -5000, 'redeem', 'http://x/other', 'Other',
    'http://x/problems/balance-limit-exceeded', 'Limit')$$,
    $$select 'replayed'::text, 422, response from b2$$,
    'the saved 422 is replayed byte for byte');
select is((select count(*)::int from bonus_post('shop-1', 'nobody', -1, 'x', null, 'k')),
    0, 'redeeming from an unknown customer posts nothing');

select is((select outcome from bonus_apply('shop-1', 'o-1', repeat('a', 64), 'c-1',
    10, 'gift', 'http://x', 'x', 'http://x/problems/balance-limit-exceeded', 'Limit')), 'mismatch',
    'a key used for an order is a mismatch for a bonus, even with its fingerprint');

select is(order_list('shop-1', 'c-1')::jsonb -> 'orders' -> 0 ->> 'comment', 'first',
    'order_list shows the client''s orders');
select is(order_list('shop-2', 'nobody'), '{"orders":[]}', 'and an empty list');
select is(bonus_balance('shop-1', 'nobody'), '{"customer_id":"nobody","balance":0}',
    'bonus_balance of an unknown customer is 0');

select * from finish();
rollback;
