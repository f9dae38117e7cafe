-- wrk: POST /v1/orders, every request a retry of one key.
-- bench.py makes the first request before the run.
local key = "bench-replay-order"
local body = '{"customer_id":"c-replay","amount":150000,"currency":"RUB"}'

function request()
	return wrk.format("POST", "/v1/orders", {
		["Authorization"] = "Bearer dev-shop-1",
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = key,
	}, body)
end
