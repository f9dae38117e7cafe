-- No balance passes 2^53-1, the largest integer every JSON parser reads
-- exactly: an accrual past it, by POST /v1/bonuses or by an order's
-- points, is a saved 422 that writes nothing else.
begin;
select plan(22);

create temporary table b1 as select * from bonus_apply('shop-1', 'lim-1',
    repeat('a', 64), 'c-max', 9007199254740991, 'gift',
    'http://x/problems/insufficient-balance', 'Insufficient',
    'http://x/problems/balance-limit-exceeded', 'Limit');
select is((select status_code from b1), 201, 'an accrual of 2^53-1 is accepted');
select is((select response::jsonb ->> 'balance' from b1), '9007199254740991',
    'and the balance is 2^53-1');

create temporary table b2 as select * from bonus_apply('shop-1', 'lim-2',
    repeat('b', 64), 'c-max', 1, 'gift',
    'http://x/problems/insufficient-balance', 'Insufficient',
    'http://x/problems/balance-limit-exceeded', 'Limit');
select is((select outcome from b2), 'created', 'one point more is an outcome');
select is((select status_code from b2), 422, 'saved as 422');
select is((select response::jsonb from b2),
    '{"type":"http://x/problems/balance-limit-exceeded","title":"Limit",'
    '"status":422,"detail":"customer c-max has 9007199254740991 points and '
    'cannot accrue 1 more: a balance is at most 9007199254740991",'
    '"balance":9007199254740991}'::jsonb, 'as a balance-limit-exceeded problem');
select is((select count(*)::int from bonus_ledger where idem_key = 'lim-2'), 0,
    'with no ledger row');
select is((select status from idempotency_keys where idem_key = 'lim-2'), 'done',
    'and the key saved');
select results_eq($$select outcome, status_code, response from bonus_apply('shop-1',
    'lim-2', repeat('b', 64), 'c-max', 1, 'gift', 'http://x/a', 'A', 'http://x/b',
    'B')$$, $$select 'replayed'::text, 422, response from b2$$,
    'the saved 422 is replayed byte for byte');

select is((select status_code from bonus_apply('shop-1', 'lim-3', repeat('c', 64),
    'c-max', -1, 'redeem', 'http://x/i', 'I', 'http://x/l', 'L')), 201,
    'a redemption still works at the limit');
select is((select status_code from bonus_apply('shop-1', 'lim-4', repeat('d', 64),
    'c-max', 1, 'gift', 'http://x/i', 'I', 'http://x/l', 'L')), 201,
    'and then one point fits again');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-max'), 9007199254740991::bigint, 'up to 2^53-1 exactly');

-- Past 2^63 the old sum overflowed bigint: every later request was a 500.
select is((select status_code from bonus_apply('shop-1', 'lim-5', repeat('e', 64),
    'c-max', 9007199254740991, 'gift', 'http://x/i', 'I', 'http://x/l', 'L')), 422,
    'an accrual of 2^53-1 on top of 2^53-1 is a 422, not an error');

-- An order whose points would pass the limit is refused whole.
create temporary table o1 as select * from order_create('shop-1', 'lim-order',
    repeat('f', 64), 'c-max', 100, 'RUB', null,
    'http://x/problems/balance-limit-exceeded', 'Limit');
select is((select status_code from o1), 422, 'an order accruing 1 point past it: 422');
select is((select response::jsonb ->> 'type' from o1),
    'http://x/problems/balance-limit-exceeded', 'a balance-limit-exceeded problem');
select is((select count(*)::int from orders where idem_key = 'lim-order'), 0,
    'and no order row');
select is((select count(*)::int from bonus_ledger where idem_key = 'lim-order'), 0,
    'nor a ledger row');
select results_eq($$select outcome, status_code, response from order_create('shop-1',
    'lim-order', repeat('f', 64), 'c-max', 100, 'RUB', null, 'http://x/b', 'B')$$,
    $$select 'replayed'::text, 422, response from o1$$,
    'the refused order is saved and replayed');
select is((select status_code from order_create('shop-1', 'lim-order-small',
    repeat('f', 64), 'c-max', 99, 'RUB', null, 'http://x/b', 'B')), 201,
    'an order accruing 0 points is still created');

select throws_ok($$update bonus_accounts set balance = 9007199254740992
    where client_id = 'shop-1' and customer_id = 'c-max'$$, '23514', null,
    'the table itself refuses a balance past 2^53-1');
select throws_ok($$insert into bonus_ledger (client_id, customer_id, points, reason,
    idem_key) values ('shop-1', 'c-max', 9007199254740992, 'x', 'k')$$, '23514', null,
    'and a ledger row past it');
select is((select count(*)::int from bonus_post('shop-1', 'c-max', 1, 'x', null, 'k')),
    0, 'bonus_post returns no row for an accrual past the limit');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-max'), 9007199254740991::bigint, 'the balance is unchanged');

select * from finish();
rollback;
