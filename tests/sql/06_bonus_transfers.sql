-- bonuses.transfer, run through tx_run() as the service calls it: the
-- points move, two ledger rows and both balances; an insufficient balance
-- and a receiver past 2^53-1 are saved 422s that write nothing else; a
-- retry replays.
begin;
select plan(42);

set local idem.public_url = 'http://x';

select has_table('bonus_transfers');
select has_column('bonus_ledger', 'transfer_id',
    'a ledger row names the transfer it is a side of');

-- c-a starts with 1000 points; c-b has no account.
select is((select status_code from tx_run('shop-1', 't-seed', 'bonuses.apply',
    repeat('e', 64), jsonb_build_object('customer_id', 'c-a', 'points', 1000,
    'reason', 'seed'))), 201, 'c-a gets 1000 points');

create temporary table t1 as select * from tx_run('shop-1', 't-1',
    'bonuses.transfer', repeat('a', 64), jsonb_build_object('from_customer_id',
    'c-a', 'to_customer_id', 'c-b', 'points', 300, 'reason', 'gift'));

select is((select outcome from t1), 'created', 'a transfer creates');
select is((select status_code from t1), 201, 'with status 201');
select is((select response from t1),
    format('{"transfer_id":%s,"from_customer_id":"c-a","to_customer_id":"c-b",'
    '"points":300,"from_balance":700,"to_balance":300}',
    (select transfer_id from bonus_transfers where idem_key = 't-1')),
    'and the transfer with both new balances');
select results_eq($$select client_id, from_customer_id, to_customer_id, points,
    reason from bonus_transfers where idem_key = 't-1'$$,
    $$values ('shop-1'::text, 'c-a'::text, 'c-b'::text, 300::bigint, 'gift'::text)$$,
    'one bonus_transfers row');
select results_eq($$select customer_id, points, reason, order_id, transfer_id
    from bonus_ledger where idem_key = 't-1' order by points$$,
    $$select * from (values ('c-a'::text, -300::bigint, 'gift'::text, null::bigint),
    ('c-b', 300, 'gift', null)) v,
    (select transfer_id from bonus_transfers where idem_key = 't-1') t$$,
    'two ledger rows naming the transfer: -300 for the sender, +300 for the receiver');
select results_eq($$select customer_id, balance from bonus_accounts
    where client_id = 'shop-1' and customer_id in ('c-a', 'c-b') order by 1$$,
    $$values ('c-a'::text, 700::bigint), ('c-b', 300)$$,
    'both balances moved; the receiver''s account was opened');
select is((select response from idempotency_keys where idem_key = 't-1'),
    (select response from t1), 'the key is saved with the response');

select results_eq($$select outcome, status_code, response from tx_run('shop-1',
    't-1', 'bonuses.transfer', repeat('a', 64), jsonb_build_object(
    'from_customer_id', 'c-a', 'to_customer_id', 'c-b', 'points', 300,
    'reason', 'gift'))$$,
    $$select 'replayed'::text, 201, response from t1$$,
    'a retry replays the saved response');
select is((select outcome from tx_run('shop-1', 't-1', 'bonuses.transfer',
    repeat('b', 64), jsonb_build_object('from_customer_id', 'c-a',
    'to_customer_id', 'c-b', 'points', 301, 'reason', 'gift'))), 'mismatch',
    'another fingerprint is a mismatch');
select is((select count(*)::int from bonus_ledger where idem_key = 't-1'), 2,
    'neither wrote a ledger row');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-a'), 700::bigint, 'nor moved points');

-- Back the other way, where the receiver comes first in the lock order.
select is((select response::jsonb - 'transfer_id' from tx_run('shop-1', 't-2',
    'bonuses.transfer', repeat('a', 64), jsonb_build_object('from_customer_id',
    'c-b', 'to_customer_id', 'c-a', 'points', 100, 'reason', 'back'))),
    '{"from_customer_id":"c-b","to_customer_id":"c-a","points":100,'
    '"from_balance":200,"to_balance":800}'::jsonb,
    'a transfer the other way, receiver first in the lock order');
select is((select sum(points)::bigint from bonus_ledger
    where client_id = 'shop-1' and customer_id = 'c-b'), 200::bigint,
    'the receiver''s ledger sums to its balance');

-- Insufficient balance: a saved 422; the new receiver gets no account.
create temporary table t3 as select * from tx_run('shop-1', 't-3',
    'bonuses.transfer', repeat('c', 64), jsonb_build_object('from_customer_id',
    'c-a', 'to_customer_id', 'c-new', 'points', 801, 'reason', 'gift'));
select is((select outcome from t3), 'created', 'an insufficient balance is an outcome');
select is((select status_code from t3), 422, 'saved as 422');
select is((select response::jsonb from t3),
    '{"type":"http://x/problems/insufficient-balance","title":"Insufficient bonus balance",'
    '"status":422,"detail":"customer c-a has 800 points and cannot transfer 801",'
    '"balance":800}'::jsonb, 'as an insufficient-balance problem with the sender''s balance');
select is((select count(*)::int from bonus_ledger where idem_key = 't-3'), 0,
    'with no ledger row');
select is((select count(*)::int from bonus_transfers where idem_key = 't-3'), 0,
    'and no transfer');
select is((select count(*)::int from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-new'), 0,
    'the account made to lock the receiver is gone with the refusal');
select is((select balance from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'c-a'), 800::bigint, 'the sender''s balance is unchanged');
select is((select status from idempotency_keys where idem_key = 't-3'), 'done',
    'the key is saved done');
-- The balance grows, a retry still gets the saved refusal.
select is((select status_code from tx_run('shop-1', 't-seed-2', 'bonuses.apply',
    repeat('e', 64), jsonb_build_object('customer_id', 'c-a', 'points', 5000,
    'reason', 'seed'))), 201, 'c-a gets 5000 more points');
set local idem.public_url = 'http://other';
select results_eq($$select outcome, status_code, response from tx_run('shop-1',
    't-3', 'bonuses.transfer', repeat('c', 64), jsonb_build_object(
    'from_customer_id', 'c-a', 'to_customer_id', 'c-new', 'points', 801,
    'reason', 'gift'))$$,
    $$select 'replayed'::text, 422, response from t3$$,
    'the saved 422 is replayed byte for byte, though the balance would do now');
set local idem.public_url = 'http://x';
select is((select count(*)::int from bonus_ledger where customer_id = 'c-new'), 0,
    'the replay moved nothing');

select is((select response::jsonb ->> 'detail' from tx_run('shop-1', 't-4',
    'bonuses.transfer', repeat('d', 64), jsonb_build_object('from_customer_id',
    'nobody', 'to_customer_id', 'c-a', 'points', 1, 'reason', 'gift'))),
    'customer nobody has 0 points and cannot transfer 1',
    'a sender without an account has 0 points');
select is((select count(*)::int from bonus_accounts where client_id = 'shop-1'
    and customer_id = 'nobody'), 0, 'and still has no account');

-- Keys and accounts are per client.
select is((select status_code from tx_run('shop-2', 't-1', 'bonuses.transfer',
    repeat('a', 64), jsonb_build_object('from_customer_id', 'c-a',
    'to_customer_id', 'c-b', 'points', 300, 'reason', 'gift'))), 422,
    'shop-2''s c-a has none of shop-1''s points: the same key is its own transfer');

-- The receiver's balance stays within 2^53-1.
select is((select status_code from tx_run('shop-1', 't-seed-3', 'bonuses.apply',
    repeat('e', 64), jsonb_build_object('customer_id', 'c-full',
    'points', 9007199254740991 - 100, 'reason', 'seed'))), 201,
    'c-full holds 2^53-1 - 100');
create temporary table t5 as select * from tx_run('shop-1', 't-5',
    'bonuses.transfer', repeat('f', 64), jsonb_build_object('from_customer_id',
    'c-a', 'to_customer_id', 'c-full', 'points', 101, 'reason', 'gift'));
select is((select status_code from t5), 422, 'a transfer past 2^53-1: 422');
select is((select response::jsonb from t5),
    '{"type":"http://x/problems/balance-limit-exceeded",'
    '"title":"Bonus balance would pass 2^53-1","status":422,'
    '"detail":"customer c-full has 9007199254740891 points and cannot accrue 101 more: '
    'a balance is at most 9007199254740991","balance":9007199254740891}'::jsonb,
    'a balance-limit-exceeded problem with the receiver''s balance');
select results_eq($$select customer_id, balance from bonus_accounts
    where client_id = 'shop-1' and customer_id in ('c-a', 'c-full') order by 1$$,
    $$values ('c-a'::text, 5800::bigint), ('c-full', 9007199254740891)$$,
    'neither balance moved');
select is((select count(*)::int from bonus_ledger where idem_key = 't-5'), 0,
    'and no ledger row was written');
select results_eq($$select outcome, status_code, response from tx_run('shop-1',
    't-5', 'bonuses.transfer', repeat('f', 64), jsonb_build_object(
    'from_customer_id', 'c-a', 'to_customer_id', 'c-full', 'points', 101,
    'reason', 'gift'))$$, $$select 'replayed'::text, 422, response from t5$$,
    'the limit''s 422 is replayed');
select is((select response::jsonb ->> 'to_balance' from tx_run('shop-1', 't-6',
    'bonuses.transfer', repeat('f', 64), jsonb_build_object('from_customer_id',
    'c-a', 'to_customer_id', 'c-full', 'points', 100, 'reason', 'gift'))),
    '9007199254740991', 'a transfer up to 2^53-1 exactly is made');

-- The SQL's own guards behind the service's 400.
select throws_ok($$select * from tx_run('shop-1', 't-7', 'bonuses.transfer',
    repeat('a', 64), jsonb_build_object('from_customer_id', 'c-a',
    'to_customer_id', 'c-a', 'points', 1, 'reason', 'x'))$$, '23514', null,
    'a transfer to the same customer is refused');
select is((select count(*)::int from idempotency_keys where idem_key = 't-7'), 0,
    'and leaves no key behind');
select throws_ok($$insert into bonus_transfers (client_id, from_customer_id,
    to_customer_id, points, reason, idem_key) values ('shop-1', 'a', 'b', 0, 'x',
    'k')$$, '23514', null, 'a transfer moves at least one point');
select is((select status_code from tx_run('shop-1', 't-8', 'orders.create',
    repeat('a', 64), jsonb_build_object('customer_id', 'c-a', 'amount', 100,
    'currency', 'RUB'))), 201, 'an order');
select throws_ok($$insert into bonus_ledger (client_id, customer_id, points,
    reason, order_id, idem_key, transfer_id) values ('shop-1', 'c', 1, 'x',
    (select order_id from orders where idem_key = 't-8'), 'k',
    (select min(transfer_id) from bonus_transfers))$$, '23514', null,
    'a ledger row comes from an order or a transfer, not both');

select * from finish();
rollback;
