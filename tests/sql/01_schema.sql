-- The schema enforces what must hold, whatever the application sends.
begin;
select plan(22);

select has_table('clients');
select has_table('idempotency_keys');
select has_table('orders');
select has_table('bonus_accounts');
select has_table('bonus_ledger');
select col_is_pk('idempotency_keys', array['client_id', 'idem_key'],
    'a key is unique per client, not globally');
select col_is_pk('bonus_accounts', array['client_id', 'customer_id'],
    'a customer''s balance is per client');
select has_index('idempotency_keys', 'idempotency_keys_created',
    'cleanup finds finished keys by an index');

select throws_ok($$insert into clients values ('shop-x', 'not-a-hash')$$,
    '23514', null, 'a token is stored only as a SHA-256 hex digest');
select throws_ok($$insert into idempotency_keys (client_id, idem_key, operation,
    fingerprint, status) values ('shop-1', 'has space', 'x', repeat('a', 64),
    'in_progress')$$, '23514', null, 'a key with a space is refused');
select throws_ok($$insert into idempotency_keys (client_id, idem_key, operation,
    fingerprint, status) values ('shop-1', repeat('k', 256), 'x', repeat('a', 64),
    'in_progress')$$, '23514', null, 'a 256-character key is refused');
select throws_ok($$insert into idempotency_keys (client_id, idem_key, operation,
    fingerprint, status) values ('shop-1', 'k', 'x', 'abc', 'in_progress')$$,
    '23514', null, 'a fingerprint must be a SHA-256 hex digest');
select throws_ok($$insert into idempotency_keys (client_id, idem_key, operation,
    fingerprint, status) values ('shop-1', 'k', 'x', repeat('a', 64), 'done')$$,
    '23514', null, 'a done key must hold its status code and response');
select throws_ok($$insert into idempotency_keys (client_id, idem_key, operation,
    fingerprint, status) values ('shop-1', 'k', 'x', repeat('a', 64), 'lost')$$,
    '23514', null, 'status is in_progress or done');

select throws_ok($$insert into orders (client_id, customer_id, amount, currency,
    bonus_points, idem_key) values ('shop-1', 'c', 0, 'RUB', 0, 'k')$$,
    '23514', null, 'an order amount is positive');
select throws_ok($$insert into orders (client_id, customer_id, amount, currency,
    bonus_points, idem_key) values ('shop-1', 'c', 9007199254740992, 'RUB', 0, 'k')$$,
    '23514', null, 'an order amount is at most 2^53-1');
select throws_ok($$insert into orders (client_id, customer_id, amount, currency,
    bonus_points, idem_key) values ('shop-1', 'c', 1, 'rub', 0, 'k')$$,
    '23514', null, 'a currency is three upper-case letters');
select throws_ok($$insert into bonus_accounts values ('shop-1', 'c', -1)$$,
    '23514', null, 'a balance is never negative');
select throws_ok($$insert into bonus_ledger (client_id, customer_id, points,
    reason, idem_key) values ('shop-1', 'c', 0, 'x', 'k')$$,
    '23514', null, 'a ledger row moves a non-zero number of points');

select is((select count(*)::int from clients where client_id in ('shop-1', 'shop-2')),
    2, 'the test data set has the dev clients');
select is((select token_sha256 from clients where client_id = 'shop-1'),
    encode(sha256('dev-shop-1'), 'hex'), 'shop-1''s token is stored as its SHA-256');
select hasnt_column('clients', 'token', 'no column holds a token in clear');

select * from finish();
rollback;
