-- A reconciliation that finishes on a busy account (issue 28, item 4).
-- A reconciliation lists what the provider made in a window (Stripe: the
-- charges created from the key's first attempt to its last indeterminate
-- answer), a page of 100 at a time, at most RECONCILE_PAGES_MAX pages per
-- attempt and none past the attempt's lease (src/lease/lease.c,
-- flow_reconcile). An attempt that stops paging keeps where it stopped in
-- the key's row: the next attempt of the same generation goes on from
-- there, with the same window, instead of page 1. Only the reconciliation
-- path reads and writes these columns; the lease functions of
-- 003_lease.sql are not changed.

alter table idempotency_keys add column if not exists reconcile_cursor
    text;
alter table idempotency_keys add column if not exists
    reconcile_cursor_generation int;
alter table idempotency_keys add column if not exists
    reconcile_window_end timestamptz;

comment on column idempotency_keys.reconcile_cursor is
    'Lease strategy: the id of the last item of the last page an '
    'unfinished reconciliation read (the provider''s starting_after); the '
    'next attempt of the same generation goes on from it. Null: from the '
    'first page.';
comment on column idempotency_keys.reconcile_cursor_generation is
    'Lease strategy: the generation of the provider key whose '
    'reconciliation reconcile_cursor belongs to; a cursor of another '
    'generation is never used.';
comment on column idempotency_keys.reconcile_window_end is
    'Lease strategy: the end of the window (created[lte]) the '
    'reconciliation at reconcile_cursor lists, kept so that the attempts '
    'that go on from the cursor read the same list.';

-- The cursor an earlier attempt of this generation kept, read by the
-- attempt that holds the lease p_lease at the start of its
-- reconciliation. No row: none kept (or the lease is no longer this
-- attempt's): from the first page.
create or replace function lease_reconcile_cursor(p_client text,
    p_key text, p_lease bigint, p_generation int)
returns table (after text, window_end double precision)
language sql stable as $$
	select k.reconcile_cursor,
	       extract(epoch from k.reconcile_window_end)::double precision
	  from idempotency_keys k
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	   and k.provider_generation = p_generation
	   and k.reconcile_cursor_generation = p_generation
	   and k.reconcile_cursor is not null;
$$;

comment on function lease_reconcile_cursor(text, text, bigint, int) is
    'Lease strategy: where an earlier attempt''s reconciliation of '
    'generation p_generation stopped (after) and the end of its window '
    '(epoch seconds); no row to start from the first page.';

-- Keeps where this attempt's reconciliation stopped (p_cursor, and the
-- end of its window p_window_end in epoch seconds), only under its lease
-- p_lease and for the key's generation p_generation, as lease_release()
-- is fenced. A null p_cursor clears it: the reconciliation ended and the
-- generation moves on. False if fenced or moved meanwhile.
create or replace function lease_reconcile_save(p_client text, p_key text,
    p_lease bigint, p_generation int, p_cursor text, p_window_end bigint)
returns boolean
language plpgsql as $$
begin
	update idempotency_keys k
	   set reconcile_cursor = p_cursor,
	       reconcile_cursor_generation = case when p_cursor is null
		   then null else p_generation end,
	       reconcile_window_end = case when p_cursor is null then null
		   else to_timestamp(p_window_end) end
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	   and k.provider_generation = p_generation;
	return found;
end;
$$;

comment on function lease_reconcile_save(text, text, bigint, int, text,
    bigint) is
    'Lease strategy: keeps the cursor and window of an unfinished '
    'reconciliation of generation p_generation under the lease p_lease '
    '(null p_cursor: clears them). False if fenced.';
