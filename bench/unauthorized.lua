-- wrk: POST /v1/orders without a token, answered 401 before any database
-- call (src/core/auth.c): Kore's HTTP side, the route, the problem
-- response and the access log, with no database round trip.
local body = '{"customer_id":"c-1","amount":150000,"currency":"RUB"}'

function request()
	return wrk.format("POST", "/v1/orders", {
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = "bench-unauthorized",
	}, body)
end
