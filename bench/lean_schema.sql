-- The lean schema: the rows of a fresh order with nothing but what
-- holds them, in schema "lean" (make bench creates it beside the
-- service's). Each table has its primary key and no other index, no
-- CHECK, no foreign key, no column the order does not fill; the
-- idempotency key is still a (client, key) pair of texts, because that
-- is what a client sends. bench.py's lean_floor() writes a fresh order into
-- it in one statement; the service's schema floor
-- (bench/order_floor.sql) is measured against it.
create schema if not exists lean;

create table if not exists lean.idempotency_keys (
	client_id	text not null,
	idem_key	text not null,
	operation	text not null,
	fingerprint	text not null,
	status		text not null,
	status_code	int,
	response	text,
	created_at	timestamptz not null default now(),
	finished_at	timestamptz,
	primary key (client_id, idem_key)
);

create table if not exists lean.orders (
	order_id	bigint generated always as identity primary key,
	client_id	text not null,
	customer_id	text not null,
	amount		bigint not null,
	currency	text not null,
	comment		text,
	bonus_points	bigint not null,
	idem_key	text not null,
	created_at	timestamptz not null default now()
);

create table if not exists lean.bonus_accounts (
	client_id	text not null,
	customer_id	text not null,
	balance		bigint not null default 0,
	updated_at	timestamptz not null default now(),
	primary key (client_id, customer_id)
);

create table if not exists lean.bonus_ledger (
	entry_id	bigint generated always as identity primary key,
	client_id	text not null,
	customer_id	text not null,
	points		bigint not null,
	reason		text not null,
	order_id	bigint,
	idem_key	text not null,
	created_at	timestamptz not null default now()
);

-- The lean tables hold as many rows as the service's before each run of
-- the lean floor, so that both floors meet indexes of the same depth:
-- the service's rows are copied (new ids where a table makes its own).
create or replace function lean.catch_up()
returns void
language plpgsql as $$
declare
	v_missing	bigint;
begin
	insert into lean.idempotency_keys (client_id, idem_key, operation,
	    fingerprint, status, status_code, response, created_at,
	    finished_at)
	select k.client_id, k.idem_key, k.operation, k.fingerprint, k.status,
	       k.status_code, k.response, k.created_at, k.finished_at
	  from public.idempotency_keys k
	on conflict do nothing;

	insert into lean.bonus_accounts (client_id, customer_id, balance)
	select a.client_id, a.customer_id, a.balance
	  from public.bonus_accounts a
	on conflict do nothing;

	v_missing := (select count(*) from public.orders) -
	    (select count(*) from lean.orders);
	insert into lean.orders (client_id, customer_id, amount, currency,
	    comment, bonus_points, idem_key)
	select o.client_id, o.customer_id, o.amount, o.currency, o.comment,
	       o.bonus_points, o.idem_key
	  from public.orders o
	 limit greatest(v_missing, 0);

	v_missing := (select count(*) from public.bonus_ledger) -
	    (select count(*) from lean.bonus_ledger);
	insert into lean.bonus_ledger (client_id, customer_id, points, reason,
	    order_id, idem_key)
	select l.client_id, l.customer_id, l.points, l.reason, l.order_id,
	       l.idem_key
	  from public.bonus_ledger l
	 limit greatest(v_missing, 0);
end;
$$;
