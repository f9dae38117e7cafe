-- The lean schema: the rows of a fresh order with nothing but what
-- holds them, in schema "lean" (make bench creates it beside the
-- service's). Each table has its primary key and no other index, no
-- CHECK, no foreign key, no column the order does not fill; the
-- idempotency key is still a (client, key) pair of texts, because that
-- is what a client sends. bench/lean_floor.sql writes a fresh order into
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
