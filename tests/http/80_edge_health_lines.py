"""What docs/operations.md says of an instance behind the edge
(conf/haproxy.cfg): the edge's health check, GET /healthz every second
straight to the instance, writes an access line a second with no request
id, and the documented filter (grep -v ' path=/healthz .* request_id=-$')
leaves them out and keeps a /healthz that came through the edge; every
answer of the service carries Idem-Version, the edge's own refusals do
not (The release)."""

import http.client
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, REQUEST_BOUND, ROOT, TMP, Api, Tap, free_port,  # noqa: E402
                     wait_until)
from edge import Edge, self_signed_pem  # noqa: E402

t = Tap()
FILTER = r" path=/healthz .* request_id=-$"
api = Api(name="api-health-lines").start()
edge = Edge(os.path.join(ROOT, "conf", "haproxy.cfg"), dict(
    IDEM_PORT=free_port(), IDEM_TLS_PORT=free_port(), IDEM_API_PORT=api.port,
    IDEM_TLS_PEM=self_signed_pem(os.path.join(TMP, "health-lines.pem")), IDEM_HSTS_MAX_AGE=60,
    IDEM_PUBLIC_URL=f"http://127.0.0.1:{api.port}"), name="edge-health-lines").start()


def access_lines():
    return [l for l in api.read_log().splitlines() if " access " in l]


def checks():
    return [l for l in access_lines() if re.search(FILTER, l)]


def ask(method, path):
    conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=REQUEST_BOUND)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        r.read()
        return r
    finally:
        conn.close()


# The edge's checks come a second apart: three of them, whatever the
# machine's speed (JOB_BOUND: a bound on a hang, far above the 3 s they take).
wait_until(lambda: len(checks()) >= 3, "three of the edge's health checks", timeout=JOB_BOUND)
line = checks()[0]
t.ok("method=GET" in line and "status=200" in line and "outcome=ok" in line and
     line.endswith("request_id=-"),
     "the edge's health check: an access line of GET /healthz, without a request id", line)

through = ask("GET", "/healthz")
t.eq(through.status, 200, "a /healthz through the edge")
wait_until(lambda: any(" path=/healthz " in l and "request_id=-" not in l
                       for l in access_lines()), "the line of the /healthz sent through the edge")
kept = subprocess.run(["grep", "-v", FILTER], input="\n".join(access_lines()) + "\n",
                      capture_output=True, text=True).stdout.splitlines()
t.ok(not any(re.search(FILTER, l) for l in kept) and
     any(" path=/healthz " in l and "request_id=" in l and "request_id=-" not in l
         for l in kept),
     "the documented filter leaves the checks out and keeps the /healthz that came "
     "through the edge", "\n".join(kept[-5:]))

t.ok(through.getheader("Idem-Version"), "an answer of the service carries Idem-Version")
refused = ask("PUT", "/v1/orders")
t.ok(refused.status == 405 and refused.getheader("Idem-Version") is None,
     "the edge's own refusal (405 of a PUT) does not",
     f"{refused.status} {refused.getheaders()}")

edge.stop()
api.stop()
t.done()
