-- Background jobs: cleanup of finished keys (both strategies) and recovery
-- of abandoned payments. Both skip rows another API instance has locked.

create or replace function idempotency_cleanup(p_retention_seconds int,
    p_batch int)
returns int
language plpgsql as $$
declare
	v_deleted	int;
begin
	delete from idempotency_keys k
	 using (select c.client_id, c.idem_key
		  from idempotency_keys c
		 where c.created_at < now() -
			   make_interval(secs => p_retention_seconds)
		   and c.status = 'done'
		 order by c.created_at
		 limit p_batch
		   for update skip locked) d
	 where k.client_id = d.client_id and k.idem_key = d.idem_key;

	get diagnostics v_deleted = row_count;
	return v_deleted;
end;
$$;

comment on function idempotency_cleanup(int, int) is
    'Deletes up to p_batch finished keys created more than the retention ago '
    '(oldest first, by the created_at index), skipping rows locked by '
    'another instance; returns how many. In-progress keys are never deleted.';

-- The two-argument claim of databases made before call_deadline.
drop function if exists payment_recover_claim(int, int);

-- Takes over the payment whose lease ended longest ago, if that was more
-- than p_after_seconds ago, exactly as a retry would (lease_id + 1, and the
-- deadline of its provider call of p_call_ms).
create or replace function payment_recover_claim(p_after_seconds int,
    p_lease_seconds int, p_call_ms int)
returns table (client_id text, idem_key text, lease_id bigint, amount text,
    currency text, recipient text)
language sql as $$
	update idempotency_keys k
	   set lease_id = k.lease_id + 1,
	       locked_until = now() + make_interval(secs => p_lease_seconds),
	       call_deadline = now() + make_interval(secs => p_call_ms / 1000.0)
	  from (select c.client_id, c.idem_key
		  from idempotency_keys c
		 where c.locked_until < now() -
			   make_interval(secs => p_after_seconds)
		   and c.status = 'in_progress'
		   and c.operation = 'payments.create'
		 order by c.locked_until
		 limit 1
		   for update skip locked) a
	 where k.client_id = a.client_id and k.idem_key = a.idem_key
	returning k.client_id, k.idem_key, k.lease_id, k.request->>'amount',
	    k.request->>'currency', k.request->>'recipient';
$$;

comment on function payment_recover_claim(int, int, int) is
    'Recovery: claims one payment abandoned for more than p_after_seconds '
    'with a new lease and fencing token, and returns what is needed to '
    'charge it again with the same derived key.';
