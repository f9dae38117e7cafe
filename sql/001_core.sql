-- The core shared by both strategies: clients, the idempotency keys, the
-- operations and how each is run, the problems the SQL writes, replay and
-- cleanup.

-- Formats are checked with a length and an unbounded character class:
-- PostgreSQL's regex engine expands a bounded repetition such as {1,255}
-- into as many copies, which made one key check cost 0.1 ms.
create table if not exists clients (
	client_id	text primary key
			check (length(client_id) <= 64 and
			    client_id ~ '^[A-Za-z0-9._-]+$'),
	token_sha256	text not null unique
			check (length(token_sha256) = 64 and
			    token_sha256 ~ '^[0-9a-f]+$'),
	created_at	timestamptz not null default now()
);

comment on table clients is
    'API clients. A bearer token is stored only as its SHA-256 (hex).';

-- Hot tables carry client_id without a foreign key: it comes from the
-- authenticated token, and a foreign key would make every insert lock the
-- client's row, which serialises a busy client on multixacts.
create table if not exists idempotency_keys (
	client_id	text not null,
	idem_key	text not null check (length(idem_key) <= 255 and
			    idem_key ~ '^[!-~]+$'),
	operation	text not null,
	fingerprint	text not null check (length(fingerprint) = 64 and
			    fingerprint ~ '^[0-9a-f]+$'),
	status		text not null check (status in ('in_progress', 'done')),
	lease_id	bigint not null default 0 check (lease_id >= 0),
	locked_until	timestamptz,
	request		jsonb,
	status_code	int check (status_code between 100 and 599),
	response	text,
	created_at	timestamptz not null default now(),
	finished_at	timestamptz,
	primary key (client_id, idem_key),
	check ((status = 'done') = (status_code is not null and
	    response is not null and finished_at is not null))
);

comment on table idempotency_keys is
    'One row per (client, Idempotency-Key). The transactional strategy '
    'writes it in the same transaction as the business rows, so it is only '
    'ever seen done. The lease strategy takes it first as in_progress with a '
    'lease (locked_until) and a fencing token (lease_id), then saves the '
    'outcome. response holds the exact bytes replayed to retries.';
comment on column idempotency_keys.operation is
    'What the key was used for (orders.create, payments.create, ...): the '
    'same key for another operation is a mismatch, like another fingerprint.';
comment on column idempotency_keys.lease_id is
    'Fencing token: incremented by every take-over; a worker may complete or '
    'release the key only with the lease_id it took.';
comment on column idempotency_keys.request is
    'The fields that define a payment, kept so that the recovery job can '
    'finish an abandoned one.';

-- A transactional request writes its key row once, already done. The
-- lease strategy's rows are updated; only the partial index follows
-- locked_until, and only while a lease is held.
create index if not exists idempotency_keys_created
    on idempotency_keys (created_at);
create index if not exists idempotency_keys_leased
    on idempotency_keys (locked_until) where locked_until is not null;

-- Columns of the lease strategy, on the one key table (see 003_lease.sql).
alter table idempotency_keys add column if not exists call_deadline timestamptz;
alter table idempotency_keys add column if not exists recovery_attempts int
    not null default 0 check (recovery_attempts >= 0);
alter table idempotency_keys add column if not exists recover_at timestamptz;

comment on column idempotency_keys.call_deadline is
    'When the provider call of the attempt that holds the lease gives up '
    '(taken + IDEM_PROVIDER_TIMEOUT_MS): what a duplicate''s Retry-After '
    'counts down to, never past locked_until.';
comment on column idempotency_keys.recovery_attempts is
    'Attempts of the recovery job at this key that ended without an '
    'outcome (released).';
comment on column idempotency_keys.recover_at is
    'When the recovery job may next take this key, after an attempt of its '
    'own that ended without an outcome; until its first attempt, '
    'p_after_seconds after the lease ended.';

-- An operation is a row: its name (the key's operation), its strategy,
-- and the function that does its work. A transactional operation's
-- function makes the business writes in the transaction that then writes
-- the key; a lease operation's settles a provider's answer, and its optional
-- admit function runs when a new key is taken (a refund's hold).
-- The functions are kept by name, as text: pg_upgrade refuses a database
-- with a regproc column in a table of its own. idem_operation() checks
-- that they exist, and the strategies resolve them (::regproc) when they
-- call them.
create table if not exists idem_operations (
	operation	text primary key,
	strategy	text not null
			check (strategy in ('transactional', 'lease')),
	run		text not null,
	admit		text,
	recover		boolean not null default true
);

comment on table idem_operations is
    'Every operation: its strategy and its SQL function (run), called by '
    'tx_run() or lease_complete() by name. recover: whether the recovery job '
    'finishes abandoned keys of a lease operation.';

create or replace function idem_operation(p_operation text, p_strategy text,
    p_run regproc, p_admit regproc default null,
    p_recover boolean default true)
returns void
language plpgsql as $$
begin
	insert into idem_operations (operation, strategy, run, admit, recover)
	values (p_operation, p_strategy, p_run::text, p_admit::text, p_recover)
	on conflict (operation) do update
	   set strategy = excluded.strategy, run = excluded.run,
	       admit = excluded.admit, recover = excluded.recover;
	-- Its name is written into SQL (002_transactional.sql): plain words.
	if p_operation !~ '^[a-z][a-z0-9_.-]*$' then
		raise exception 'operation name % is not [a-z][a-z0-9_.-]*',
		    quote_literal(p_operation);
	end if;
	-- The transactional strategy calls its operations from a function
	-- written from this table (tx_execute(), 002_transactional.sql).
	perform idem_tx_execute_build();
end;
$$;

comment on function idem_operation(text, text, regproc, regproc, boolean) is
    'Registers an operation (each operation''s migration calls it).';

-- The problems the SQL writes, with the status and title the C table of
-- src/core/problem.c gives them (a test checks that the two agree). The
-- type URL's base is the service's IDEM_PUBLIC_URL, which every connection
-- of the service sets as idem.public_url.
create table if not exists idem_problem_types (
	slug		text primary key check (slug ~ '^[a-z-]+$'),
	status		int not null check (status between 400 and 599),
	title		text not null
);

comment on table idem_problem_types is
    'Problem types written by SQL functions; the same as the C table.';

create or replace function idem_problem_type(p_slug text, p_status int,
    p_title text)
returns void
language sql as $$
	insert into idem_problem_types (slug, status, title)
	values (p_slug, p_status, p_title)
	on conflict (slug) do update
	   set status = excluded.status, title = excluded.title;
$$;

-- The one SQL builder of a problem document: type, title, status, detail,
-- then the extra members given as JSON text (",\"balance\":3").
-- An unknown type is an error, never no row: a caller that returned no
-- row would read as a success.
create or replace function idem_problem(p_slug text, p_detail text,
    p_members text default '')
returns table (status_code int, response text)
language plpgsql stable as $$
begin
	return query
	select t.status, format('{"type":%s,"title":%s,"status":%s,'
	    '"detail":%s%s}', to_json(coalesce(nullif(current_setting(
	    'idem.public_url', true), ''), 'http://127.0.0.1:8888') ||
	    '/problems/' || t.slug), to_json(t.title), t.status,
	    to_json(p_detail), p_members)
	  from idem_problem_types t
	 where t.slug = p_slug;
	if not found then
		raise exception 'no problem type %', p_slug;
	end if;
end;
$$;

comment on function idem_problem(text, text, text) is
    'A problem+json document and its status, for a saved outcome.';

create or replace function idempotency_cleanup(p_retention_seconds int,
    p_batch int)
returns int
language plpgsql as $$
declare
	v_deleted	int;
begin
	-- The batch is chosen once. As a subquery of the delete it could be
	-- the inner side of a nested loop (stale statistics that say the
	-- table holds one row) and run again for every row: each run skips
	-- the rows this delete has just removed and locks the next ones, so
	-- one call deleted any number of keys.
	with d as materialized (
		select c.client_id, c.idem_key
		  from idempotency_keys c
		 where c.created_at < now() -
			   make_interval(secs => p_retention_seconds)
		   and c.status = 'done'
		 order by c.created_at
		 limit p_batch
		   for update skip locked)
	delete from idempotency_keys k
	 using d
	 where k.client_id = d.client_id and k.idem_key = d.idem_key;

	get diagnostics v_deleted = row_count;
	return v_deleted;
end;
$$;

comment on function idempotency_cleanup(int, int) is
    'Deletes up to p_batch finished keys created more than the retention ago '
    '(oldest first, by the created_at index), skipping rows locked by '
    'another instance; returns how many. In-progress keys are never deleted.';
