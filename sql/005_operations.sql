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

-- The recovery job backs off per payment: each of its attempts that ends
-- without an outcome (the provider failing, or still processing the key)
-- doubles the wait before the next, up to a cap, so that a provider that is
-- down is not called every round for every abandoned payment.
alter table idempotency_keys add column if not exists recovery_attempts int
    not null default 0 check (recovery_attempts >= 0);
alter table idempotency_keys add column if not exists recover_at timestamptz;

comment on column idempotency_keys.recovery_attempts is
    'Attempts of the recovery job at this payment that ended without an '
    'outcome (released).';
comment on column idempotency_keys.recover_at is
    'When the recovery job may next take this payment, after an attempt of '
    'its own that ended without an outcome; until its first attempt, '
    'p_after_seconds after the lease ended.';

-- The two-argument claim of databases made before call_deadline.
drop function if exists payment_recover_claim(int, int);

-- Takes over the payment that has been due longest, exactly as a retry
-- would (lease_id + 1, and the deadline of its provider call of p_call_ms).
-- A payment is due p_after_seconds after its lease ended, the client's
-- time to retry on its own; once the job has tried it, at recover_at.
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
		 where c.locked_until < now()
		   and coalesce(c.recover_at, c.locked_until +
			   make_interval(secs => p_after_seconds)) < now()
		   and c.status = 'in_progress'
		   and c.operation = 'payments.create'
		 order by coalesce(c.recover_at, c.locked_until +
			   make_interval(secs => p_after_seconds))
		 limit 1
		   for update skip locked) a
	 where k.client_id = a.client_id and k.idem_key = a.idem_key
	returning k.client_id, k.idem_key, k.lease_id, k.request->>'amount',
	    k.request->>'currency', k.request->>'recipient';
$$;

comment on function payment_recover_claim(int, int, int) is
    'Recovery: claims one payment abandoned for more than p_after_seconds '
    '(or, after an attempt of the job, due again at recover_at) with a new '
    'lease and fencing token, and returns what is needed to charge it '
    'again with the same derived key.';

-- Ends the job's attempt without an outcome: the lease ends now, so that a
-- client's retry can take the key at once, and the job waits
-- min(p_cap, p_base * 2^n) seconds before its next attempt, n the attempts
-- that failed before this one. Always one row: released false if fenced.
create or replace function payment_recover_release(p_client text,
    p_key text, p_lease bigint, p_base int, p_cap int)
returns table (released boolean, attempts int, wait_seconds int)
language plpgsql as $$
begin
	return query
	update idempotency_keys k
	   set locked_until = now(),
	       recovery_attempts = k.recovery_attempts + 1,
	       recover_at = now() + make_interval(secs => least(p_cap,
		   p_base * power(2, least(k.recovery_attempts, 30))))
	 where k.client_id = p_client and k.idem_key = p_key
	   and k.lease_id = p_lease and k.status = 'in_progress'
	returning true, k.recovery_attempts, extract(epoch from
	    k.recover_at - k.locked_until)::int;

	if not found then
		return query select false, null::int, null::int;
	end if;
end;
$$;

comment on function payment_recover_release(text, text, bigint, int, int) is
    'Recovery, when the provider failed or still processes the key: '
    'releases the lease like payment_release() and puts the next attempt '
    'of the job off by min(p_cap, p_base * 2^n) seconds, doubling per '
    'failed attempt.';
