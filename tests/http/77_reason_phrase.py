"""Every status line has a reason phrase at the edge, 422 included.

Kore 4.1 writes the status line itself ("HTTP/1.1 %d %s", in
http_response_normal()) with the text of its own http_status_text(), which
has none for 422: "HTTP/1.1 422 " (valid HTTP/1.1, whose reason phrase may
be empty, but unlike every other status the service gives). The module
cannot supply one: Kore calls that function directly inside its
executable, where no symbol of a module takes its place, and offers no
hook on the status line. The edge does: conf/haproxy.cfg sets the 422's
reason ("Unprocessable Content", RFC 9110's name), as make cluster and
docs/deploy.md run it. The bare instance's empty reason is checked too,
so that this test says so when a Kore that names 422 arrives."""

import http.client
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (REQUEST_BOUND, ROOT, TMP, Api, Tap, free_port, new_key)  # noqa: E402
from edge import Edge, self_signed_pem  # noqa: E402

t = Tap()
api = Api(name="api-reason").start()
edge = Edge(os.path.join(ROOT, "conf", "haproxy.cfg"), dict(
    IDEM_PORT=free_port(), IDEM_TLS_PORT=free_port(), IDEM_API_PORT=api.port,
    IDEM_TLS_PEM=self_signed_pem(os.path.join(TMP, "reason.pem")), IDEM_HSTS_MAX_AGE=60,
    IDEM_PUBLIC_URL=f"http://127.0.0.1:{api.port}"), name="edge-reason").start()

ORDER = b'{"customer_id":"c-reason","amount":700,"currency":"RUB"}'
OTHER = b'{"customer_id":"c-reason","amount":701,"currency":"RUB"}'


def status_line(port, method, path, body=None, headers=None):
    """The status and the reason phrase as sent (http.client keeps it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_BOUND)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        r.read()
        return r.status, r.reason
    finally:
        conn.close()


def answers(port):
    """One request of each status the service gives a client here."""
    key = new_key("reason")
    auth = {"Authorization": "Bearer dev-shop-1", "Content-Type": "application/json"}
    return {
        201: status_line(port, "POST", "/v1/orders", ORDER, dict(auth, **{"Idempotency-Key": key})),
        422: status_line(port, "POST", "/v1/orders", OTHER, dict(auth, **{"Idempotency-Key": key})),
        400: status_line(port, "POST", "/v1/orders", b"{", dict(auth, **{"Idempotency-Key": new_key()})),
        401: status_line(port, "POST", "/v1/orders", ORDER, {"Authorization": "Bearer nobody",
                                                              "Content-Type": "application/json",
                                                              "Idempotency-Key": new_key()}),
        404: status_line(port, "GET", "/v1/no-such-route", None, auth),
        415: status_line(port, "POST", "/v1/orders", ORDER, dict(auth, **{
            "Content-Type": "text/plain", "Idempotency-Key": new_key()})),
        200: status_line(port, "GET", "/healthz"),
    }


bare = answers(api.port)
t.eq({s: r[0] for s, r in bare.items()}, {s: s for s in bare}, "the instance gives each status")
t.eq(bare[422][1], "", "a bare instance's 422 has no reason phrase (Kore 4.1's own table "
     "lacks it; when this fails, Kore names it: update docs/limits.md and this test)")
t.ok(all(r[1] for s, r in bare.items() if s != 422),
     "every other status has Kore's reason phrase", repr(bare))

through = answers(edge.port)
t.eq({s: r[0] for s, r in through.items()}, {s: s for s in through},
     "through the edge, each status as the instance gave it")
t.eq(through[422][1], "Unprocessable Content", "the edge names the 422: "
     "'HTTP/1.1 422 Unprocessable Content'")
t.ok(all(r[1] for r in through.values()), "every status line through the edge has a reason "
     "phrase", repr(through))
t.eq({s: r[1] for s, r in through.items() if s != 422},
     {s: r[1] for s, r in bare.items() if s != 422},
     "the others pass the edge as Kore wrote them")

t.ok(edge.stop(), "haproxy stops on SIGTERM")
api.stop()
t.done()
