-- wrk: POST /v1/payments with a fresh Idempotency-Key on every request.
local threads = 0

function setup(thread)
	threads = threads + 1
	thread:set("tid", threads)
end

function init(args)
	prefix = string.format("pay-%d-%d-", os.time(), tid)
	counter = 0
end

function request()
	counter = counter + 1
	local body = string.format(
	    '{"amount":%d,"currency":"RUB","recipient":"acc-%d"}',
	    counter % 100000 + 1, counter % 1000)
	return wrk.format("POST", "/v1/payments", {
		["Authorization"] = "Bearer dev-shop-1",
		["Content-Type"] = "application/json",
		["Idempotency-Key"] = prefix .. counter,
	}, body)
end
