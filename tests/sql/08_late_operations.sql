-- Late operations (sql/042_late_operations.sql): the late scan's queue
-- (a key that moves past its first generation is queued, taken once it is
-- finished and due, deleted with its key) and late_operation_record()
-- (once per provider id, never the key's own outcome, never a change to
-- the key).
begin;
select plan(23);

insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, request)
values ('shop-1', 'late-1', 'payments.create', repeat('a', 64),
    'in_progress', 1, '{"amount":100,"currency":"RUB","recipient":"acc"}');

select is((select count(*) from late_scans where idem_key = 'late-1'), 0::bigint,
    'a key at its first generation is not queued');
update idempotency_keys set provider_generation = 2 where idem_key = 'late-1';
select is((select count(*) from late_scans where idem_key = 'late-1'), 1::bigint,
    'a key that moves to its second generation is queued for the late scan');
update idempotency_keys set provider_generation = 3 where idem_key = 'late-1';
select is((select count(*) from late_scans where idem_key = 'late-1'), 1::bigint,
    'once');
select is_empty($$select * from late_scan_claim(0)$$,
    'a key in progress is not scanned');

update idempotency_keys
   set status = 'done', status_code = 201, locked_until = null,
       response = '{"payment_id":1,"charge_id":"ch_settled","status":"succeeded",'
	   '"amount":100,"currency":"RUB"}',
       finished_at = now() - interval '10 seconds'
 where idem_key = 'late-1';
select is_empty($$select * from late_scan_claim(3600)$$,
    'a finished key is not scanned before its delay');
select is_empty($$select * from late_scan_claim(5, '{refunds.create}')$$,
    'nor by a build that does not run its operation');
select results_eq($$select idem_key, operation, generation, settled_id
    from late_scan_claim(5, '{payments.create}')$$,
    $$values ('late-1'::text, 'payments.create'::text, 3, 'ch_settled'::text)$$,
    'a finished key past its delay is taken, with its last generation and the '
    'charge it saved');
select is((select count(*) from late_scans where idem_key = 'late-1'), 0::bigint,
    'and taken off the queue');
select is_empty($$select * from late_scan_claim(0)$$, 'it is scanned once');

select results_eq($$select recorded, settled_id, key_status from
    late_operation_record('shop-1', 'late-1', 'payments.create', 'shop-1:late-1:3',
    3, 'ch_settled', 100, 'scan')$$,
    $$values (false, 'ch_settled'::text, 'done'::text)$$,
    'the key''s own charge is never late');
select is((select count(*) from late_operations where idem_key = 'late-1'), 0::bigint,
    'and not written');

select results_eq($$select recorded, settled_id, key_status from
    late_operation_record('shop-1', 'late-1', 'payments.create', 'shop-1:late-1',
    1, 'ch_late', 100, 'scan')$$,
    $$values (true, 'ch_settled'::text, 'done'::text)$$,
    'another charge of the key is recorded');
select results_eq($$select client_id, idem_key, operation, provider_key, generation,
    amount, settled_id, key_status, key_status_code, found_by, handled_at
    from late_operations where provider_id = 'ch_late'$$,
    $$values ('shop-1'::text, 'late-1'::text, 'payments.create'::text,
    'shop-1:late-1'::text, 1, 100::bigint, 'ch_settled'::text, 'done'::text, 201,
    'scan'::text, null::timestamptz)$$,
    'with the key, its derived key and generation, the amount, the settled charge');
select results_eq($$select recorded from late_operation_record('shop-1', 'late-1',
    'payments.create', 'shop-1:late-1', 1, 'ch_late', 100, 'reconcile')$$,
    $$values (false)$$, 'seen again, it is not recorded again');
select is((select found_by from late_operations where provider_id = 'ch_late'), 'scan',
    'its first record stays');
select is((select response from idempotency_keys where idem_key = 'late-1'),
    '{"payment_id":1,"charge_id":"ch_settled","status":"succeeded","amount":100,'
    '"currency":"RUB"}', 'the key''s saved outcome is untouched');

-- A key that saved a refusal, and one the cleanup deleted.
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, request, status_code, response, finished_at)
values ('shop-1', 'late-2', 'payments.create', repeat('a', 64), 'done', 1, '{}',
    402, '{"type":"card-declined"}', now());
select results_eq($$select recorded, settled_id, key_status from
    late_operation_record('shop-1', 'late-2', 'payments.create', 'shop-1:late-2',
    1, 'ch_late_2', null, 'settle')$$,
    $$values (true, null::text, 'done'::text)$$,
    'a charge of a key that saved a refusal is late');
select results_eq($$select recorded, settled_id, key_status from
    late_operation_record('shop-1', 'late-gone', 'payments.create',
    'shop-1:late-gone', 2, 'ch_late_3', null, 'idemctl')$$,
    $$values (true, null::text, 'gone'::text)$$,
    'so is one of a key deleted since');

update idempotency_keys set provider_generation = 2 where idem_key = 'late-2';
delete from idempotency_keys where idem_key = 'late-2';
select is((select count(*) from late_scans where idem_key = 'late-2'), 0::bigint,
    'a queued key deleted by the cleanup leaves the queue with it');
select throws_ok($$select late_operation_record('shop-1', 'late-1', 'payments.create',
    'k', 1, 'ch_x', null, 'guess')$$, '23514', null,
    'what found it is one of the known ways');

-- A refund saves our refund_id (a number) and the provider's id in
-- provider_refund_id: the latter is its settled operation.
insert into idempotency_keys (client_id, idem_key, operation, fingerprint,
    status, lease_id, request, status_code, response, finished_at)
values ('shop-1', 'late-refund', 'refunds.create', repeat('a', 64), 'done', 1,
    '{"payment_id":1,"amount":100,"refund_id":"17"}', 201,
    '{"refund_id":17,"payment_id":1,"provider_refund_id":"re_settled",'
    '"amount":100,"status":"succeeded"}', now());
select is((select late_settled_id(k) from idempotency_keys k
    where idem_key = 'late-refund'), 're_settled',
    'a refund''s settled id is the provider''s (provider_refund_id), not ours');
select results_eq($$select recorded, settled_id from
    late_operation_record('shop-1', 'late-refund', 'refunds.create',
    'shop-1:late-refund', 1, 're_settled', 100, 'scan')$$,
    $$values (false, 're_settled'::text)$$,
    'a refund''s own provider refund is never late');
select is((select count(*) from late_operations where idem_key = 'late-refund'),
    0::bigint, 'and not written');

select * from finish();
rollback;
