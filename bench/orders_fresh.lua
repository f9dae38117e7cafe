-- wrk: POST /v1/orders with a fresh Idempotency-Key on every request,
-- spread over 1000 customers (as pgbench's order_create.sql).
local threads = 0

function setup(thread)
	threads = threads + 1
	thread:set("tid", threads)
end

function init(args)
	prefix = string.format("fresh-%d-%d-", os.time(), tid)
	counter = 0
end

function request()
	counter = counter + 1
	local body = string.format(
	    '{"customer_id":"c-%d","amount":150000,"currency":"RUB"}',
	    counter % 1000)
	return wrk.format("POST", "/v1/orders", {
		["Authorization"] = "Bearer dev-shop-1",
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = prefix .. counter,
	}, body)
end
