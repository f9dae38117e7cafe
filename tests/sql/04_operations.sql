-- Cleanup of finished keys, and the recovery's claim of abandoned keys of
-- lease operations (lease_recover_claim_v2, lease_recover_release) with its
-- backoff.
begin;
select plan(28);

insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, status_code, response, created_at, finished_at)
select 'shop-1', 'old-' || g, 'orders.create', repeat('a', 64), 'done', 201,
       '{}', now() - interval '2 days', now() - interval '2 days'
  from generate_series(1, 5) g;
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, status_code, response, finished_at)
values ('shop-1', 'fresh', 'orders.create', repeat('a', 64), 'done', 201, '{}',
    now());
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, locked_until, request, created_at)
values ('shop-1', 'stuck', 'payments.create', repeat('a', 64), 'in_progress', 1,
    now() - interval '1 hour',
    '{"amount":100,"currency":"RUB","recipient":"acc"}', now() - interval '2 days');

select is(idempotency_cleanup(86400, 2), 2, 'cleanup deletes a batch of old finished keys');
select is(idempotency_cleanup(86400, 2), 2, 'and the next batch');
select is(idempotency_cleanup(86400, 2), 1, 'and the rest');
select is(idempotency_cleanup(86400, 2), 0, 'then nothing');
select ok(exists(select 1 from idempotency_keys where idem_key = 'fresh'),
    'keys within the retention stay');
select ok(exists(select 1 from idempotency_keys where idem_key = 'stuck'),
    'in-progress keys are never deleted, however old');
select is((select count(*)::int from idempotency_keys where idem_key like 'old-%'), 0,
    'no old finished key is left');

-- Statistics that say the table holds one row made the planner run the
-- batch's subquery again for every row of the delete, each run locking
-- the next keys: one call deleted them all.
savepoint stale;
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, status_code, response, created_at, finished_at)
select 'shop-1', 'stale-' || g, 'orders.create', repeat('a', 64), 'done', 201,
       '{}', now() - interval '2 days', now() - interval '2 days'
  from generate_series(1, 6) g;
update pg_class set reltuples = 1, relpages = 1
 where oid = 'idempotency_keys'::regclass;
select is(idempotency_cleanup(86400, 2), 2,
    'a batch stays a batch whatever the planner''s statistics say');
rollback to savepoint stale;

create temporary table claim as select * from lease_recover_claim_v2(300, 30, 10000);
select results_eq($$select client_id, idem_key, lease_id, operation,
    request->>'amount', request->>'currency', request->>'recipient' from claim$$,
    $$values ('shop-1'::text, 'stuck'::text, 2::bigint, 'payments.create'::text,
    '100'::text, 'RUB'::text, 'acc'::text)$$,
    'an abandoned payment is claimed with the next lease, its operation and its fields');
select ok((select locked_until > now() from idempotency_keys where idem_key = 'stuck'),
    'under a new lease');
select is((select count(*)::int from lease_recover_claim_v2(300, 30, 10000)), 0,
    'a claimed payment is not claimed again');

insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, locked_until, request)
values ('shop-1', 'recent', 'payments.create', repeat('a', 64), 'in_progress', 1,
    now() - interval '10 seconds', '{}'),
       ('shop-1', 'demo', 'demo.fresh-provider-key', repeat('a', 64), 'in_progress', 1,
    now() - interval '1 hour', '{}');
select is((select count(*)::int from lease_recover_claim_v2(300, 30, 10000)), 0,
    'neither a lease that ended recently nor a demo payment is claimed');
select is((select count(*)::int from lease_recover_claim_v2(5, 30, 10000)), 1,
    'with a shorter wait the recent one is');

-- With statistics that say the table holds one row, the claim ran again
-- for every row and claimed every due key in one call.
savepoint stale;
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, locked_until, request)
select 'shop-1', 'due-' || g, 'payments.create', repeat('a', 64), 'in_progress',
       1, now() - interval '1 hour' + g * interval '1 second', '{}'
  from generate_series(1, 4) g;
update pg_class set reltuples = 1, relpages = 1
 where oid = 'idempotency_keys'::regclass;
select is((select count(*)::int from lease_recover_claim_v2(300, 30, 10000)), 1,
    'a claim takes one key whatever the planner''s statistics say');
select is((select count(*)::int from idempotency_keys where idem_key like 'due-%'
    and lease_id > 1), 1, 'and leases no other');
rollback to savepoint stale;

-- The job's attempts that end without an outcome back it off the payment:
-- the base (30 s), doubled each time, at most the cap (100 s).
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, locked_until, request)
values ('shop-1', 'flaky', 'payments.create', repeat('a', 64), 'in_progress', 1,
    now() - interval '1 hour', '{"amount":5,"currency":"RUB","recipient":"acc"}');
select is((select lease_id from lease_recover_claim_v2(300, 30, 10000)), 2::bigint,
    'a payment whose provider fails is claimed');
select results_eq($$select * from lease_recover_release('shop-1', 'flaky', 2, 30, 100)$$,
    $$values (true, 1, 30)$$, 'its first failed attempt puts it off by the base, 30 s');
select ok((select locked_until <= now() and recover_at = now() + interval '30 seconds'
    from idempotency_keys where idem_key = 'flaky'),
    'the lease ends at once (a client''s retry can take it), the job waits');
update idempotency_keys set locked_until = now() - interval '1 hour'
 where idem_key = 'flaky';
select is((select count(*)::int from lease_recover_claim_v2(300, 30, 10000)), 0,
    'the job does not take it before then, however long ago the lease ended');
update idempotency_keys set locked_until = now() - interval '1 second',
    recover_at = now() - interval '1 second' where idem_key = 'flaky';
select is((select lease_id from lease_recover_claim_v2(300, 30, 10000)), 3::bigint,
    'once due it is claimed, without waiting the 300 s for the client again');
select results_eq($$select * from lease_recover_release('shop-1', 'flaky', 3, 30, 100)$$,
    $$values (true, 2, 60)$$, 'the second failed attempt: 60 s');
update idempotency_keys set recover_at = now() - interval '1 second',
    locked_until = now() - interval '1 second' where idem_key = 'flaky';
select is((select lease_id from lease_recover_claim_v2(300, 30, 10000)), 4::bigint,
    'claimed again when due');
select results_eq($$select * from lease_recover_release('shop-1', 'flaky', 4, 30, 100)$$,
    $$values (true, 3, 100)$$, 'the third: 120 s, capped at 100 s');
select results_eq($$select * from lease_recover_release('shop-1', 'flaky', 3, 30, 100)$$,
    $$values (false, null::int, null::int)$$,
    'a fenced release writes nothing and says so in its one row');

select is((select outcome from lease_complete('shop-1', 'stuck', 2, 'ch_x', 201, null)),
    'completed', 'the recovery completes with its lease');
select is((select status from idempotency_keys where idem_key = 'stuck'), 'done',
    'and the payment is done');

-- The claim is the lease strategy's, for every lease operation that is
-- recovered, not for payments alone.
select idem_operation('test.lease', 'lease', 'payment_settle');
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, locked_until, request)
values ('shop-1', 'other-op', 'test.lease', repeat('a', 64), 'in_progress', 1,
    now() - interval '1 hour', '{"amount":7,"currency":"EUR","recipient":"acc"}');
select results_eq($$select idem_key, lease_id, operation from
    lease_recover_claim_v2(300, 30, 10000)$$,
    $$values ('other-op'::text, 2::bigint, 'test.lease'::text)$$,
    'an abandoned key of another lease operation is claimed with its operation');
select is((select status_code from lease_complete('shop-1', 'other-op', 2, 'ch_y',
    201, null)), 201, 'and completed by that operation''s run function');

select * from finish();
rollback;
