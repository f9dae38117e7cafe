-- pgbench: payment_reserve() on a finished key, what a payment replay runs.
select outcome, status_code, response from payment_reserve('shop-1',
    'bench-payment', 'payments.create', repeat('a', 64), '{}', 30, 10000);
