"""Request smuggling, closed in the service itself (src/core/framing.c),
on a bare instance, over raw sockets. Kore 4.1 reads no body on GET,
HEAD, DELETE and OPTIONS: once it has answered one, it parsed what
followed on the connection as the next request, one that a proxy in
front never saw. Here a good POST /v1/orders rides in such a body, past
Kore's first 4 KiB read or in a later packet, after the answer: it must
never run (no key row, no order) and never be answered; the carrier gets
a problem and its connection is closed. A Transfer-Encoding anywhere and
a second Content-Length are refused the same way; a Content-Length of 0
on a GET is served and the connection kept."""

import json
import os
import signal
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key, sql_value, quote, wait_until  # noqa: E402

t = Tap()
api = Api(name="smuggle").start()
BODY = b'{"customer_id":"c-smuggle","amount":1000,"currency":"RUB"}'
# A bound on a hang only: every answer here comes at once.
HANG = 30


def order(key):
    return (b"POST /v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer dev-shop-1\r\nIdempotency-Key: " + key.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(BODY) + BODY)


def head(method, path, length=None, extra=b""):
    raw = method + b" " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra
    if length is not None:
        raw += b"Content-Length: %d\r\n" % length
    return raw + b"\r\n"


def answers(data, bodiless=False):
    """The answers in data, each (status, headers, body), and what is left
    (bodiless: answers to a HEAD, whose Content-Length has no body)."""
    out = []
    while data:
        h, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = h.split(b"\r\n")
        parts = lines[0].split()
        hd = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            hd[k.strip().lower().decode()] = v.strip().decode(errors="replace")
        n = 0 if bodiless else int(hd.get("content-length", "0"))
        out.append((int(parts[1]) if len(parts) > 1 else 0, hd, rest[:n]))
        data = rest[n:]
    return out, data


def read_to_close(s):
    """Everything until the server closes (or resets) the connection."""
    data = b""
    while True:
        try:
            d = s.recv(65536)
        except ConnectionResetError:
            return data, True
        except socket.timeout:
            return data, False
        if not d:
            return data, True
        data += d


def read_one(s, bodiless=False):
    """One whole answer (head and its Content-Length of body)."""
    data = b""
    while True:
        got, _ = answers(data, bodiless)
        if got:
            return got[0]
        d = s.recv(65536)
        if not d:
            return None
        data += d


def key_taken(key):
    return int(sql_value("select count(*) from idempotency_keys where idem_key = " +
                         quote(key)))


def refused_and_closed(got, closed, what, bodiless=False):
    ans, rest = answers(got, bodiless)
    first = ans[0] if ans else (0, {}, b"")
    try:
        doc = json.loads(first[2])
    except ValueError:
        doc = {}
    t.ok(len(ans) == 1 and first[0] == 400 and
         first[1].get("content-type") == "application/problem+json" and
         (bodiless or doc.get("type", "").endswith("/problems/invalid-request")) and
         first[1].get("connection") == "close",
         f"{what}: one answer, a 400 invalid-request problem, Connection: close",
         repr(got[:600]))
    t.ok(closed and rest == b"", f"{what}: the connection closed, nothing more said",
         f"closed={closed} rest={rest[:200]!r}")


targets = [(b"GET", b"/healthz"), (b"GET", b"/v1/orders?customer_id=c-smuggle"),
           (b"DELETE", b"/v1/orders"), (b"OPTIONS", b"/v1/payments/x"),
           (b"HEAD", b"/v1/bonuses/c-smuggle"), (b"GET", b"/no-such-page")]

# 1. In one write, the smuggled request starting right at byte 4,096 of
# the connection: Kore's first read takes 4 KiB (the head and the padding,
# dropped), its next read began at the smuggled request.
for method, path in targets:
    for head_size in ("short", "long"):
        key = new_key("smuggle-4k")
        extra = b"" if head_size == "short" else b"X-Pad: " + b"p" * 3000 + b"\r\n"
        smuggled = order(key)
        # The head's own length depends on the Content-Length's digits.
        pad = 4096 - len(head(method, path, 1000 + len(smuggled), extra))
        raw = head(method, path, pad + len(smuggled), extra) + b"z" * pad + smuggled
        assert raw.index(b"POST /v1/orders") == 4096
        with socket.create_connection(("127.0.0.1", api.port), timeout=HANG) as s:
            s.sendall(raw)
            got, closed = read_to_close(s)
        what = f"{method.decode()} {path.decode()} ({head_size} head), a POST at byte 4,096"
        refused_and_closed(got, closed, what, method == b"HEAD")
        t.eq(key_taken(key), 0, f"{what}: the smuggled order never ran")

# 1b. In one write, the smuggled request right after the carrier's head,
# inside Kore's first read: bytes already in its buffer when it answers.
for method, path in targets:
    key = new_key("smuggle-inread")
    smuggled = order(key)
    raw = head(method, path, len(smuggled)) + smuggled
    assert len(raw) < 4096
    with socket.create_connection(("127.0.0.1", api.port), timeout=HANG) as s:
        s.sendall(raw)
        got, closed = read_to_close(s)
    what = f"{method.decode()} {path.decode()}, a POST in the same read as its head"
    refused_and_closed(got, closed, what, method == b"HEAD")
    t.eq(key_taken(key), 0, f"{what}: the smuggled order never ran")

# 2. The body in a later packet, sent once the carrier's answer is read.
for method, path in targets[:5]:
    key = new_key("smuggle-late")
    smuggled = order(key)
    with socket.create_connection(("127.0.0.1", api.port), timeout=HANG) as s:
        s.sendall(head(method, path, len(smuggled)))
        first = read_one(s, method == b"HEAD")
        try:
            s.sendall(smuggled)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got, closed = read_to_close(s)
    what = f"{method.decode()} {path.decode()}, the POST sent after the answer"
    t.ok(first is not None and first[0] == 400 and
         first[1].get("connection") == "close",
         f"{what}: the carrier refused, Connection: close", repr(first))
    t.ok(closed and answers(got)[0] == [], f"{what}: the POST is never answered",
         repr(got[:300]))
    t.eq(key_taken(key), 0, f"{what}: the smuggled order never ran")

# 3. Framing Kore does not read, on any method: refused, closed.
for what, raw in [
        ("a GET with Transfer-Encoding: chunked",
         head(b"GET", b"/healthz", extra=b"Transfer-Encoding: chunked\r\n") +
         b"5\r\nhello\r\n0\r\n\r\n"),
        ("a POST with Transfer-Encoding and a Content-Length",
         order(new_key("smuggle-te")).replace(b"Content-Length",
                                              b"Transfer-Encoding: chunked\r\nContent-Length")),
        # Two that agree (Kore reads the first; with a shorter first one
        # it waits for a body that never comes, then its 408 closes).
        ("a POST with two Content-Lengths",
         order(new_key("smuggle-cl2")).replace(
             b"Content-Length", b"Content-Length: %d\r\nContent-Length" % len(BODY))),
        ("a DELETE with Content-Length 5", head(b"DELETE", b"/v1/orders", 5) + b"hello")]:
    with socket.create_connection(("127.0.0.1", api.port), timeout=HANG) as s:
        s.sendall(raw)
        got, closed = read_to_close(s)
    refused_and_closed(got, closed, what)
t.eq(int(sql_value("select count(*) from idempotency_keys where idem_key like 'smuggle-%'")),
     0, "no key taken by any of them")

# 4. What a client rightly sends is served as before: a Content-Length of
# 0 on a GET, the connection kept for the next request.
with socket.create_connection(("127.0.0.1", api.port), timeout=HANG) as s:
    s.sendall(head(b"GET", b"/healthz", 0))
    first = read_one(s)
    key = new_key("after-zero")
    s.sendall(order(key))
    second = read_one(s)
t.ok(first is not None and first[0] == 200 and first[1].get("connection") != "close",
     "a GET with Content-Length: 0 is served, the connection kept", repr(first))
t.ok(second is not None and second[0] == 201 and key_taken(key) == 1,
     "and the next request on it is served", repr(second))

# 5. After a reload (SIGHUP: the module loaded again, Kore looks the
# check up again by its name), the same: refused, closed, never run.
os.kill(api.proc.pid, signal.SIGHUP)
wait_until(lambda: api.read_log().count("reloaded '") >= 2, "both workers to reload",
           timeout=HANG)
key = new_key("smuggle-reload")
smuggled = order(key)
pad = 4096 - len(head(b"GET", b"/healthz", 1000 + len(smuggled)))
with socket.create_connection(("127.0.0.1", api.port), timeout=HANG) as s:
    s.sendall(head(b"GET", b"/healthz", pad + len(smuggled)) + b"z" * pad + smuggled)
    got, closed = read_to_close(s)
refused_and_closed(got, closed, "after a reload, a GET /healthz carrying a POST")
t.eq(key_taken(key), 0, "after a reload: the smuggled order never ran")

api.stop()

# 6. A route given an authentication block of its own in kore.conf would
# run that block instead of the check (Kore runs one per route): the
# service refuses to start, and says why.
guarded = Api(name="smuggle-own-auth", conf_extra=[
    "validator v_own function framing_check",
    "authentication own {", "\tauthentication_type request",
    "\tauthentication_validator v_own", "}",
    "domain 127.0.0.2 {", "\tattach api", "\troute /own healthz own", "}"])
try:
    guarded.start()
    started = True
except RuntimeError:
    started = False
guarded.stop()
t.ok(not started and "has the authentication block 'own' of its own" in guarded.read_log(),
     "a route with its own authentication block: the service refuses to start, naming it",
     guarded.read_log()[-600:])
t.done()
