-- pgbench: lease_reserve_v2() on a finished key, what a payment replay runs.
select outcome, lease_id, status_code, response, retry_after, request
  from lease_reserve_v2('shop-1', 'bench-payment', 'payments.create',
    repeat('a', 64), '{}', 30, 10000);
