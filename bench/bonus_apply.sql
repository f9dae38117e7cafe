-- pgbench: POST /v1/bonuses with a fresh key, as the API calls it: tx_execute()
-- of bonuses.apply (an accrual: a ledger row and the balance).
\set customer random(0, 999)
select outcome, status_code, response from tx_execute('shop-1',
    gen_random_uuid()::text, 'bonuses.apply', repeat('b', 64),
    ('{"customer_id":"c-' || :customer ||
    '","points":10,"reason":"bench"}')::jsonb);
