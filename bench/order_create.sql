-- pgbench: the SQL function POST /v1/orders calls, with a fresh key, as the
-- API calls it: tx_execute() of orders.create with the request's canonical JSON.
\set customer random(0, 999)
select outcome, status_code, response from tx_execute('shop-1',
    gen_random_uuid()::text, 'orders.create',
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    ('{"amount":150000,"currency":"RUB","customer_id":"c-' || :customer ||
    '"}')::jsonb);
