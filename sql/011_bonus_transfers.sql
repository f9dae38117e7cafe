-- Bonus transfers: points moved from one customer of a client to another,
-- protected by the transactional strategy (002_transactional.sql). One
-- transfer is a bonus_transfers row, two ledger rows that name it and both
-- balances, all in the transaction that writes the key.

create table if not exists bonus_transfers (
	transfer_id	bigint generated always as identity primary key,
	client_id	text not null,
	from_customer_id text not null
			check (length(from_customer_id) between 1 and 128),
	to_customer_id	text not null
			check (length(to_customer_id) between 1 and 128),
	points		bigint not null
			check (points between 1 and 9007199254740991),
	reason		text not null,
	idem_key	text not null,
	created_at	timestamptz not null default now(),
	constraint bonus_transfers_two_customers
	    check (from_customer_id <> to_customer_id)
);

comment on table bonus_transfers is
    'Points moved between two customers of a client, each by one POST '
    '/v1/bonuses/transfers with its Idempotency-Key; its two bonus_ledger '
    'rows name it.';

-- The column and its constraints are added apart, NOT VALID: on a ledger
-- that is already large, validating them would scan it under a lock that
-- stops its writes (old rows have no transfer and need no check).
alter table bonus_ledger add column if not exists transfer_id bigint;

do $$
begin
	alter table bonus_ledger add constraint bonus_ledger_transfer_id_fkey
	    foreign key (transfer_id) references bonus_transfers not valid;
exception when duplicate_object then
	null;
end;
$$;

comment on column bonus_ledger.transfer_id is
    'The transfer this row is one side of (negative for the sender, '
    'positive for the receiver); null for an order''s accrual or a bonus.';

do $$
begin
	alter table bonus_ledger add constraint bonus_ledger_one_source
	    check (order_id is null or transfer_id is null) not valid;
exception when duplicate_object then
	null;
end;
$$;

-- POST /v1/bonuses/transfers, run by tx_execute() in the transaction that
-- writes the key. A sender with too few points (none without an account) is an
-- insufficient-balance 422, a receiver that would pass 2^53-1 a
-- balance-limit-exceeded 422: saved outcomes, with nothing else written.
create or replace function bonus_transfer(p_client text, p_key text,
    p_request jsonb)
returns table (status_code int, response text)
language plpgsql as $$
declare
	v_from		text := p_request->>'from_customer_id';
	v_to		text := p_request->>'to_customer_id';
	v_points	bigint := (p_request->>'points')::bigint;
	v_customer	text;
	v_opened	boolean := false;
	v_from_balance	bigint;
	v_to_balance	bigint;
	v_transfer	bigint;
begin
	-- The service refuses it first (400); saved here it would be an
	-- insufficient balance of a customer to itself.
	if v_from = v_to then
		raise exception 'a transfer from customer % to itself', v_from
		    using errcode = 'check_violation';
	end if;

	-- Both accounts are locked before either changes, in the order of
	-- their ids (collation "C", the same in every session), whichever
	-- is the sender: every transaction that holds one account and waits
	-- for another waits for a later one, so no cycle of waits (a
	-- deadlock) can form, between transfers in opposite directions or
	-- any others (the other operations lock a single account). The
	-- receiver's row is made if it is missing, so that it can be locked;
	-- an insert of a row that another transaction is inserting waits for
	-- it like a lock. The sender's is only read: without a row it has 0
	-- points.
	for v_customer in
		select c from unnest(array[v_from, v_to]) c order by c collate "C"
	loop
		if v_customer = v_to then
			insert into bonus_accounts (client_id, customer_id)
			values (p_client, v_to)
			on conflict do nothing;
			v_opened := found;
			select a.balance into strict v_to_balance
			  from bonus_accounts a
			 where a.client_id = p_client and a.customer_id = v_to
			   for update;
		else
			select a.balance into v_from_balance
			  from bonus_accounts a
			 where a.client_id = p_client and a.customer_id = v_from
			   for update;
		end if;
	end loop;

	v_from_balance := coalesce(v_from_balance, 0);

	if v_from_balance < v_points then
		-- Made above for the lock alone: a refused transfer opens no
		-- account. Nobody else has seen the row.
		if v_opened then
			delete from bonus_accounts a
			 where a.client_id = p_client and a.customer_id = v_to;
		end if;
		return query select * from idem_problem('insufficient-balance',
		    format('customer %s has %s points and cannot transfer %s',
		    v_from, v_from_balance, v_points),
		    format(',"balance":%s', v_from_balance));
		return;
	end if;

	if v_to_balance > 9007199254740991 - v_points then
		return query select * from bonus_limit_problem(p_client, v_to,
		    v_points);
		return;
	end if;

	insert into bonus_transfers (client_id, from_customer_id,
	    to_customer_id, points, reason, idem_key)
	values (p_client, v_from, v_to, v_points, p_request->>'reason', p_key)
	returning transfer_id into v_transfer;

	update bonus_accounts a
	   set balance = a.balance - v_points, updated_at = now()
	 where a.client_id = p_client and a.customer_id = v_from
	returning a.balance into v_from_balance;

	update bonus_accounts a
	   set balance = a.balance + v_points, updated_at = now()
	 where a.client_id = p_client and a.customer_id = v_to
	returning a.balance into v_to_balance;

	insert into bonus_ledger (client_id, customer_id, points, reason,
	    idem_key, transfer_id)
	values (p_client, v_from, -v_points, p_request->>'reason', p_key,
	    v_transfer),
	       (p_client, v_to, v_points, p_request->>'reason', p_key,
	    v_transfer);

	return query select 201, format('{"transfer_id":%s,'
	    '"from_customer_id":%s,"to_customer_id":%s,"points":%s,'
	    '"from_balance":%s,"to_balance":%s}', v_transfer, to_json(v_from),
	    to_json(v_to), v_points, v_from_balance, v_to_balance);
end;
$$;

comment on function bonus_transfer(text, text, jsonb) is
    'bonuses.transfer (transactional): a transfer, its two ledger rows and '
    'both balances, the accounts locked in the order of their ids; an '
    'insufficient balance or a receiver past 2^53-1 is a 422.';

select idem_operation('bonuses.transfer', 'transactional', 'bonus_transfer');
