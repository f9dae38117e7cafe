-- The transactional strategy, for operations inside this database: the key
-- row and the business rows are written in ONE transaction, by one call of
-- tx_run(). A concurrent duplicate waits inside PostgreSQL on the key's
-- unique index until the first commits, then replays its saved response;
-- if the first rolled back, the duplicate does the work itself.
--
-- An operation's own function holds only its business writes:
--   f(p_client text, p_key text, p_request jsonb)
--   returns table (status_code int, response text)
-- registered with idem_operation('name', 'transactional', 'f').

-- A replay answers what another transaction committed. That commit may
-- be visible here without being on the synchronous standby yet: its wait
-- for the standby was cancelled ("committed locally", answered 503), or
-- the standby was dropped from synchronous_standby_names. A transaction
-- that writes no WAL commits without waiting for anyone, even with a
-- transaction id; one that writes a record waits until the standby has
-- it, and with it everything before it, the replayed row included. So a
-- replay promises only what a failover keeps; unconfirmed, it is a 503
-- like a write's commit. The record is a transactional logical message
-- (no table, no lock, nothing to vacuum); the cost, a WAL record and a
-- round trip to the standby per replay. Without a synchronous standby
-- there is nothing to wait for, and no record is written (no flush per
-- replay on a single server).
create or replace function idem_confirm()
returns void
language plpgsql volatile as $$
begin
	if current_setting('synchronous_standby_names') <> '' then
		perform pg_logical_emit_message(true, 'idem', 'replay');
	end if;
end;
$$;

comment on function idem_confirm() is
    'Makes the calling transaction write WAL, so that its commit waits for '
    'the synchronous standby: called before answering a replay.';

create or replace function tx_run(p_client text, p_key text,
    p_operation text, p_fingerprint text, p_request jsonb)
returns table (outcome text, status_code int, response text)
language plpgsql as $$
declare
	v_run		regproc;
	v_status	int;
	v_response	text;
begin
	-- A retry of a finished key: one index lookup. Its commit waits for
	-- the synchronous standby like a write's (idem_confirm()).
	return query select * from idempotency_replay(p_client, p_key,
	    p_operation, p_fingerprint);
	if found then
		perform idem_confirm();
		return;
	end if;

	insert into idempotency_keys (client_id, idem_key, operation,
	    fingerprint, status)
	values (p_client, p_key, p_operation, p_fingerprint, 'in_progress')
	on conflict do nothing;

	-- Taken meanwhile: this insert waited until that transaction ended,
	-- and this separate statement reads what it committed (READ
	-- COMMITTED: a new snapshot per statement).
	if not found then
		return query select * from idempotency_replay(p_client, p_key,
		    p_operation, p_fingerprint);
		perform idem_confirm();
		return;
	end if;

	select o.run into v_run
	  from idem_operations o
	 where o.operation = p_operation and o.strategy = 'transactional';
	if v_run is null then
		raise exception 'no transactional operation %', p_operation;
	end if;

	execute format('select status_code, response from %s($1, $2, $3)',
	    v_run) into v_status, v_response using p_client, p_key, p_request;

	update idempotency_keys k
	   set status = 'done', status_code = v_status, response = v_response,
	       finished_at = now()
	 where k.client_id = p_client and k.idem_key = p_key;

	return query select 'created'::text, v_status, v_response;
end;
$$;

comment on function tx_run(text, text, text, text, jsonb) is
    'Transactional strategy: takes the key and runs the operation''s '
    'function in the same transaction (created), or answers a retry from '
    'the saved row (replayed, mismatch), after waiting for a concurrent '
    'first attempt to end.';

drop function if exists idempotency_finish(text, text, int, text);
