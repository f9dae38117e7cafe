"""make test-cluster: haproxy as the strict edge (conf/haproxy.cfg), over
raw sockets, on its plain port and on its HTTPS port, and over HTTP/2
with curl. What Kore 4.1's parser would let through (a NUL that cuts a
key or a token, a second key or token past the 23rd header line, a body
on a GET, DELETE or OPTIONS, which Kore took for the next request: a
smuggled POST, at its 4 KiB read and past it) or answer bare (no
Content-Length, a body over the limit, an empty header, a tab, a method
it does not serve or one in lower case, no Host or two, a header name
that starts with "host", an HTTP/2 request without :authority) is
refused before any instance
sees it, with a problem+json body; nothing of it reaches the database. A
client next to a smuggler never gets the smuggler's answer. Over HTTP/2
a refusal reaches curl whole while it still sends its body (it exited
92), and a GET ended by an empty DATA frame is served (haproxy sent it on
chunked, which the service refuses on GET). Every answer carries the edge's X-Request-Id, which the instance's
access log records; the differential run (differential.py) checks it one
to one over generated requests. HTTPS: the chain verifies against the
cluster's CA, HTTP/2 and HTTP/1.1 are offered, HSTS is set on its
answers and not on plain HTTP's."""

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap, sql_value, wait_until  # noqa: E402
import differential  # noqa: E402

PORT = int(os.environ["IDEM_PORT"])
TLS_PORT = int(os.environ["IDEM_TLS_PORT"])
CA = os.environ["IDEM_TEST_TLS_CA"]
PUBLIC = os.environ.get("IDEM_PUBLIC_URL", f"http://127.0.0.1:{PORT}")
BODY = b'{"customer_id":"c-edge","amount":1000,"currency":"RUB"}'
# Bounds on a hang, far above need: a raw connection's reads, one curl
# request, one command (haproxy, openssl).
SOCKET_BOUND = 15
CURL_BOUND = 60
COMMAND_BOUND = 30

t = Tap()


def connect(tls):
    s = socket.create_connection(("127.0.0.1", TLS_PORT if tls else PORT),
                                 timeout=SOCKET_BOUND)
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
    # 19 fields are forwarded, 20 refused (the edge's X-Request-Id counts;
    # Connection, which haproxy consumes, does not).
    for n, status in ((19, 200), (20, 400)):
        st, hd, _, _ = send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                            b"".join(b"X-F-%d: v\r\n" % i for i in range(n - 1)) +
                            b"Connection: close\r\n\r\n", tls)
        t.eq(st, status, f"{via}: a GET of {n} header fields and Connection: {status}")
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
    st, hd, body, _ = send(order(key("cl2"), extra=b"Content-Length: 3\r\n"), tls)
    t.ok(st == 0 and body == b"", f"{via}: two Content-Lengths that differ: closed without"
         " an answer (haproxy 2.6's own page has no HSTS: docs/production.md)",
         f"{st} {hd} {body[:200]!r}")

    # Methods as sent: Kore took "post" for POST, past the edge's POST rules.
    for m in (b"post", b"PUT", b"DELETE", b"TRACE", b"OPTIONS"):
        answer = send(order(key("m" + m.decode())).replace(b"POST ", m + b" ", 1), tls)
        problem(answer, 405, "method-not-allowed", f"{via}: the method {m.decode()}")
    t.eq(answer[1].get("allow"), "GET, POST", f"{via}: with Allow")

    # Empty, tabbed or non-ASCII headers: Kore's bare 400.
    problem(send(order(b"")), 400, "idempotency-key-malformed", f"{via}: an empty key")
    problem(send(order(key("emptyauth"), auth=b""), tls), 401, "unauthorized",
            f"{via}: an empty Authorization")
    problem(send(order(key("empty"), extra=b"X-Note:\r\n"), tls), 400, "invalid-request",
            f"{via}: an empty header")
    problem(send(order(key("tab") + b"\tx"), tls), 400, "invalid-request",
            f"{via}: a tab in Idempotency-Key")
    problem(send(order(key("tab2"), extra=b"X-Note: a\tb\r\n"), tls), 400,
            "invalid-request", f"{via}: a tab in another header")
    problem(send(order(key("utf8"), extra=b"X-Note: caf\xc3\xa9\r\n"), tls), 400,
            "invalid-request", f"{via}: a byte past ASCII in a header")

    # No Host (HTTP/1.1, HTTP/1.0, absolute-form), or two: Kore's bare 400.
    for what, raw in [
            ("HTTP/1.1 without Host", b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"),
            ("HTTP/1.0 without Host", b"GET /healthz HTTP/1.0\r\n\r\n"),
            ("absolute-form without Host",
             b"GET http://127.0.0.1/healthz HTTP/1.1\r\nConnection: close\r\n\r\n"),
            ("an order without Host", order(key("nohost")).replace(b"Host: 127.0.0.1\r\n", b"")),
            # Kore takes the first name starting with "host" for the Host.
            ("a Hostile header before Host", order(key("hostile")).replace(
                b"Host: 127.0.0.1\r\n", b"Hostile: evil\r\nHost: 127.0.0.1\r\n"))]:
        problem(send(raw, tls), 400, "invalid-request", f"{via}: {what}")
    # Two Hosts: haproxy keeps one of two equal ones, and refuses two that
    # differ itself (closed without an answer, as two Content-Lengths).
    st, hd, body, _ = send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n"
                           b"Connection: close\r\n\r\n", tls)
    t.eq(st, 200, f"{via}: two equal Hosts: served (the instance sees one)")
    st, hd, body, _ = send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil\r\n"
                           b"Connection: close\r\n\r\n", tls)
    t.ok(st == 0 and body == b"", f"{via}: two Hosts that differ: closed without an answer",
         f"{st} {hd} {body[:200]!r}")
    st, hd, body, _ = send(b"GET /healthz HTTP/1.1\r\nX-Host: x\r\nHost: 127.0.0.1\r\n"
                           b"Connection: close\r\n\r\n", tls)
    t.eq(st, 200, f"{via}: an X-Host header is only a header: served")

    # Smuggling: a POST in the body of a GET, DELETE or OPTIONS, starting at
    # Kore's 4 KiB read, across it, and past it. The edge refuses the body.
    for m, slug, status in [(b"GET", "invalid-request", 400),
                            (b"DELETE", "method-not-allowed", 405),
                            (b"OPTIONS", "method-not-allowed", 405)]:
        for at in (4096 - 40, 4096, 4096 + 40, 9000):
            inner = order(key(f"smuggled-{m.decode()}-{at}"))
            carrier = (m + b" /v1/bonuses/c-edge HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       b"Authorization: Bearer dev-shop-1\r\nConnection: close\r\n"
                       b"Content-Length: 99999\r\n\r\n")
            pad = at - len(carrier)
            raw = carrier.replace(b"99999", b"%05d" % (pad + len(inner))) + b"z" * pad + inner
            assert raw.index(b"POST /v1/orders") == at
            problem(send(raw, tls), status, slug,
                    f"{via}: a POST smuggled at byte {at} of a {m.decode()}'s body")

    # The edge's request id: on the answer, never the client's own.
    st, hd, _, _ = send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"X-Request-Id: mine\r\nConnection: close\r\n\r\n", tls)
    rid = hd.get("x-request-id", "")
    t.ok(st == 200 and differential.UUID.match(rid),
         f"{via}: the answer carries the edge's X-Request-Id, not the client's", f"{st} {hd}")
    try:
        wait_until(lambda: any(f"request_id={rid}" in line for line in
                               differential.read_new({}, "api*.log")), "its access line")
        seen = True
    except TimeoutError:
        seen = False
    t.ok(seen, f"{via}: the instance's access line records it")

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
        st, hd, _, _ = send(order(key("hsts405")).replace(b"POST ", b"post ", 1), tls)
        t.ok(st == 405 and hd.get("strict-transport-security", "").startswith("max-age="),
             "HTTPS: and on its 405", f"{st} {hd}")
        st, hd, body, _ = send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Bad Name: x\r\n\r\n", tls)
        t.ok(st == 0 and body == b"", "HTTPS: a head haproxy cannot parse is closed without"
             " its HTML page (which had no HSTS)", f"{st} {hd} {body[:200]!r}")

    t.eq(keys_like(f"edge-{run}-"), 1, f"{via}: none of the refused requests left a key")


# HTTP/2 (curl through TLS): each refusal whole, with HSTS, no key.
def h2(args, body=None):
    out = subprocess.run(["curl", "-s", "--http2", "--cacert", CA, "-D", "-",
                          "-w", "\n%{http_version} %{http_code}", "--max-time", "30"] + args +
                         ([f"--data-binary", "@-"] if body is not None else []),
                         input=body or b"", capture_output=True, timeout=CURL_BOUND)
    text = out.stdout.decode(errors="replace")
    head, _, rest = text.partition("\r\n\r\n")
    doc_text, _, tail = rest.rpartition("\n")
    try:
        doc = json.loads(doc_text)
    except ValueError:
        doc = {}
    return out.returncode, tail, head.lower(), doc


run = uuid.uuid4().hex[:8]
URL = f"https://127.0.0.1:{TLS_PORT}"
AUTH = ["-H", "Authorization: Bearer dev-shop-1", "-H", "Content-Type: application/json"]
big = b'{"customer_id":"c-edge","amount":1000,"currency":"RUB","pad":"'
big += b"x" * (65536 - len(big) - 2) + b'"}'
for what, args, body, status, slug in [
        ("a GET with a smuggled POST in its body", AUTH + ["-X", "GET", f"{URL}/v1/bonuses/c"],
         b"z" * 4000 + order(f"edge-{run}-h2smuggled".encode()), 400, "invalid-request"),
        ("a DELETE with a body", AUTH + ["-X", "DELETE", f"{URL}/v1/orders"],
         order(f"edge-{run}-h2delete".encode()), 405, "method-not-allowed"),
        ("a lower-case post", AUTH + ["-X", "post", "-H", f"Idempotency-Key: edge-{run}-h2lc",
                                      f"{URL}/v1/orders"], BODY, 405, "method-not-allowed"),
        ("an empty key", AUTH + ["-H", "Idempotency-Key;", f"{URL}/v1/orders"], BODY, 400,
         "idempotency-key-malformed"),
        ("two tokens, with 64 KiB of body still coming (curl exited 92)",
         AUTH + ["-H", "Authorization: Bearer dev-shop-2",
                 "-H", f"Idempotency-Key: edge-{run}-h2auth", f"{URL}/v1/orders"],
         big, 401, "unauthorized")]:
    rc, tail, head, doc = h2(args, body)
    t.ok(rc == 0 and tail == f"2 {status}" and doc.get("type") == f"{PUBLIC}/problems/{slug}"
         and "content-type: application/problem+json" in head
         and "strict-transport-security: max-age=" in head,
         f"HTTP/2: {what}: {status} {slug} as problem+json, with HSTS",
         f"curl exit {rc}, {tail!r}, {head!r}, {doc}")
t.eq(keys_like(f"edge-{run}-"), 0, "HTTP/2: none of them left a key")



# HTTP/2 frames as a client may send them (curl always sends :authority,
# and ends a GET's stream on its HEADERS).
def h2_frame(kind, flags, stream, payload):
    return (len(payload).to_bytes(3, "big") + bytes([kind, flags]) +
            stream.to_bytes(4, "big") + payload)


def h2_raw(fields, body_frames=()):
    """One request on stream 1: its header fields (HPACK literals), its
    HEADERS ending the stream unless body_frames follow. (status, data)."""
    ctx = ssl.create_default_context(cafile=CA)
    ctx.set_alpn_protocols(["h2"])
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", TLS_PORT), timeout=SOCKET_BOUND),
                        server_hostname="127.0.0.1")
    block = b"".join(b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v
                     for n, v in fields)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0, b"") +
              h2_frame(1, 0x4 | (0 if body_frames else 0x1), 1, block) +
              b"".join(h2_frame(0, flags, 1, data) for flags, data in body_frames))
    out, status, data, ended = b"", 0, b"", False
    try:
        while not ended:
            d = s.recv(65536)
            if not d:
                break
            out += d
            while len(out) >= 9 and len(out) >= 9 + int.from_bytes(out[:3], "big"):
                n = int.from_bytes(out[:3], "big")
                kind, flags = out[3], out[4]
                stream = int.from_bytes(out[5:9], "big") & 0x7fffffff
                payload, out = out[9:9 + n], out[9 + n:]
                if stream != 1:
                    continue
                if kind == 1 and not status:
                    # haproxy sends :status first: indexed (static table),
                    # or a literal of 3 digits.
                    if payload[0] & 0x80:
                        status = {8: 200, 9: 204, 10: 206, 11: 304, 12: 400, 13: 404,
                                  14: 500}.get(payload[0] & 0x7f, -1)
                    elif payload[1] == 3:
                        status = int(payload[2:5])
                elif kind == 0:
                    data += payload
                if kind == 3 or (kind in (0, 1) and flags & 0x1):
                    ended = True
    except (socket.timeout, ssl.SSLError, ConnectionResetError):
        pass
    s.close()
    return status, data


H2_GET = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"),
          (b":path", b"/healthz")]
st, data = h2_raw(H2_GET)
t.ok(st == 200 and b'"status"' in data, "HTTP/2 raw: a GET is served", f"{st} {data[:200]!r}")
st, data = h2_raw(H2_GET, body_frames=[(0x1, b"")])
t.ok(st == 200 and b'"status"' in data, "HTTP/2 raw: a GET ended by an empty DATA frame is"
     " served (it reached the instance chunked, refused)", f"{st} {data[:200]!r}")
# 19 header fields, the most the edge forwards (Host among them; its own
# X-Request-Id is the 20th): the Content-Length it adds to a GET ended by
# an empty DATA frame does not count against them.
FIELDS = H2_GET + [(b"x-f-%d" % i, b"v") for i in range(18)]
st, data = h2_raw(FIELDS, body_frames=[(0x1, b"")])
t.ok(st == 200 and b'"status"' in data, "HTTP/2 raw: a GET of 19 header fields ended by an"
     " empty DATA frame is served", f"{st} {data[:200]!r}")
st, data = h2_raw(FIELDS + [(b"x-f-18", b"v")], body_frames=[(0x1, b"")])
t.ok(st == 400 and f"{PUBLIC}/problems/invalid-request".encode() in data,
     "HTTP/2 raw: one of 20 is refused", f"{st} {data[:200]!r}")
st, data = h2_raw([f for f in H2_GET if f[0] != b":authority"])
t.ok(st == 400 and f"{PUBLIC}/problems/invalid-request".encode() in data,
     "HTTP/2 raw: a GET without :authority (nor Host): 400 invalid-request as problem+json",
     f"{st} {data[:300]!r}")

# Desync: while a smuggler sends POSTs in GET bodies on its own keep-alive
# connection, a client next to it reads its own balance over and over; it
# gets its own answers only, never the smuggler's.
victim = f"c-victim-{run}"
stop = threading.Event()
smuggler_answers = []


def smuggle():
    n = 0
    while not stop.is_set():
        n += 1
        inner = (b"POST /v1/bonuses HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Authorization: Bearer dev-shop-2\r\nIdempotency-Key: edge-" +
                 run.encode() + b"-desync-%d\r\nContent-Type: application/json\r\n" % n)
        body = b'{"customer_id":"c-smuggler","amount":100}'
        inner += b"Content-Length: %d\r\n\r\n" % len(body) + body
        raw = (b"GET /v1/bonuses/c-smuggler HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Authorization: Bearer dev-shop-2\r\nConnection: close\r\n"
               b"Content-Length: %d\r\n\r\n" % (4000 + len(inner)) + b"z" * 4000 + inner)
        smuggler_answers.append(send(raw)[0])


victim_answers = []


def read_own():
    s = connect(False)
    f = s.makefile("rb")
    try:
        for _ in range(60):
            s.sendall(f"GET /v1/bonuses/{victim} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Authorization: Bearer dev-shop-1\r\n\r\n".encode())
            status = int(f.readline().split()[1])
            length = 0
            while True:
                line = f.readline()
                if line in (b"\r\n", b""):
                    break
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            victim_answers.append((status, f.read(length)))
    finally:
        s.close()


th = [threading.Thread(target=smuggle) for _ in range(2)]
for x in th:
    x.start()
read_own()
stop.set()
for x in th:
    x.join()
own = [json.loads(b).get("customer_id") == victim and st == 200 for st, b in victim_answers]
t.ok(len(own) == 60 and all(own), "desync: the client next to a smuggler gets its own"
     " answers only (60 of 60)", repr([a for a, ok in zip(victim_answers, own) if not ok][:3]))
t.ok(smuggler_answers and set(smuggler_answers) == {400},
     f"desync: each of the smuggler's {len(smuggler_answers)} requests refused at the edge",
     repr(set(smuggler_answers)))
t.eq(keys_like(f"edge-{run}-desync-"), 0, "desync: none of the smuggled requests ran")

# The differential run: generated requests through the edge, the edge's
# log against the instances' access logs and the keys.
seed = int(os.environ.get("IDEM_EDGE_SEED", str(int(time.time()))))
cases = int(os.environ.get("IDEM_EDGE_CASES", "1500"))
fails, stats = differential.run(cases, seed, extra=differential.REGRESSIONS)
t.ok(not fails, f"differential, seed {seed}: {stats['cases']} cases, {stats['forwarded']}"
     f" forwarded, each handled once under the edge's id, no key the edge refused",
     "\n".join(fails[:20]))

# HTTPS itself.
out = subprocess.run(["curl", "-s", "--cacert", CA, "-o", "/dev/null", "-D", "-",
                      "-w", "%{http_version}", "--http2",
                      f"https://127.0.0.1:{TLS_PORT}/healthz"],
                     capture_output=True, text=True, timeout=COMMAND_BOUND)
t.ok(out.returncode == 0 and out.stdout.startswith("HTTP/2 200"),
     "curl --cacert verifies the chain and speaks HTTP/2", out.stdout + out.stderr)
t.ok("strict-transport-security: max-age=" in out.stdout.lower(), "HSTS is set over HTTPS")
out = subprocess.run(["curl", "-s", "--cacert", CA, "-o", "/dev/null", "-w",
                      "%{http_version}", "--http1.1",
                      f"https://localhost:{TLS_PORT}/healthz"],
                     capture_output=True, text=True, timeout=COMMAND_BOUND)
t.eq(out.stdout, "1.1", "HTTP/1.1 is offered too, and the name localhost verifies")
out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}",
                      f"https://127.0.0.1:{TLS_PORT}/healthz"],
                     capture_output=True, text=True, timeout=COMMAND_BOUND)
t.eq(out.returncode, 60, "without the CA the chain does not verify (curl's exit 60)")
out = subprocess.run(["curl", "-s", "-o", "/dev/null", "-D", "-",
                      f"http://127.0.0.1:{PORT}/healthz"],
                     capture_output=True, text=True, timeout=COMMAND_BOUND)
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
