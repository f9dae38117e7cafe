-- pgbench: the SQL of one payment with a fresh key, as the API and the fake
-- provider run it: reserve, the provider's charge, complete.
\set customer random(0, 999)
select gen_random_uuid()::text as key \gset
select outcome, lease_id, status_code, response, retry_after, request
  from lease_reserve_v2('shop-1', :key, 'payments.create',
    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    '{"amount":10000,"currency":"RUB","recipient":"acc-bench"}', 30, 10000) \gset
select charge_id from provider.charge('shop-1:' || :key, 10000, 'RUB',
    'acc-bench', null, 0) \gset
select outcome, status_code, response, status from lease_complete('shop-1',
    :key, :lease_id, :charge_id, 201, null);
