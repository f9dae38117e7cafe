"""GET /metrics reports requests by route and outcome, a latency histogram
and the job counters, summed over all workers (shared memory that outlives
a killed worker); GET /healthz answers without a token."""

import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, metric, new_key, request, wait_until  # noqa: E402

t = Tap()
api = Api().start()
ROUTE = 'route="POST /v1/orders"'


def requests_of(outcome, route=ROUTE):
    return metric(api.port, "idem_requests_total", f'{route},outcome="{outcome}"')


r = request(api.port, "GET", "/metrics")
t.ok(r.status == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4"),
     "GET /metrics needs no token and speaks the Prometheus text format", r.headers)
for name in ("idem_requests_total", "idem_request_duration_seconds",
             "idem_lease_takeovers_total", "idem_payments_recovered_total",
             "idem_cleanup_deleted_keys_total", "idem_database_errors_total",
             "idem_lease_fenced_total"):
    t.ok(f"# TYPE {name} " in r.body.decode(), f"{name} is exported")

order = {"customer_id": "c-metrics", "amount": 1000, "currency": "RUB"}
keys = [new_key() for _ in range(3)]
for k in keys:
    api.post("/v1/orders", order, key=k)
api.post("/v1/orders", order, key=keys[0])
api.post("/v1/orders", order, key=keys[1])
api.post("/v1/orders", dict(order, amount=5), key=keys[2])
api.post("/v1/orders", {"customer_id": "c-metrics"}, key=new_key())
api.post("/v1/orders", order, key=None)
api.post("/v1/orders", order, key=new_key(), token="nope")

expected = {"created": 3, "replayed": 2, "mismatch_422": 1, "invalid_400": 2,
            "unauthorized_401": 1, "in_flight_409": 0, "provider_error": 0, "db_error": 0}
t.eq({o: requests_of(o) for o in expected}, expected,
     "POST /v1/orders: requests counted by outcome")
t.eq(metric(api.port, "idem_request_duration_seconds_count", ROUTE), 9,
     "the latency histogram counts every request of the route")
t.eq(metric(api.port, "idem_request_duration_seconds_bucket", ROUTE + ',le="+Inf"'), 9,
     "its +Inf bucket too")

api.get("/v1/bonuses/c-metrics")
t.eq(requests_of("ok", 'route="GET /v1/bonuses/{customer_id}"'), 1, "reads count as ok")

# A worker killed and restarted by Kore keeps the totals: they live in
# memory the parent shares with every worker.
victim = api.workers()[0]
os.kill(victim, signal.SIGKILL)
wait_until(lambda: len(api.workers()) == 2 and victim not in api.workers(),
           "kore to restart the killed worker")
t.eq(requests_of("created"), 3, "the counters survive a killed worker")
for _ in range(10):
    api.post("/v1/orders", order, key=new_key())
t.eq(requests_of("created"), 13, "and keep adding up over all workers")

h = request(api.port, "GET", "/healthz")
t.ok(h.status == 200 and h.json()["status"] == "ok", "GET /healthz: 200 without a token", h)

api.stop()
t.done()
