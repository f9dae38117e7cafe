-- Late operations (issue 28, item 6): an operation the provider made for a
-- key that is not the key's settled outcome: a charge of a generation the
-- key gave up (it appeared at the provider after the service listed and
-- moved on), or one made for a key that was finished otherwise (a refusal
-- saved, or another charge settled). The service finds them by listing
-- (a reconciliation that sees more than one success, the late scan of
-- keys that went past their first generation, a fenced attempt whose
-- success is not the key's) and records each once here, for an operator
-- to refund at the provider or book (docs/operations.md, "A late
-- charge"). Nothing here ever changes a key's saved outcome.

create table if not exists late_operations (
	late_id		bigint generated always as identity primary key,
	client_id	text not null,
	idem_key	text not null,
	operation	text not null,
	provider_key	text not null,
	generation	int not null check (generation > 0),
	provider_id	text not null unique,
	amount		bigint,
	settled_id	text,
	key_status	text not null,
	key_status_code	int,
	found_by	text not null
			check (found_by in ('reconcile', 'settle', 'scan',
			    'idemctl')),
	first_seen_at	timestamptz not null default now(),
	handled_at	timestamptz,
	handled_note	text
);

comment on table late_operations is
    'Operations a provider made for a key that are not its settled outcome '
    '(late charges and refunds), one row per provider id, first seen at. '
    'An operator refunds or books each and marks it handled.';
comment on column late_operations.provider_key is
    'The Idempotency-Key the provider made it under (the key''s derived '
    'key of that generation).';
comment on column late_operations.provider_id is
    'The provider''s id of the operation (a charge''s or refund''s id).';
comment on column late_operations.settled_id is
    'The provider id the key saved as its outcome when this was seen; null '
    'when it saved none (a refusal, or still in progress).';
comment on column late_operations.key_status is
    'The key''s status when this was seen: done, in_progress, or gone '
    '(deleted after the retention).';
comment on column late_operations.found_by is
    'reconcile: a listing that saw a second success; settle: a fenced '
    'attempt''s own success; scan: the late scan of a finished key; '
    'idemctl: scripts/idemctl key.';
comment on column late_operations.handled_at is
    'When an operator dealt with it (scripts/idemctl late handle).';

-- The provider id a finished key saved as its success, else null: the
-- member of its saved 201 that holds the provider's id, per operation. A
-- refund's refund_id is our own number; the provider's is
-- provider_refund_id. Any other lease operation is a kind of charge
-- (payments' provider call: docs/adding-an-operation.md) and saves
-- charge_id; one whose answer names the provider's id otherwise gets its
-- own line here. scripts/idemctl's saved_id() says the same.
create or replace function late_settled_id(k idempotency_keys)
returns text
language sql immutable as $$
	select case when k.status = 'done' and k.status_code between 200 and 299
	    then k.response::jsonb ->> case k.operation
		when 'refunds.create' then 'provider_refund_id'
		else 'charge_id' end end;
$$;

comment on function late_settled_id(idempotency_keys) is
    'The provider id a key saved as its success (a refund''s '
    'provider_refund_id, any other operation''s charge_id), or null.';

-- Records a late operation once (by its provider id): recorded true when
-- this call added it; false when it was recorded before, or when it is
-- the key's own settled outcome (never late, never written).
create or replace function late_operation_record(p_client text, p_key text,
    p_operation text, p_provider_key text, p_generation int,
    p_provider_id text, p_amount bigint, p_found_by text)
returns table (recorded boolean, settled_id text, key_status text)
language plpgsql as $$
declare
	v_key		idempotency_keys;
	v_settled	text;
	v_status	text := 'gone';
begin
	select * into v_key
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key;
	if found then
		v_settled := late_settled_id(v_key);
		v_status := v_key.status;
	end if;

	if v_settled is not distinct from p_provider_id then
		return query select false, v_settled, v_status;
		return;
	end if;

	-- <client>:<key>:<n> is also the key "<key>:<n>"'s first generation,
	-- whose charge a provider that keeps no generation (the fake) lists
	-- under the key's: while that key exists, the operation is its.
	if p_generation > 1 and exists (select 1 from idempotency_keys o
	     where o.client_id = p_client
	       and o.idem_key = p_key || ':' || p_generation) then
		return query select false, v_settled, v_status;
		return;
	end if;

	insert into late_operations (client_id, idem_key, operation,
	    provider_key, generation, provider_id, amount, settled_id,
	    key_status, key_status_code, found_by)
	values (p_client, p_key, p_operation, p_provider_key, p_generation,
	    p_provider_id, p_amount, v_settled, v_status, v_key.status_code,
	    p_found_by)
	on conflict (provider_id) do nothing;

	return query select found, v_settled, v_status;
end;
$$;

comment on function late_operation_record(text, text, text, text, int, text,
    bigint, text) is
    'Records an operation the provider made for a key that is not the '
    'key''s settled outcome, once per provider id; never over the key''s '
    'saved outcome.';

-- The late scan's queue: the keys that went past their first generation
-- (a generation given up: its operation may still appear at the provider
-- after the listing that gave it up), queued when their generation moves,
-- each listed once more after it is finished, then dequeued. Deleted with
-- its key.
create table if not exists late_scans (
	client_id	text not null,
	idem_key	text not null,
	queued_at	timestamptz not null default now(),
	primary key (client_id, idem_key),
	foreign key (client_id, idem_key)
	    references idempotency_keys (client_id, idem_key) on delete cascade
);

comment on table late_scans is
    'Keys to list once more after they are finished (the late scan): each '
    'moved past its first generation.';

create or replace function late_scan_queue()
returns trigger
language plpgsql as $$
begin
	insert into late_scans (client_id, idem_key)
	values (new.client_id, new.idem_key)
	on conflict do nothing;
	return null;
end;
$$;

drop trigger if exists late_scan_queue on idempotency_keys;
create trigger late_scan_queue
    after update of provider_generation on idempotency_keys
    for each row when (new.provider_generation > 1 and
	new.provider_generation is distinct from old.provider_generation)
    execute function late_scan_queue();

-- The keys that moved before this migration.
insert into late_scans (client_id, idem_key)
select k.client_id, k.idem_key
  from idempotency_keys k
 where k.provider_generation > 1
on conflict do nothing;

-- The late scan: takes one queued key of a lease operation that is
-- finished since at least p_after_seconds off the queue, and returns what
-- its listing needs (once: a listing that fails is logged, not retried).
-- p_operations: the lease operations the calling build can list.
create or replace function late_scan_claim(p_after_seconds int,
    p_operations text[] default null)
returns table (client_id text, idem_key text, operation text,
    request jsonb, generation int, taken_at double precision,
    settled_id text)
language sql as $$
	with a as materialized (
		select s.client_id, s.idem_key
		  from late_scans s
		  join idempotency_keys c using (client_id, idem_key)
		 where c.status = 'done'
		   and c.finished_at < now() -
			make_interval(secs => p_after_seconds)
		   and (p_operations is null or c.operation = any (p_operations))
		 order by c.finished_at
		 limit 1
		   for update of s skip locked),
	d as (
		delete from late_scans s
		 using a
		 where s.client_id = a.client_id and s.idem_key = a.idem_key)
	select k.client_id, k.idem_key, k.operation, k.request,
	    k.provider_generation,
	    extract(epoch from k.created_at)::double precision,
	    late_settled_id(k)
	  from a
	  join idempotency_keys k using (client_id, idem_key);
$$;

comment on function late_scan_claim(int, text[]) is
    'The late scan: takes one key off late_scans that is finished since '
    'more than p_after_seconds, with what listing it needs.';
