-- pgbench: the SQL function POST /v1/orders calls, with a fresh key.
\set customer random(0, 999)
select outcome, status_code, response from order_create('shop-1',
    gen_random_uuid()::text, 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    'c-' || :customer, 150000, 'RUB', null,
    'http://127.0.0.1:8888/problems/balance-limit-exceeded',
    'Bonus balance would pass 2^53-1');
