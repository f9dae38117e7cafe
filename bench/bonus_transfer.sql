-- pgbench: POST /v1/bonuses/transfers with a fresh key, as the API calls it:
-- tx_execute() of bonuses.transfer between two funded customers (a transfer
-- row, two ledger rows, two balances).
\set a random(0, 999)
\set b random(1000, 1999)
select outcome, status_code, response from tx_execute('shop-1',
    gen_random_uuid()::text, 'bonuses.transfer', repeat('c', 64),
    ('{"from_customer_id":"c-' || :a || '","to_customer_id":"c-' || :b ||
    '","points":1,"reason":"bench"}')::jsonb);
