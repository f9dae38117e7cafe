-- pgbench: bench/order_floor.sql's statement on the lean schema
-- (bench/lean_schema.sql): the same rows, the same one statement, with
-- nothing of the service's schema but the primary keys.
\set customer random(0, 999)
with p as (
	select gen_random_uuid()::text as idem_key, 'c-' || :customer as customer
), o as (
	insert into lean.orders (client_id, customer_id, amount, currency, comment,
	    bonus_points, idem_key)
	select 'shop-1', p.customer, 150000, 'RUB', null, 1500, p.idem_key from p
	returning order_id, customer_id, idem_key
), k as (
	insert into lean.idempotency_keys (client_id, idem_key, operation,
	    fingerprint, status, status_code, response, finished_at)
	select 'shop-1', o.idem_key, 'orders.create',
	    'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
	    'done', 201, format('{"order_id":%s,"customer_id":%s,"amount":%s,'
	    '"currency":%s,"bonus_points":%s}', o.order_id,
	    to_json(o.customer_id), 150000, to_json('RUB'::text), 1500), now()
	  from o
	returning status_code, response
), b as (
	insert into lean.bonus_accounts as a (client_id, customer_id, balance)
	select 'shop-1', p.customer, 1500 from p
	on conflict (client_id, customer_id) do update
	   set balance = a.balance + excluded.balance, updated_at = now()
	 where a.balance <= 9007199254740991 - excluded.balance
	returning a.balance
), l as (
	insert into lean.bonus_ledger (client_id, customer_id, points, reason,
	    order_id, idem_key)
	select 'shop-1', o.customer_id, 1500, 'order ' || o.order_id,
	    o.order_id, o.idem_key from o
	returning entry_id
)
select k.status_code, k.response, b.balance, l.entry_id from k, b, l;
