"""make test-cluster: haproxy as the strict edge (conf/haproxy.cfg), over
raw sockets, on its plain port and on its HTTPS port. What Kore 4.1's
parser would let through (a NUL that cuts a key or a token, a second key
or token past the 23rd header line) or answer bare (no Content-Length, a
body over the limit) is refused before any instance sees it, with a
problem+json body; nothing of it reaches the database. HTTPS: the chain
verifies against the cluster's CA, HTTP/2 and HTTP/1.1 are offered, HSTS
is set on its answers and not on plain HTTP's."""

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap, sql_value  # noqa: E402

PORT = int(os.environ["IDEM_PORT"])
TLS_PORT = int(os.environ["IDEM_TLS_PORT"])
CA = os.environ["IDEM_TEST_TLS_CA"]
PUBLIC = os.environ.get("IDEM_PUBLIC_URL", f"http://127.0.0.1:{PORT}")
BODY = b'{"customer_id":"c-edge","amount":1000,"currency":"RUB"}'

t = Tap()


def connect(tls):
    s = socket.create_connection(("127.0.0.1", TLS_PORT if tls else PORT), timeout=15)
    if tls:
        ctx = ssl.create_default_context(cafile=CA)
        ctx.set_alpn_protocols(["http/1.1"])
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    return s


def send(raw, tls=False):
    """raw on a new connection; (status, headers, body, seconds) of the
    answer read to the close."""
    started = time.monotonic()
    s = connect(tls)
    s.sendall(raw)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except (socket.timeout, ssl.SSLError, ConnectionResetError):
        pass
    s.close()
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode(errors="replace")
    # The first answer only: what follows it is another one's.
    if headers.get("content-length", "").isdigit():
        body = body[:int(headers["content-length"])]
    return status, headers, body, time.monotonic() - started


def order(key, extra=b"", auth=b"Bearer dev-shop-1", body=BODY, length=True):
    raw = (b"POST /v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + auth +
           b"\r\nIdempotency-Key: " + key + b"\r\nContent-Type: application/json\r\n" +
           extra)
    if length:
        raw += b"Content-Length: " + str(len(body)).encode() + b"\r\n"
    return raw + b"Connection: close\r\n\r\n" + body


def keys_like(prefix):
    return int(sql_value("select count(*) from idempotency_keys"
                         f" where idem_key like '{prefix}%'"))


def problem(answer, status, slug, what):
    st, hd, body, _ = answer
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    t.ok(st == status and hd.get("content-type") == "application/problem+json" and
         doc.get("type") == f"{PUBLIC}/problems/{slug}" and doc.get("status") == status,
         f"{what}: {status} {slug} as problem+json", f"{st} {hd} {body[:300]!r}")


for tls in (False, True):
    via = "HTTPS" if tls else "HTTP"
    run = uuid.uuid4().hex[:8]

    def key(n):
        return f"edge-{run}-{n}".encode()

    # The request as it should be: served.
    st, hd, body, _ = send(order(key("ok")), tls)
    t.eq(st, 201, f"{via}: a well-formed order is served")

    # A NUL in the key: Kore would take the key up to it.
    problem(send(order(key("nul") + b"\x00tail"), tls), 400, "invalid-request",
            f"{via}: a NUL in Idempotency-Key")
    problem(send(order(key("nul2"), auth=b"Bearer dev-shop-1\x00junk"), tls), 400,
            "invalid-request", f"{via}: a NUL in Authorization")
    problem(send(order(key("ctl"), extra=b"X-Note: a\x01b\r\n"), tls), 400,
            "invalid-request", f"{via}: a control byte in another header")

    # A second key or token, and one past the 23rd line where Kore stops.
    problem(send(order(key("two"), extra=b"Idempotency-Key: " + key("other") + b"\r\n"),
                 tls), 400, "idempotency-key-malformed", f"{via}: two Idempotency-Keys")
    answer = send(order(key("twoauth"), extra=b"Authorization: Bearer dev-shop-2\r\n"), tls)
    problem(answer, 401, "unauthorized", f"{via}: two Authorizations")
    t.eq(answer[1].get("www-authenticate"), "Bearer", f"{via}: with WWW-Authenticate")
    filler = b"".join(b"X-Filler-%d: x\r\n" % i for i in range(22))
    problem(send(order(key("late"), extra=filler + b"Idempotency-Key: " + key("late2") +
                       b"\r\n"), tls), 400, "invalid-request",
            f"{via}: 29 header fields (a second key past Kore's 23rd line among them)")
    problem(send(order(key("long"), extra=b"X-Long: " + b"x" * 3100 + b"\r\n"), tls),
            400, "invalid-request", f"{via}: 3,100 bytes of headers in 7 fields")
    problem(send(order(key("target")).replace(b"POST /v1/orders ",
                                              b"POST /v1/orders?" + b"p" * 1100 + b" "),
                 tls), 400, "invalid-request", f"{via}: a target of 1,100 bytes")

    # Framing: no Content-Length, chunked, over the limit, two that differ.
    problem(send(order(key("nolen"), length=False, body=b""), tls), 411,
            "invalid-request", f"{via}: a POST without Content-Length")
    problem(send(order(key("chunked"), extra=b"Transfer-Encoding: chunked\r\n",
                       length=False, body=b"3\r\nabc\r\n0\r\n\r\n"), tls), 400,
            "invalid-request", f"{via}: a chunked body")
    problem(send(order(key("big"), extra=b"Content-Length: 70000\r\n", length=False,
                       body=b""), tls), 413, "body-too-large",
            f"{via}: a Content-Length over 64 KiB")
    st, _, _, _ = send(order(key("cl2"), extra=b"Content-Length: 3\r\n"), tls)
    t.eq(st, 400, f"{via}: two Content-Lengths that differ are refused"
         " (haproxy 2.6's own page: docs/production.md)")

    # A Content-Length shorter than the body: the request is the declared
    # bytes, answered at once (Kore alone waited 60 s for the rest).
    raw = order(key("short"))
    raw = raw.replace(b"Content-Length: %d" % len(BODY), b"Content-Length: 10")
    answer = send(raw, tls)
    problem(answer, 400, "invalid-json",
            f"{via}: a Content-Length shorter than the body: the declared bytes,"
            " the service's own 400")
    t.ok(answer[3] < 5, f"{via}: answered at once", f"after {answer[3]:.1f} s")

    if tls:
        st, hd, _, _ = send(order(key("hsts"), extra=b"Idempotency-Key: x\r\n"), tls)
        t.ok(st == 400 and hd.get("strict-transport-security", "").startswith("max-age="),
             "HTTPS: HSTS on the edge's own refusals too", f"{st} {hd}")

    t.eq(keys_like(f"edge-{run}-"), 1, f"{via}: none of the refused requests left a key")

# HTTPS itself.
out = subprocess.run(["curl", "-s", "--cacert", CA, "-o", "/dev/null", "-D", "-",
                      "-w", "%{http_version}", "--http2",
                      f"https://127.0.0.1:{TLS_PORT}/healthz"],
                     capture_output=True, text=True, timeout=30)
t.ok(out.returncode == 0 and out.stdout.startswith("HTTP/2 200"),
     "curl --cacert verifies the chain and speaks HTTP/2", out.stdout + out.stderr)
t.ok("strict-transport-security: max-age=" in out.stdout.lower(), "HSTS is set over HTTPS")
out = subprocess.run(["curl", "-s", "--cacert", CA, "-o", "/dev/null", "-w",
                      "%{http_version}", "--http1.1",
                      f"https://localhost:{TLS_PORT}/healthz"],
                     capture_output=True, text=True, timeout=30)
t.eq(out.stdout, "1.1", "HTTP/1.1 is offered too, and the name localhost verifies")
out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                      f"https://127.0.0.1:{TLS_PORT}/healthz"],
                     capture_output=True, text=True, timeout=30)
t.eq(out.returncode, 60, "without the CA the chain does not verify (curl's exit 60)")
out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-",
                      f"http://127.0.0.1:{PORT}/healthz"],
                     capture_output=True, text=True, timeout=30)
t.ok(out.stdout.startswith("HTTP/1.1 200") and
     "strict-transport-security" not in out.stdout.lower(),
     "plain HTTP answers, without HSTS", out.stdout)

# The shipped single-instance configuration is valid as it is.
env = dict(os.environ, IDEM_PORT="1", IDEM_TLS_PORT="2", IDEM_API_PORT="3",
           IDEM_HSTS_MAX_AGE="31536000",
           IDEM_TLS_PEM=os.path.join(os.path.dirname(CA), "server.pem"))
check = subprocess.run(["haproxy", "-c", "-q", "-f",
                        os.path.join(os.path.dirname(__file__), "..", "..", "conf",
                                     "haproxy.cfg")],
                       env=env, capture_output=True, text=True)
t.ok(check.returncode == 0, "conf/haproxy.cfg for a single instance is valid",
     check.stdout + check.stderr)
t.done()
