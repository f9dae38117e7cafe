-- pgbench: the single-row lookup of a saved response, the ceiling of a replay.
select status_code, response from idempotency_keys
 where client_id = 'shop-1' and idem_key = 'bench-lookup';
