-- Orders and bonus points: operations inside this database, protected by
-- the transactional strategy (002_transactional.sql). Each operation is
-- its business writes and one line that registers it.

create table if not exists orders (
	order_id	bigint generated always as identity primary key,
	client_id	text not null,
	customer_id	text not null check (length(customer_id) between 1 and 128),
	amount		bigint not null
			check (amount > 0 and amount <= 9007199254740991),
	currency	text not null check (currency ~ '^[A-Z]{3}$'),
	comment		text,
	bonus_points	bigint not null check (bonus_points >= 0),
	idem_key	text not null,
	created_at	timestamptz not null default now()
);

comment on table orders is
    'Orders, each created by one POST /v1/orders with its Idempotency-Key.';

create index if not exists orders_customer
    on orders (client_id, customer_id, order_id);

create table if not exists bonus_accounts (
	client_id	text not null,
	customer_id	text not null,
	balance		bigint not null default 0 check (balance >= 0),
	updated_at	timestamptz not null default now(),
	primary key (client_id, customer_id)
);

comment on table bonus_accounts is
    'Bonus balance of a client''s customer; never negative, never past '
    '2^53-1.';

-- Every number the API returns stays exact in any JSON parser (a double
-- holds integers up to 2^53-1): bonus_post() refuses an accrual past it,
-- and the constraint is the backstop. Added apart, so that a database made
-- before it gets it too; NOT VALID, so that one holding a balance the old
-- code let past the limit still migrates (new rows are checked; the
-- operator fixes the old ones, then VALIDATE CONSTRAINT).
do $$
begin
	alter table bonus_accounts add constraint bonus_accounts_balance_max
	    check (balance <= 9007199254740991) not valid;
exception when duplicate_object then
	null;
end;
$$;

create table if not exists bonus_ledger (
	entry_id	bigint generated always as identity primary key,
	client_id	text not null,
	customer_id	text not null,
	points		bigint not null check (points <> 0),
	reason		text not null,
	order_id	bigint,
	idem_key	text not null,
	created_at	timestamptz not null default now()
);

-- An order's ledger row names its order without a foreign key: the row
-- is written only by order_create(), in the statement that inserts the
-- order, and orders are never deleted once committed, so the key would
-- guard nothing the code does not, and no route or job needs it. It cost
-- every fresh order a lookup and a row lock on the order just written (a
-- WAL record of its own). tests/sql/02_transactional.sql checks that no
-- ledger row names a missing order.
alter table bonus_ledger drop constraint if exists bonus_ledger_order_id_fkey;

comment on table bonus_ledger is
    'Every change of a bonus balance: accruals from orders, redemptions.';

do $$
begin
	alter table bonus_ledger add constraint bonus_ledger_points_max
	    check (points between -9007199254740991 and 9007199254740991)
	    not valid;
exception when duplicate_object then
	null;
end;
$$;

-- Adds points to a balance and writes the ledger row, or returns no row
-- when a redemption would take the balance below zero or an accrual past
-- 2^53-1 (the sign of p_points tells which). The limit is checked on the
-- row the upsert locked, so concurrent accruals cannot pass it together.
create or replace function bonus_post(p_client text, p_customer text,
    p_points bigint, p_reason text, p_order bigint, p_key text)
returns table (entry_id bigint, balance bigint)
language plpgsql as $$
declare
	v_balance	bigint;
begin
	if p_points > 0 then
		insert into bonus_accounts as a (client_id, customer_id, balance)
		values (p_client, p_customer, p_points)
		on conflict (client_id, customer_id) do update
		   set balance = a.balance + excluded.balance, updated_at = now()
		 where a.balance <= 9007199254740991 - excluded.balance
		returning a.balance into v_balance;
		if not found then
			return;
		end if;
	else
		update bonus_accounts a
		   set balance = a.balance + p_points, updated_at = now()
		 where a.client_id = p_client and a.customer_id = p_customer
		   and a.balance + p_points >= 0
		returning a.balance into v_balance;
		if not found then
			return;
		end if;
	end if;

	return query
	insert into bonus_ledger (client_id, customer_id, points, reason,
	    order_id, idem_key)
	values (p_client, p_customer, p_points, p_reason, p_order, p_key)
	returning bonus_ledger.entry_id, v_balance;
end;
$$;

comment on function bonus_post(text, text, bigint, text, bigint, text) is
    'Moves a bonus balance by p_points with its ledger row; no row back when '
    'the balance would go below zero or past 2^53-1.';

select idem_problem_type('insufficient-balance', 422,
    'Insufficient bonus balance');
select idem_problem_type('balance-limit-exceeded', 422,
    'Bonus balance would pass 2^53-1');

-- The saved 422 of an accrual that would take a balance past 2^53-1, for
-- POST /v1/bonuses and POST /v1/orders alike.
create or replace function bonus_limit_problem(p_client text,
    p_customer text, p_points bigint)
returns table (status_code int, response text)
language sql stable as $$
	select p.*
	  from (select coalesce(max(a.balance), 0) as balance
		  from bonus_accounts a
		 where a.client_id = p_client and a.customer_id = p_customer) b,
	       idem_problem('balance-limit-exceeded', format('customer %s has '
		   '%s points and cannot accrue %s more: a balance is at most '
		   '9007199254740991', p_customer, b.balance, p_points),
		   format(',"balance":%s', b.balance)) p;
$$;

comment on function bonus_limit_problem(text, text, bigint) is
    'The balance-limit-exceeded problem (422) of an accrual refused because '
    'the balance would pass 2^53-1, with the balance as it stands.';

drop function if exists bonus_limit_problem(text, text, bigint, text, text);
drop function if exists order_create(text, text, text, text, bigint, text,
    text);
drop function if exists order_create(text, text, text, text, bigint, text,
    text, text, text);
drop function if exists bonus_apply(text, text, text, text, bigint, text,
    text, text);
drop function if exists bonus_apply(text, text, text, text, bigint, text,
    text, text, text, text);

-- POST /v1/orders, run by tx_execute() in the transaction that writes the key:
-- the order, and floor(amount / 100) points to the customer. An accrual
-- that would take the balance past 2^53-1 refuses the whole order: a
-- saved 422 and no order row.
--
-- The order, the accrual and its ledger row are one statement (what
-- bonus_post() does, inlined): the path every fresh order takes is the
-- one PostgreSQL runs fastest (see docs/benchmark.md).
create or replace function order_create(p_client text, p_key text,
    p_request jsonb)
returns table (status_code int, response text)
language plpgsql as $$
declare
	v_customer	text := p_request->>'customer_id';
	v_amount	bigint := (p_request->>'amount')::bigint;
	v_currency	text := p_request->>'currency';
	v_order		bigint;
	v_credited	boolean;
	v_points	bigint := v_amount / 100;
begin
	-- The accrual's upsert updates no row past 2^53-1 (its where), and
	-- the ledger row is written only with the accrual it records.
	with o as (
		insert into orders (client_id, customer_id, amount, currency,
		    comment, bonus_points, idem_key)
		values (p_client, v_customer, v_amount, v_currency,
		    p_request->>'comment', v_points, p_key)
		returning order_id
	), a as (
		insert into bonus_accounts as a (client_id, customer_id,
		    balance)
		select p_client, v_customer, v_points
		 where v_points > 0
		on conflict (client_id, customer_id) do update
		   set balance = a.balance + excluded.balance,
		       updated_at = now()
		 where a.balance <= 9007199254740991 - excluded.balance
		returning a.balance
	), l as (
		insert into bonus_ledger (client_id, customer_id, points,
		    reason, order_id, idem_key)
		select p_client, v_customer, v_points, 'order ' || o.order_id,
		    o.order_id, p_key
		  from o, a
		returning entry_id
	)
	select o.order_id, exists (select from l)
	  into v_order, v_credited
	  from o;

	if v_points > 0 and not v_credited then
		-- Refused after the insert of the order; the row was never
		-- visible to anyone else.
		delete from orders where order_id = v_order;
		return query select * from bonus_limit_problem(p_client,
		    v_customer, v_points);
		return;
	end if;

	return query select 201, format('{"order_id":%s,"customer_id":%s,'
	    '"amount":%s,"currency":%s,"bonus_points":%s}', v_order,
	    to_json(v_customer), v_amount, to_json(v_currency), v_points);
end;
$$;

comment on function order_create(text, text, jsonb) is
    'orders.create (transactional): an order and its bonus accrual; a '
    'balance past 2^53-1 is a 422 and no order.';

select idem_operation('orders.create', 'transactional', 'order_create');

-- POST /v1/bonuses, run by tx_execute(). An insufficient balance, or an
-- accrual past 2^53-1, is the operation's outcome: a saved 422 and no
-- ledger row.
create or replace function bonus_apply(p_client text, p_key text,
    p_request jsonb)
returns table (status_code int, response text)
language plpgsql as $$
declare
	v_customer	text := p_request->>'customer_id';
	v_points	bigint := (p_request->>'points')::bigint;
	v_entry		bigint;
	v_balance	bigint;
begin
	select b.entry_id, b.balance into v_entry, v_balance
	  from bonus_post(p_client, v_customer, v_points,
	    p_request->>'reason', null, p_key) b;

	if v_entry is null and v_points > 0 then
		return query select * from bonus_limit_problem(p_client,
		    v_customer, v_points);
	elsif v_entry is null then
		select coalesce(max(a.balance), 0) into v_balance
		  from bonus_accounts a
		 where a.client_id = p_client and a.customer_id = v_customer;
		return query select * from idem_problem('insufficient-balance',
		    format('customer %s has %s points and cannot redeem %s',
		    v_customer, v_balance, -v_points),
		    format(',"balance":%s', v_balance));
	else
		return query select 201, format('{"entry_id":%s,'
		    '"customer_id":%s,"points":%s,"balance":%s}', v_entry,
		    to_json(v_customer), v_points, v_balance);
	end if;
end;
$$;

comment on function bonus_apply(text, text, jsonb) is
    'bonuses.apply (transactional): a ledger row and the new balance; an '
    'insufficient balance or one past 2^53-1 is a 422.';

select idem_operation('bonuses.apply', 'transactional', 'bonus_apply');

create or replace function order_json(o orders)
returns text
language sql stable as $$
	select format('{"order_id":%s,"customer_id":%s,"amount":%s,'
	    '"currency":%s,"comment":%s,"bonus_points":%s,"created_at":%s}',
	    o.order_id, to_json(o.customer_id), o.amount, to_json(o.currency),
	    coalesce(to_json(o.comment)::text, 'null'), o.bonus_points,
	    to_json(o.created_at));
$$;

comment on function order_json(orders) is 'An order as the API shows it.';

-- GET /v1/orders?customer_id=X: the client's newest 100 orders.
create or replace function order_list(p_client text, p_customer text)
returns text
language sql stable as $$
	select '{"orders":[' ||
	       coalesce(string_agg(order_json(o), ',' order by o.order_id), '') ||
	       ']}'
	  from (select * from orders
		 where client_id = p_client and customer_id = p_customer
		 order by order_id desc limit 100) o;
$$;

comment on function order_list(text, text) is
    'The response of GET /v1/orders: a client''s latest 100 orders of one '
    'customer, oldest first.';

create or replace function bonus_balance(p_client text, p_customer text)
returns text
language sql stable as $$
	select format('{"customer_id":%s,"balance":%s}', to_json(p_customer),
	       coalesce((select balance from bonus_accounts
			  where client_id = p_client
			    and customer_id = p_customer), 0));
$$;

comment on function bonus_balance(text, text) is
    'The response of GET /v1/bonuses/{customer_id}; 0 for an unknown one.';
