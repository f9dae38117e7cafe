-- wrk: POST /v1/payments, every request a retry of one key.
-- bench.py makes the first request before the run.
local key = "bench-replay-payment"
local body = '{"amount":10000,"currency":"RUB","recipient":"acc-replay"}'

function request()
	return wrk.format("POST", "/v1/payments", {
		["Authorization"] = "Bearer dev-shop-1",
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = key,
	}, body)
end
