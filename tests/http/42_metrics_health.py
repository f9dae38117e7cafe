"""GET /metrics reports requests by route and outcome, a latency histogram
and the job counters, summed over all workers (shared memory that outlives
a killed worker); GET /healthz answers without a token.

The counted requests go over one connection, so one worker serves them all;
that worker is then killed, and the counters are read from the others:
counters of each worker's own would read 0 there."""

import http.client
import json
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (REQUEST_BOUND, TOKENS, Api, Tap, check_openapi, metric, new_key,  # noqa: E402
                     request, wait_until)

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

conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=REQUEST_BOUND)
conn.connect()


local = conn.sock.getsockname()[1]


def post_here(body, key, token=TOKENS["shop-1"]):
    """A POST /v1/orders on the one connection (http.client would open
    another, silently, if the server closed it: that is checked)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    conn.request("POST", "/v1/orders", body=json.dumps(body).encode(), headers=headers)
    assert conn.sock is not None and conn.sock.getsockname()[1] == local, \
        "the connection was closed and opened again"
    resp = conn.getresponse()
    data = resp.read()
    check_openapi("POST", "/v1/orders", resp.status,
                  {k.lower(): v for k, v in resp.getheaders()}, data)
    return resp.status


order = {"customer_id": "c-metrics", "amount": 1000, "currency": "RUB"}
keys = [new_key() for _ in range(3)]
statuses = [post_here(order, k) for k in keys]
statuses += [post_here(order, keys[0]), post_here(order, keys[1]),
             post_here(dict(order, amount=5), keys[2]),
             post_here({"customer_id": "c-metrics"}, new_key()),
             post_here(order, None), post_here(order, new_key(), token="nope")]
t.eq(statuses, [201, 201, 201, 201, 201, 422, 400, 400, 401],
     "nine requests over one connection")

# The worker that holds the connection's other end served all nine: the
# socket of /proc/net/tcp from the API's port to ours, among its fds.
def holder(client_port):
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if (int(cols[1].split(":")[1], 16), int(cols[2].split(":")[1], 16)) == \
                    (api.port, client_port):
                inode = cols[9]
    pids = []
    for pid in api.workers():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    pids.append(pid)
            except OSError:
                pass
    return pids


served_by = holder(local)
t.ok(len(served_by) == 1, "one worker of the API holds the connection", served_by)
conn.close()

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

# The worker that served them, killed: Kore starts another. The totals
# live in memory the parent shares with every worker, so the others, and
# the new one, read them.
victim = served_by[0] if served_by else api.workers()[0]
os.kill(victim, signal.SIGKILL)
wait_until(lambda: len(api.workers()) == 2 and victim not in api.workers(),
           "kore to restart the killed worker")
t.eq({o: requests_of(o) for o in expected}, expected,
     "the counters survive the worker that served every counted request")
for _ in range(10):
    api.post("/v1/orders", order, key=new_key())
t.eq(requests_of("created"), 13, "and keep adding up over all workers")

h = request(api.port, "GET", "/healthz")
t.ok(h.status == 200 and h.json()["status"] == "ok", "GET /healthz: 200 without a token", h)

api.stop()
t.done()
