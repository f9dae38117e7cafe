-- The transactional strategy, for operations inside this database: the key
-- row and the business rows are written in ONE transaction, by one call of
-- tx_execute(): the business rows first, then the key row, once, with its
-- answer. A concurrent duplicate waits inside PostgreSQL on the key's
-- unique index (or first on a business row the first attempt locked) until
-- the first commits; its own writes are then rolled back with SQLSTATE
-- 40001, and the service runs the call again, which replays the saved
-- response. If the first rolled back, the duplicate's insert goes through:
-- it has done the work itself. An instance that does not run the call again
-- answers that 40001 with a retryable 503, and the client's retry replays.
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
-- Whether a commit now waits for a synchronous standby: one is named, and
-- this session's synchronous_commit waits for it (the service pins it to
-- on; a role's default of local or off would not wait). The workers'
-- replay caches keep it with each answer (src/core/replay_cache.c).
create or replace function idem_standby()
returns boolean
language sql stable as $$
	select current_setting('synchronous_standby_names') <> ''
	    and current_setting('synchronous_commit') not in ('local', 'off');
$$;

comment on function idem_standby() is
    'true when commits wait for a synchronous standby.';

create or replace function idem_confirm()
returns void
language plpgsql volatile as $$
begin
	if idem_standby() then
		perform pg_logical_emit_message(true, 'idem', 'replay');
	end if;
end;
$$;

comment on function idem_confirm() is
    'Makes the calling transaction write WAL, so that its commit waits for '
    'the synchronous standby: called before answering a replay.';

-- tx_execute(), what the service calls, is written from the registry by
-- idem_tx_execute_build() whenever idem_operation() registers an
-- operation: the replay lookup, one static call per transactional
-- operation, and the key's insert, in ONE PL/pgSQL function. Each call
-- is a statement whose plan the session keeps (EXECUTE of a function
-- looked up by name would be parsed and planned on every request), and
-- no level of functions sits between the service's call and the
-- operation's. An operation's function returns (status_code int,
-- response text), as a table or as OUT parameters: its first row is
-- taken, its columns by position. tx_execute() keeps the signature it
-- has had (a table of its five columns), so that the previous version's
-- migrations still apply over this one (a rollback).
create or replace function idem_tx_execute_build()
returns void
language plpgsql as $$
declare
	v_calls		text := '';
	v_op		record;
begin
	for v_op in select o.operation, o.run::regproc as run
		      from idem_operations o
		     where o.strategy = 'transactional'
		     order by o.operation loop
		v_calls := v_calls || format($c$	elsif p_operation = %L then
		select * into status_code, response
		  from %s(p_client, p_key, p_request);
$c$, v_op.operation, v_op.run);
	end loop;

	-- The body is one quoted literal: nothing in a name can end it.
	execute format($f$create or replace function tx_execute(
	    p_client text, p_key text, p_operation text, p_fingerprint text,
	    p_request jsonb)
	returns table (outcome text, status_code int, response text,
	    age_ms bigint, standby boolean)
	language plpgsql as %L$f$, $b$
begin
	-- A retry of a finished key: one index lookup, with the key's age
	-- from its first request (what the workers' replay caches must
	-- forget it by, before the cleanup may delete it). Its commit waits
	-- for the synchronous standby like a write's (idem_confirm()).
	select case when k.operation = p_operation and
		    k.fingerprint = p_fingerprint then 'replayed'
		    else 'mismatch' end,
	       k.status_code, k.response,
	       greatest(0, (extract(epoch from clock_timestamp() -
		   k.created_at) * 1000)::bigint)
	  into outcome, status_code, response, age_ms
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
	if found then
		standby := idem_standby();
		perform idem_confirm();
		return next;
		return;
	end if;

	-- The operation's business writes; an unregistered operation raises.
	if p_operation is null then
		raise exception 'no transactional operation %', p_operation;
$b$ || v_calls || $b$	else
		raise exception 'no transactional operation %', p_operation;
	end if;

	-- The key, written once and already finished, in the transaction of
	-- the business rows. A concurrent first attempt with the same key
	-- holds its unique index entry: this insert waits until that
	-- transaction ends.
	insert into idempotency_keys (client_id, idem_key, operation,
	    fingerprint, status, status_code, response, finished_at)
	values (p_client, p_key, p_operation, p_fingerprint, 'done',
	    status_code, response, now())
	on conflict do nothing;

	-- It committed first: this transaction's business writes must not
	-- stay. Rolled back whole (a serialization failure); the service
	-- runs the call again, and its lookup replays what the first saved.
	-- The service knows this expected rollback by its detail
	-- (DB_KEY_TAKEN in src/core/db.h), and does not count it as a
	-- database error.
	if not found then
		raise exception using errcode = 'serialization_failure',
		    message = 'Idempotency-Key taken by a concurrent '
		    'transaction; run the call again to replay its answer',
		    detail = 'idem:key-taken';
	end if;

	-- The key's age, counted from this transaction's start (its
	-- created_at), as a replay would count it.
	outcome := 'created';
	age_ms := greatest(0, (extract(epoch from clock_timestamp() - now()) *
	    1000)::bigint);
	standby := idem_standby();
	return next;
end;
$b$);

	execute $c$comment on function tx_execute(text, text, text, text, jsonb) is
    'Transactional strategy: runs the operation''s function and writes the '
    'key with its answer in the same transaction (created), or answers a '
    'retry from the saved row (replayed, mismatch). A call whose key a '
    'concurrent first attempt committed is rolled back with SQLSTATE 40001 '
    '(detail idem:key-taken): run it again, it replays. With the key''s age '
    'in ms and whether commits wait for a synchronous standby (for the '
    'workers'' replay caches). Written by idem_tx_execute_build().'$c$;
end;
$$;

comment on function idem_tx_execute_build() is
    'Writes tx_execute(), with the static calls of the registered '
    'transactional operations; run by idem_operation().';

-- The previous version's tx_execute() called idem_tx_dispatch() and
-- tx_replay(); a call already running it when this migration commits may
-- still reach them. They are left as they were (the dispatcher no longer
-- follows the registry), and go in the next version. What rewrote the
-- dispatcher goes now.
drop function if exists idem_tx_dispatch_build();

select idem_tx_execute_build();

-- The same, without the two columns: what the service called before
-- tx_execute().
create or replace function tx_run(p_client text, p_key text,
    p_operation text, p_fingerprint text, p_request jsonb)
returns table (outcome text, status_code int, response text)
language sql as $$
	select t.outcome, t.status_code, t.response
	  from tx_execute(p_client, p_key, p_operation, p_fingerprint,
	    p_request) t;
$$;

comment on function tx_run(text, text, text, text, jsonb) is
    'tx_execute() without its last two columns, for instances of the '
    'previous version: a call whose key a concurrent first attempt '
    'committed is rolled back with SQLSTATE 40001; run it again, it '
    'replays.';

drop function if exists idempotency_finish(text, text, int, text);
-- What tx_run() read a retry's answer with before tx_replay(); dropped
-- after tx_run() was replaced, so that an instance of the previous version
-- never calls a tx_run() that calls it.
drop function if exists idempotency_replay(text, text, text, text);
