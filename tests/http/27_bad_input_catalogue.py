"""The catalogue of bad inputs: a table of malformed and hostile requests,
generated from the contract's rules, each sent as raw bytes over its own
socket (http.client refuses most of them), each with the answer the
docs/behaviour.md documents: a problem of a named type, or Kore's own bare answer
where docs/limits.md says Kore answers before the service sees the request.

The table crosses the write routes with every header trick (key, token,
content type), every body trick (truncated, nested 10,000 deep, huge
numbers, 1e400, -0, duplicate members, lone surrogates, overlong UTF-8,
NUL, other encodings) and every field with every type confusion and its
limit +1; the exact limits themselves are rows too, answered 201 with
exactly their one operation. Then methods and paths, the framing of the
request (Host, header lines, Content-Length, Transfer-Encoding, the 4 KiB
head), slow clients (Kore's http_header_timeout and http_body_timeout,
set to 2 s for this instance), pipelined requests (Kore 4.1 does not
pipeline: see docs/limits.md), and a client that disconnects at every step
of a payment.

After every row: its answer, and that it left nothing, counted in every
business table, in idempotency_keys (and the row's own key) and at the
provider (provider.requests, and the row's derived key). At the end: no
worker died, and the result table is printed to stderr (copied into the
docs/behaviour.md, "Bad inputs")."""

import json
import os
import re
import socket
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import openapi  # noqa: E402
from harness import (ROOT, Api, Provider, PsqlSession, Tap, key_row, new_key, post,  # noqa: E402
                     provider_calls, quote, wait_server_closed, wait_until)

t = Tap()
HEADER_TIMEOUT = BODY_TIMEOUT = 2
CONNS = 4
LEASE, TIMEOUT_MS = 3, 2500
MAX = 2 ** 53 - 1
TABLES = ["idempotency_keys", "orders", "bonus_ledger", "bonus_accounts",
          "bonus_transfers", "payments", "refunds", "provider.requests"]

provider = Provider(IDEM_PROVIDER_LATENCY_MS=0).start()
env = {"IDEM_PROVIDER_URL": provider.url, "IDEM_LEASE_SECONDS": LEASE,
       "IDEM_PROVIDER_TIMEOUT_MS": TIMEOUT_MS}
api = Api(**env)
# Kore's own timers, short for this instance: the harness wrote its conf
# from kore.conf, which keeps the production values.
with open(api.conf) as f:
    conf = f.read()
# Its workers take CONNS connections each at most, so that connections
# held at once are spread over both workers (section 8).
for name, value in [("http_header_timeout", HEADER_TIMEOUT),
                    ("http_body_timeout", BODY_TIMEOUT),
                    ("worker_max_connections", CONNS)]:
    conf = re.sub(rf"^{name} .*\n", "", conf, flags=re.M) + f"{name} {value}\n"
with open(api.conf, "w") as f:
    f.write(conf)
api.start()
workers = sorted(api.workers())
db = PsqlSession()
# Every table of the service's schema, a new operation's too, and the
# provider's requests: what a row leaves behind is counted in each.
TABLES += [tb for tb in db.run(
    "select table_name from information_schema.tables where table_schema ="
    " 'public' and table_type = 'BASE TABLE' order by 1;") if tb and tb not in TABLES]


def b(x):
    return x if isinstance(x, bytes) else str(x).encode()


def fresh(prefix="c"):
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- the world the rows run in ------------------------------------------------

r = post(api.port, "/v1/bonuses", {"customer_id": "c-rich", "points": 10 ** 9,
                                   "reason": "setup"}, key=new_key("setup"))
assert r.status == 201, r
paid = {}
for client in ("shop-1", "shop-2"):
    r = post(api.port, "/v1/payments", {"amount": 100000, "currency": "RUB",
                                        "recipient": "acc-setup"},
             key=new_key("setup"), client=client)
    assert r.status == 201, r
    paid[client] = r.json()["payment_id"]


# --- requests as bytes --------------------------------------------------------

DEFAULT = object()


def head(method, path, headers, version=b"HTTP/1.1"):
    lines = [b(method) + b" " + b(path) + b" " + b(version)]
    lines += [b(k) + b": " + b(v) for k, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def write(path, body, key, auth=b"Bearer dev-shop-1", ctype=b"application/json",
          length=DEFAULT, extra=(), method=b"POST", version=b"HTTP/1.1",
          host=b"127.0.0.1", close=True):
    """A write as a client sends it; None leaves a header out."""
    body = b(body)
    hs = []
    if host is not None:
        hs.append((b"Host", host))
    if auth is not None:
        hs.append((b"Authorization", auth))
    if key is not None:
        hs.append((b"Idempotency-Key", key))
    if ctype is not None:
        hs.append((b"Content-Type", ctype))
    if length is DEFAULT:
        length = len(body)
    if length is not None:
        hs.append((b"Content-Length", length))
    hs += list(extra)
    if close:
        hs.append((b"Connection", b"close"))
    return head(method, path, hs, version) + body


def read(path, auth=b"Bearer dev-shop-1", method=b"GET", extra=(), close=True,
         version=b"HTTP/1.1"):
    hs = [(b"Host", b"127.0.0.1")]
    if auth is not None:
        hs.append((b"Authorization", auth))
    hs += list(extra)
    if close:
        hs.append((b"Connection", b"close"))
    return head(method, path, hs, version)


class Answer:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def __repr__(self):
        return f"<{self.status} {self.headers.get('content-type')} {self.body[:200]!r}>"


def parse(data, head_only=False):
    """The answers in a byte stream, in order (a HEAD's have no body)."""
    out = []
    while True:
        top, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            return out
        lines = top.split(b"\r\n")
        status = int(lines[0].split(b" ")[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode()
        n = 0 if head_only else int(headers.get("content-length", "0"))
        out.append(Answer(status, headers, rest[:n]))
        data = rest[n:]


def receive(s, wait):
    """Everything the server sends until it closes (or wait runs out)."""
    data = b""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return data, False
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            return data, False
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk


def exchange(raw, wait=5):
    """Sends raw in one write; the answers, whether the server closed, and
    how long it took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", api.port)) as s:
        try:
            s.sendall(raw)
        except OSError:
            pass
        data, closed = receive(s, wait)
    return data, closed, time.monotonic() - start


# --- the table ----------------------------------------------------------------

KORE, OK = "kore", "ok"
EFFECT = {
    "POST /v1/orders": {"idempotency_keys": 1, "orders": 1, "bonus_ledger": 1,
                        "bonus_accounts": 1},
    "POST /v1/bonuses": {"idempotency_keys": 1, "bonus_ledger": 1, "bonus_accounts": 1},
    "POST /v1/bonuses/transfers": {"idempotency_keys": 1, "bonus_transfers": 1,
                                   "bonus_ledger": 2, "bonus_accounts": 1},
    "POST /v1/payments": {"idempotency_keys": 1, "payments": 1, "provider.requests": 1},
    "POST /v1/refunds": {"idempotency_keys": 1, "refunds": 1, "provider.requests": 1},
}


class Row:
    """One bad input: the bytes sent (or a function that talks on the
    socket), the answers expected in order, each (status, problem type |
    KORE | OK), or none at all; the key its leftovers are looked for under;
    what it may leave (nothing, or for the exact limits one operation)."""

    def __init__(self, cat, name, route, raw, status, answer=None, key=None,
                 client="shop-1", effect=None, wait=5, head_only=False, within=None):
        self.cat, self.name, self.route, self.raw = cat, name, route, raw
        if status is None:
            self.expect = []
        elif isinstance(status, list):
            self.expect = status
        else:
            self.expect = [(status, answer)]
        self.key, self.client = key, client
        self.effect = effect or {}
        self.wait, self.head_only, self.within = wait, head_only, within
        self.got = None


rows = []


def row(*args, **kw):
    rows.append(Row(*args, **kw))


# The write routes and their fields (name, kind, required): every POST of
# the document, which scripts/openapi.py writes from the route table and
# the operations' field tables, so that a new route is in every section.
with open(os.path.join(ROOT, "docs", "openapi.json")) as f:
    DOC = json.load(f)
FIELDS, EXAMPLES, PROPS = {}, {}, {}
for route, item in DOC["paths"].items():
    if "post" not in item:
        continue
    schema = DOC["components"]["schemas"][item["post"]["requestBody"][
        "content"]["application/json"]["schema"]["$ref"].split("/")[-1]]
    FIELDS[route] = [(name, prop["x-idem-kind"], name in schema["required"])
                     for name, prop in schema["properties"].items()]
    EXAMPLES[route] = schema["example"]
    PROPS[route] = schema["properties"]


def good(path):
    """The members of a good body (JSON texts), fresh ids each time: the
    document's example, with what the routes of this file need to be
    served (a balance to move, a payment to refund)."""
    members = {name: (json.dumps(fresh()) if kind == "id" else
                      json.dumps(EXAMPLES[path][name]))
               for name, kind, _ in FIELDS[path]}
    members.update({
        "/v1/orders": {"amount": "150000", "comment": '"gift"'},
        "/v1/bonuses": {"points": "10"},
        "/v1/bonuses/transfers": {"from_customer_id": '"c-rich"',
                                  "points": "1"},
        "/v1/payments": {"amount": "1000", "recipient": json.dumps(fresh("acc")),
                         "purpose": '"p"'},
        "/v1/refunds": {"payment_id": str(paid["shop-1"]), "amount": "1",
                        "reason": '"r"'},
    }.get(path, {}))
    # The fake provider needs no means of payment.
    members.pop("payment_method", None)
    return members


def text(members):
    return b"{" + b",".join(b(json.dumps(k)) + b":" + b(v) for k, v in members.items()) + b"}"


def body_of(path, **changes):
    """A good body with members changed (a JSON text) or left out (None)."""
    members = good(path)
    for k, v in changes.items():
        if v is None:
            members.pop(k, None)
        else:
            members[k] = v
    return text(members)


def with_member(body, name, value):
    """body (an object's bytes) with one more member in front."""
    return b"{" + b(name) + b":" + b(value) + b"," + body[1:]


def key():
    return new_key("cat")


def bad_write(cat, name, path, body=None, status=400, slug="invalid-request", **kw):
    """A row of a write whose one defect is given; everything else good."""
    k = kw.pop("key", None) or key()
    sent_key = kw.pop("sent_key", k)
    client = kw.pop("client", "shop-1")
    if "auth" not in kw:
        kw["auth"] = b"Bearer " + b({"shop-1": "dev-shop-1", "shop-2": "dev-shop-2"}[client])
    raw = write(path, body_of(path) if body is None else body, sent_key, **kw)
    row(cat, name, "POST " + path, raw, status, slug, key=k, client=client)


def good_write(cat, name, path, body, **kw):
    """The exact side of a limit: served, exactly one operation."""
    k = kw.pop("key", None) or key()
    sent_key = kw.pop("sent_key", k)
    raw = write(path, body, sent_key, **kw)
    row(cat, name, "POST " + path, raw, 201, OK, key=k, effect=EFFECT["POST " + path])


WRITES = list(FIELDS)
t.ok(len(WRITES) >= 5, f"the document has {len(WRITES)} write routes")

# 1. The Idempotency-Key header, on every write route.
for path in WRITES:
    cat = "headers: Idempotency-Key"
    bad_write(cat, "missing", path, sent_key=None, slug="idempotency-key-missing")
    for sent, what in [("k" * 256, "256 characters"),
                       ('"' + "k" * 256 + '"', "quoted, 256 inside"),
                       ("has space", "a space inside"),
                       ('""', "quoted, empty"), ('"abc', "an unterminated quote"),
                       ('"a\\b"', "a bad escape"), ('"a"b', "text after the quote"),
                       ("k" * 3800, "3,800 characters")]:
        bad_write(cat, what, path, sent_key=sent, slug="idempotency-key-malformed")
    k = key()
    bad_write(cat, "twice, the same value", path, key=k, extra=[(b"Idempotency-Key", k)],
              slug="idempotency-key-malformed")
    bad_write(cat, "twice, two values", path, extra=[(b"Idempotency-Key", key())],
              slug="idempotency-key-malformed")
    # Kore's HTTP parser refuses these header values itself (docs/limits.md).
    for sent, what in [(b"", "empty"), ("é".encode(), "a byte past 0x7E (UTF-8)"),
                       (b"caf\xe9", "a Latin-1 byte"), (b"a\tb", "a tab"),
                       (b"a\x7fb", "a DEL byte"), (b"a\x01b", "a control byte")]:
        bad_write(cat, what, path, sent_key=sent, status=400, slug=KORE)
    # Past the 4 KiB head Kore closes the connection without an answer.
    k = key()
    row(cat, "4,000 characters (the head past 4 KiB)", "POST " + path,
        write(path, body_of(path), k + "k" * (4000 - len(k))), None, key=k)
    # A NUL ends Kore's head: the lines after it are not read (here the
    # Content-Length: a 411).
    k = key()
    row(cat, "a NUL inside (before Content-Length)", "POST " + path,
        write(path, body_of(path), k.encode() + b"\x00x", length=None,
              extra=[(b"Content-Length", len(body_of(path)))]), 411, KORE, key=k)

for path in ("/v1/orders", "/v1/payments"):
    k = (key() + "k" * 255)[:255]
    good_write("headers: Idempotency-Key", "255 characters (the limit)", path, body_of(path),
               key=k)
    k = (key() + "q" * 255)[:255]
    good_write("headers: Idempotency-Key", "quoted, 255 inside (the limit)", path,
               body_of(path), key=k, sent_key='"' + k + '"')
    # Whitespace around a field value is not part of it (RFC 9110): the
    # key is the same with spaces after it, bare or quoted (a tab Kore
    # refuses itself, above).
    k = key()
    good_write("headers: Idempotency-Key", "trailing spaces, stripped", path,
               body_of(path), key=k, sent_key=k + "  ")
    k = key()
    good_write("headers: Idempotency-Key", "quoted, a trailing space, stripped", path,
               body_of(path), key=k, sent_key='"' + k + '" ')

# 2. The bearer token.
for path in WRITES:
    cat = "headers: Authorization"
    for auth, what in [(None, "missing"), (b"Basic ZGV2LXNob3AtMTo=", "Basic scheme"),
                       (b"Bearer", "Bearer without a token"), (b"Bearer ", "Bearer and a space"),
                       (b"Bearer nope", "an unknown token"),
                       (b"Bearer dev-shop-1 ", "the token and a trailing space"),
                       (b"Bearer dev-shop-1x", "the token and one more character"),
                       (b"Bearer " + b"t" * 3800, "a 3,800-byte token"),
                       (b"Token dev-shop-1", "another scheme")]:
        bad_write(cat, what, path, auth=auth, status=401, slug="unauthorized")
    bad_write(cat, "twice, the same token", path, status=401, slug="unauthorized",
              extra=[(b"Authorization", b"Bearer dev-shop-1")])
    bad_write(cat, "twice, two clients' tokens", path, status=401, slug="unauthorized",
              extra=[(b"Authorization", b"Bearer dev-shop-2")])
    for auth, what in [(b"Bearer d\xc3\xa9v", "a byte past 0x7E"), (b"", "empty"),
                       (b"Bearer a\tb", "a tab")]:
        bad_write(cat, what, path, auth=auth, status=400, slug=KORE)

# 3. The media type.
for path in WRITES:
    cat = "headers: Content-Type"
    for ctype, what in [(None, "missing"), (b"text/plain", "text/plain"),
                        (b"application/x-www-form-urlencoded", "a form"),
                        (b"multipart/form-data; boundary=x", "multipart"),
                        (b"application/jsonx", "application/jsonx"),
                        (b"application/json-patch+json", "a +json type"),
                        (b"application/problem+json", "application/problem+json"),
                        (b"text/json", "text/json"),
                        (b"application/ json", "a space after the slash"),
                        (b"application/json, text/plain", "a list"), (b"*/*", "*/*"),
                        (b"json", "json")]:
        bad_write(cat, what, path, ctype=ctype, status=415, slug="unsupported-media-type")
    bad_write(cat, "twice, the same type", path, status=415, slug="unsupported-media-type",
              extra=[(b"Content-Type", b"application/json")])
    bad_write(cat, "twice, two types", path, status=415, slug="unsupported-media-type",
              extra=[(b"Content-Type", b"text/plain")])
    for ctype, what in [(b"", "empty"), (b"application/j\xc3\xa9son", "a byte past 0x7E")]:
        bad_write(cat, what, path, ctype=ctype, status=400, slug=KORE)
    # Parameters are not read: the body is UTF-8 whatever the charset says.
    bad_write(cat, "charset=utf-16 and a UTF-16 body", path,
              body=body_of(path).decode().encode("utf-16"),
              ctype=b"application/json; charset=utf-16", slug="invalid-json")
    bad_write(cat, "charset=latin-1 and a Latin-1 body", path,
              body=with_member(body_of(path), '"x"', '"caf\xe9"'.encode("latin-1")),
              ctype=b"application/json; charset=latin-1", slug="invalid-json")
for ctype in (b"application/json; charset=utf-8", b"APPLICATION/JSON"):
    good_write("headers: Content-Type", ctype.decode() + " (accepted)", "/v1/orders",
               body_of("/v1/orders"), ctype=ctype)

# 4. The body, on every write route.
for path in WRITES:
    cat = "body: JSON"
    B = body_of(path)
    first = B[1:B.index(b",")]
    name, value = first.split(b":", 1)
    tricks = [
        ("empty", b"", "invalid-json"), ("whitespace only", b" \r\n\t ", "invalid-json"),
        ("cut after one byte", B[:1], "invalid-json"),
        ("cut in half", B[:len(B) // 2], "invalid-json"),
        ("cut before the last brace", B[:-1], "invalid-json"),
        ("null", b"null", "invalid-request"), ("true", b"true", "invalid-request"),
        ("a number", b"42", "invalid-request"), ("a string", b'"s"', "invalid-request"),
        ("an empty array", b"[]", "invalid-request"),
        ("the object in an array", b"[" + B + b"]", "invalid-request"),
        ("arrays nested 10,000 deep", with_member(B, '"x"', b"[" * 10000 + b"]" * 10000),
         "invalid-json"),
        ("objects nested 10,000 deep",
         with_member(B, '"x"', b'{"a":' * 10000 + b"1" + b"}" * 10000), "invalid-json"),
        ("10,000 brackets never closed", b"[" * 10000, "invalid-json"),
        ("nested 33 deep (the limit + 1)", with_member(B, '"x"', b"[" * 32 + b"]" * 32),
         "invalid-json"),
        ("a number of 4,301 digits", with_member(B, '"x"', b"1" * 4301), "invalid-json"),
        ("1e400", with_member(B, '"x"', b"1e400"), "invalid-json"),
        ("-1e400", with_member(B, '"x"', b"-1e400"), "invalid-json"),
        ("NaN", with_member(B, '"x"', b"NaN"), "invalid-json"),
        ("Infinity", with_member(B, '"x"', b"Infinity"), "invalid-json"),
        ("-Infinity", with_member(B, '"x"', b"-Infinity"), "invalid-json"),
        ("hex 0x10", with_member(B, '"x"', b"0x10"), "invalid-json"),
        ("+1", with_member(B, '"x"', b"+1"), "invalid-json"),
        ("a leading zero 01", with_member(B, '"x"', b"01"), "invalid-json"),
        (".5", with_member(B, '"x"', b".5"), "invalid-json"),
        ("1.", with_member(B, '"x"', b"1."), "invalid-json"),
        ("1e", with_member(B, '"x"', b"1e"), "invalid-json"),
        ("a lone minus", with_member(B, '"x"', b"-"), "invalid-json"),
        ("True", with_member(B, '"x"', b"True"), "invalid-json"),
        ("a field twice, the same value", b"{" + first + b"," + B[1:], "invalid-json"),
        ("a field twice, two values", b"{" + name + b':"other",' + B[1:], "invalid-json"),
        ("a field twice, once spelled with \\u escapes",
         b'{"' + b"".join(b"\\u%04x" % c for c in name[1:-1]) + b'":' + value + b"," + B[1:],
         "invalid-json"),
        ("a duplicate inside a nested object", with_member(B, '"x"', b'{"a":1,"a":1}'),
         "invalid-json"),
        ("a lone high surrogate", with_member(B, '"x"', b'"\\ud800"'), "invalid-json"),
        ("a lone low surrogate", with_member(B, '"x"', b'"\\udc00"'), "invalid-json"),
        ("a high surrogate before a letter", with_member(B, '"x"', b'"\\ud800\\u0041"'),
         "invalid-json"),
        ("a lone surrogate in a member name", with_member(B, b'"\\ud800"', b"1"),
         "invalid-json"),
        ("overlong '/' C0 AF", with_member(B, '"x"', b'"\xc0\xaf"'), "invalid-json"),
        ("overlong E0 80 AF", with_member(B, '"x"', b'"\xe0\x80\xaf"'), "invalid-json"),
        ("overlong F0 80 80 AF", with_member(B, '"x"', b'"\xf0\x80\x80\xaf"'), "invalid-json"),
        ("an encoded surrogate ED A0 80", with_member(B, '"x"', b'"\xed\xa0\x80"'),
         "invalid-json"),
        ("past U+10FFFF F4 90 80 80", with_member(B, '"x"', b'"\xf4\x90\x80\x80"'),
         "invalid-json"),
        ("a byte FF", with_member(B, '"x"', b'"\xff"'), "invalid-json"),
        ("a lone continuation byte", with_member(B, '"x"', b'"\x80"'), "invalid-json"),
        ("a sequence cut by the quote", with_member(B, '"x"', b'"\xc3"'), "invalid-json"),
        ("a 5-byte form F8 88 80 80 80", with_member(B, '"x"', b'"\xf8\x88\x80\x80\x80"'),
         "invalid-json"),
        ("Latin-1 E9", with_member(B, '"x"', b'"caf\xe9"'), "invalid-json"),
        ("a raw NUL in a string", with_member(B, '"x"', b'"a\x00b"'), "invalid-json"),
        ("a raw NUL between members", b"{\x00" + B[1:], "invalid-json"),
        ("a NUL after the document", B + b"\x00", "invalid-json"),
        ("a raw tab in a string", with_member(B, '"x"', b'"a\tb"'), "invalid-json"),
        ("a raw newline in a string", with_member(B, '"x"', b'"a\nb"'), "invalid-json"),
        ("an escape \\x41", with_member(B, '"x"', b'"\\x41"'), "invalid-json"),
        ("a short \\u12", with_member(B, '"x"', b'"\\u12"'), "invalid-json"),
        ("an escape \\U0041", with_member(B, '"x"', b'"\\U0041"'), "invalid-json"),
        ("a byte order mark", b"\xef\xbb\xbf" + B, "invalid-json"),
        ("UTF-16LE", B.decode().encode("utf-16-le"), "invalid-json"),
        ("UTF-32", B.decode().encode("utf-32"), "invalid-json"),
        ("a comment", b"/* c */" + B, "invalid-json"),
        ("single quotes", B.replace(b'"', b"'"), "invalid-json"),
        ("a trailing comma", B[:-1] + b",}", "invalid-json"),
        ("a trailing comma in an array", with_member(B, '"x"', b"[1,]"), "invalid-json"),
        ("an unquoted member name", b"{x:1," + B[1:], "invalid-json"),
        ("two documents", B + B, "invalid-json"),
        ("trailing data", B + b" x", "invalid-json"),
    ]
    for what, body, slug in tricks:
        bad_write(cat, what, path, body=body, slug=slug)
for path in ("/v1/orders", "/v1/payments"):
    good_write("body: JSON", "nested 32 deep (the limit)", path,
               with_member(body_of(path), '"x"', b"[" * 31 + b"]" * 31))
    good_write("body: JSON", "a number of 4,300 digits, in a member outside the fields",
               path, with_member(body_of(path), '"x"', b"1" * 4300))

# 5. Every field, every type confusion; its limits below, from the document.
BAD = {
    "int": [("null", "null"), ("true", "true"), ("false", "false"), ("a string", '"1000"'),
            ("an empty string", '""'), ("an array", "[1000]"), ("an object", '{"v":1000}'),
            ("0", "0"), ("-1", "-1"), ("-0", "-0"), ("1.5", "1.5"), ("1000.0", "1000.0"),
            ("1e3", "1e3"), ("1E+3", "1E+3"), ("2^63", str(2 ** 63)), ("-(2^63)", str(-2 ** 63)), ("10^30", "1" + "0" * 30)],
    "points": [("null", "null"), ("true", "true"), ("a string", '"10"'), ("an array", "[10]"),
               ("an object", "{}"), ("0", "0"), ("-0", "-0"), ("1.5", "1.5"),
               ("10.0", "10.0"), ("1e1", "1e1"), ("2^63", str(2 ** 63))],
    "currency": [("null", "null"), ("true", "true"), ("0", "0"), ("an array", '["RUB"]'),
                 ("an object", "{}"), ("empty", '""'), ("lower case", '"rub"'),
                 ("mixed case", '"Rub"'), ("2 letters", '"RU"'), ("4 letters", '"RUBL"'),
                 ("a digit", '"RU1"'), ("a space", '"R B"'), ("Cyrillic", '"РУБ"'),
                 ("an umlaut", '"RÜB"'), ("a NUL", '"\\u0000RU"')],
    "id": [("null", "null"), ("true", "true"), ("0", "0"), ("1.5", "1.5"), ("an array", '["c"]'),
           ("an object", "{}"), ("empty", '""'),
           ("129 bytes, 128 characters", json.dumps("c" * 127 + "é", ensure_ascii=False)),
           ("a newline", '"a\\nb"'), ("a NUL", '"a\\u0000b"'), ("a DEL", '"a\\u007fb"'),
           ("a unit separator", '"a\\u001fb"'), ("a tab", '"\\t"')],
    "text": [("null", "null"), ("true", "true"), ("0", "0"), ("an array", '["t"]'),
             ("an object", "{}"),
             ("1025 bytes, 1024 characters", json.dumps("t" * 1023 + "é", ensure_ascii=False)),
             ("a NUL", '"a\\u0000b"')],
}
BAD["token"] = [("null", "null"), ("true", "true"), ("0", "0"), ("an array", '["t"]'),
                ("an object", "{}"), ("empty", '""'),
                ("a space", '"tok visa"'), ("a non-ASCII letter", '"tok\\u00e9"'),
                ("a NUL", '"a\\u0000b"'), ("a DEL", '"a\\u007fb"')]
BAD["amount"] = BAD["ref"] = BAD["positive"] = BAD["int"]
for path, fields in FIELDS.items():
    cat = "fields: types and limits"
    for field, kind, required in fields:
        if required:
            bad_write(cat, f"{field} missing", path, body=body_of(path, **{field: None}))
        for what, literal in BAD[kind]:
            slug = "invalid-request"
            bad_write(cat, f"{field} {what}", path, body=body_of(path, **{field: literal}),
                      slug=slug)
        for what, literal in [("1e400", "1e400"), ("4,301 digits", "9" * 4301)]:
            if kind in ("amount", "ref", "positive", "points"):
                bad_write(cat, f"{field} {what}", path, body=body_of(path, **{field: literal}),
                          slug="invalid-json")
cat = "fields: types and limits"
bad_write(cat, "the same customer twice", "/v1/bonuses/transfers",
          body=body_of("/v1/bonuses/transfers", from_customer_id='"c-1"',
                       to_customer_id='"c-1"'))
bad_write(cat, "the same customer, once with an escape", "/v1/bonuses/transfers",
          body=body_of("/v1/bonuses/transfers", from_customer_id='"c-1"',
                       to_customer_id='"c\\u002d1"'))
bad_write(cat, "payment_id of another client's payment", "/v1/refunds",
          body=body_of("/v1/refunds", payment_id=str(paid["shop-2"])), status=404,
          slug="payment-not-found")
bad_write(cat, "payment_id 2^53-1, no such payment", "/v1/refunds",
          body=body_of("/v1/refunds", payment_id=str(MAX)), status=404, slug="payment-not-found")
bad_write(cat, "amount 2^53-1, past the payment", "/v1/refunds",
          body=body_of("/v1/refunds", amount=str(MAX)), status=422, slug="refund-exceeds-payment")
bad_write(cat, "amount one past what is left", "/v1/refunds",
          body=body_of("/v1/refunds", amount="100001"), status=422, slug="refund-exceeds-payment")
for path, what, changes in [
        ("/v1/orders", "customer_id of 128 bytes (the limit)",
         {"customer_id": json.dumps("c" * 120 + fresh()[-8:])}),
        ("/v1/orders", "amount 2^53-1 (the limit)", {"amount": str(MAX)}),
        ("/v1/orders", "comment of 1024 bytes (the limit)", {"comment": json.dumps("t" * 1024)}),
        ("/v1/orders", "comment of 1024 bytes in 512 characters",
         {"comment": json.dumps("é" * 512, ensure_ascii=False)}),
        ("/v1/orders", "comment empty", {"comment": '""'}),
        ("/v1/bonuses", "points 2^53-1 (the limit)", {"points": str(MAX)}),
        ("/v1/bonuses", "reason of 1024 bytes (the limit)", {"reason": json.dumps("t" * 1024)}),
        ("/v1/bonuses/transfers", "to_customer_id of 128 bytes (the limit)",
         {"to_customer_id": json.dumps("c" * 120 + fresh()[-8:])}),
        ("/v1/payments", "amount 2^53-1 (the limit)", {"amount": str(MAX)}),
        ("/v1/payments", "amount 1 (the limit)", {"amount": "1"}),
        ("/v1/payments", "recipient of 128 bytes (the limit)",
         {"recipient": json.dumps("a" * 120 + fresh()[-8:])}),
        ("/v1/payments", "purpose of 1024 bytes (the limit)",
         {"purpose": json.dumps("t" * 1024)}),
        ("/v1/refunds", "reason of 1024 bytes (the limit)", {"reason": json.dumps("t" * 1024)})]:
    good_write(cat, what, path, body_of(path, **changes))

# 5b. Every field's limits as the document gives them (scripts/openapi.py
# writes them from the field tables, as the validator reads them): each
# boundary is served, one past it is a 400 (tests/lib/openapi.py,
# boundaries()). A boundary the operation itself refuses is answered as
# the operation does: the table below; an identifier at a boundary is a
# customer with an account made here, so that a row moves what it should.
cat = "fields: each limit and one past it"
LETTERS = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def boundary_id(n):
    """A customer of n bytes, fresh where n allows, with an account."""
    v = (fresh() * 20)[:n] if n >= 13 else next(LETTERS) * n
    r = post(api.port, "/v1/bonuses", {"customer_id": v, "points": 10 ** 6, "reason": "setup"},
             key=new_key("setup"))
    assert r.status == 201, r
    return json.dumps(v)


def payment_one():
    """How a refund of 1 of payment 1 is answered: it may be any client's."""
    rows = db.run("select p.client_id, p.amount - coalesce((select sum(amount) from refunds "
                  "where payment_id = 1 and status <> 'rejected'), 0) from payments p "
                  "where p.payment_id = 1;")
    client, left = (rows[0].split("|") if rows and rows[0] else ("", "0"))
    if client != "shop-1":
        return 404, "payment-not-found", {}
    if int(left) < 1:
        return 422, "refund-exceeds-payment", {}
    return 201, OK, EFFECT["POST /v1/refunds"]


SAVED_422 = {"idempotency_keys": 1}
OUTCOME = {
    ("/v1/orders", "amount", "1"): (201, OK, {"idempotency_keys": 1, "orders": 1}),
    ("/v1/bonuses", "points", str(-MAX)): (422, "insufficient-balance", SAVED_422),
    ("/v1/bonuses/transfers", "points", str(MAX)): (422, "insufficient-balance", SAVED_422),
    ("/v1/refunds", "payment_id", str(MAX)): (404, "payment-not-found", {}),
    ("/v1/refunds", "amount", str(MAX)): (422, "refund-exceeds-payment", {}),
}
for path, fields in FIELDS.items():
    for field, kind, _ in fields:
        for what, literal, valid in openapi.boundaries(PROPS[path][field]):
            if not valid:
                bad_write(cat, f"{field} {what}", path, body=body_of(path, **{field: literal}))
                continue
            # A route this file does not know the rows of (a new one): what
            # its limits move is its own test's to check.
            if "POST " + path not in EFFECT:
                continue
            effect = EFFECT["POST " + path]
            if kind == "id":
                literal = boundary_id(len(json.loads(literal)))
                if path != "/v1/payments" and field != "from_customer_id":
                    effect = dict(effect, bonus_accounts=0)
            status, form, effect = OUTCOME.get((path, field, literal), (201, OK, effect))
            if (path, field, literal) == ("/v1/refunds", "payment_id", "1"):
                status, form, effect = payment_one()
            k = key()
            row(cat, f"{field} {what}", "POST " + path,
                write(path, body_of(path, **{field: literal}), k), status, form, key=k,
                effect=effect)

# 6. Methods and paths.
cat = "methods and paths"
for path in WRITES:
    for method in ("PUT", "PATCH"):
        raw = write(path, body_of(path), key(), method=method)
        row(cat, f"{method} {path}", f"{method} {path}", raw, 405, "method-not-allowed")
    # Kore reads no body on DELETE: refused, the connection closed
    # (src/core/framing.c).
    row(cat, f"DELETE {path} with a body", f"DELETE {path}",
        write(path, body_of(path), key(), method=b"DELETE"), 400, "invalid-request")
    row(cat, f"HEAD {path}", f"HEAD {path}", read(path, method=b"HEAD"), 405,
        "method-not-allowed", head_only=True)
    row(cat, f"OPTIONS {path}", f"OPTIONS {path}", read(path, method=b"OPTIONS"), 405,
        "method-not-allowed")
    row(cat, f"PUT {path} without a body", f"PUT {path}", read(path, method=b"PUT"), 411, KORE)
for path in ("/v1/bonuses/transfers", "/v1/payments", "/v1/refunds"):
    row(cat, f"GET {path}", f"GET {path}", read(path), 405, "method-not-allowed")
for path in ("/v1/bonuses/c-1", f"/v1/payments/{paid['shop-1']}", "/healthz", "/metrics",
             "/problems/invalid-json"):
    raw = write(path, body_of("/v1/orders"), key())
    route = re.sub(r"^(/v1/\w+)/[^/]+$", r"\1/{id}", path)
    route = re.sub(r"^/problems/.*", "/problems/{type}", route)
    row(cat, f"POST {path}", "POST " + route, raw, 405, "method-not-allowed")
for path in ("/healthz", "/metrics", "/problems/invalid-json"):
    row(cat, f"DELETE {path}", f"DELETE {path}", read(path, method=b"DELETE"), 405,
        "method-not-allowed")
row(cat, "HEAD /problems/invalid-json", "HEAD /problems/{type}",
    read("/problems/invalid-json", method=b"HEAD"), 405, "method-not-allowed", head_only=True)
row(cat, "GET /problems/no-such-type", "GET /problems/{type}", read("/problems/no-such-type"),
    404, "not-found")
for method in (b"FOO", b"TRACE", b"CONNECT", b"get\x01"):
    row(cat, f"method {method.decode(errors='replace')!r}", "any",
        write("/v1/orders", body_of("/v1/orders"), key(), method=method), 400, KORE)
row(cat, "DELETE over HTTP/1.0", "DELETE /v1/orders",
    read("/v1/orders", method=b"DELETE", version=b"HTTP/1.0"), 405, KORE)
for version in (b"HTTP/2.0", b"HTTP/1.2", b"HTTP/1", b"HTTPS/1.1"):
    row(cat, f"version {version.decode()}", "POST /v1/orders",
        write("/v1/orders", body_of("/v1/orders"), key(), version=version), 505, KORE)
for path in ("/v1/orders/", "//v1/orders", "/V1/ORDERS", "/v1/order", "/v1/orders%2F",
             "/v1/orders/x", "/v1/bonuses/", "/v1/bonuses/a/b", "/v1/payments/", "/v1",
             "/v1/refunds/1"):
    k = key()
    row(cat, f"POST {path}", "POST (no route)", write(path, body_of("/v1/payments"), k),
        404, "not-found", key=k)
for path in ("/v1/orders/../payments", "/v1/./payments"):
    k = key()
    row(cat, f"POST {path} (not normalised)", "POST (no route)",
        write(path, body_of("/v1/payments"), k), 404, "not-found", key=k)
row(cat, "absolute-form URI", "any", write("http://127.0.0.1/v1/orders", body_of("/v1/orders"),
                                           key()), 404, KORE)
row(cat, "OPTIONS *", "any", read("*", method=b"OPTIONS"), 404, KORE)
for seg, what, status, slug in [
        ("0", "0", 400, "invalid-request"), ("01", "a leading zero", 400, "invalid-request"),
        ("-1", "-1", 400, "invalid-request"), ("+1", "+1", 400, "invalid-request"),
        ("1.0", "1.0", 400, "invalid-request"), ("1e3", "1e3", 400, "invalid-request"),
        ("%31", "%31 (not decoded)", 400, "invalid-request"),
        (str(2 ** 53), "2^53", 400, "invalid-request"),
        ("1" * 40, "40 digits", 400, "invalid-request"),
        ("abc", "letters", 400, "invalid-request"),
        (str(MAX), "2^53-1, no such payment", 404, "payment-not-found"),
        (str(paid["shop-2"]), "another client's payment", 404, "payment-not-found")]:
    row(cat, f"GET /v1/payments/{what}", "GET /v1/payments/{id}", read("/v1/payments/" + seg),
        status, slug)
for seg, what in [("%FF", "%FF (not UTF-8)"), ("%C3", "%C3 (a cut sequence)"),
                  ("%C0%AF", "%C0%AF (overlong)"), ("%ED%A0%80", "an encoded surrogate"),
                  ("%00", "%00"), ("a%0Ab", "a newline"), ("%zz", "%zz"), ("%4", "%4"),
                  ("c" * 129, "129 bytes"), ("%63" * 129, "129 bytes percent-encoded")]:
    row(cat, f"GET /v1/bonuses/{what}", "GET /v1/bonuses/{id}", read("/v1/bonuses/" + seg),
        400, "invalid-request")
for query, what in [("", "no query"), ("?", "an empty query"), ("?customer_id=", "empty"),
                    ("?customer_id", "no ="), ("?customer=c-1", "another name"),
                    ("?customer_id=%FF", "%FF (not UTF-8)"), ("?customer_id=%C0%AF", "overlong"),
                    ("?customer_id=%00", "%00"), ("?customer_id=%zz", "%zz"),
                    ("?customer_id=" + "c" * 129, "129 bytes"),
                    ("?customer_id=%FF&customer_id=c-1", "the first of two is not UTF-8")]:
    row(cat, f"GET /v1/orders {what}", "GET /v1/orders", read("/v1/orders" + query), 400,
        "invalid-request")
for path in ("/v1/orders?customer_id=c-1", "/v1/bonuses/c-1", f"/v1/payments/{paid['shop-1']}"):
    for auth, what in [(None, "no token"), (b"Bearer nope", "an unknown token")]:
        row(cat, f"GET {path.split('?')[0]}: {what}", "GET " + path.split("?")[0],
            read(path, auth=auth), 401, "unauthorized")
    row(cat, f"GET {path.split('?')[0]}: two tokens", "GET " + path.split("?")[0],
        read(path, extra=[(b"Authorization", b"Bearer dev-shop-2")]), 401, "unauthorized")
# The URI limit: Kore's 414 from 1,999 bytes of path and query.
row(cat, "a URI of 1,998 bytes", "GET /v1/bonuses/{id}",
    read("/v1/bonuses/" + "c" * (1998 - len("/v1/bonuses/"))), 400, "invalid-request")
row(cat, "a URI of 1,999 bytes (the limit + 1)", "GET /v1/bonuses/{id}",
    read("/v1/bonuses/" + "c" * (1999 - len("/v1/bonuses/"))), 414, KORE)

# 7. The framing of the request: Host, header lines, lengths.
cat = "framing"
P = "/v1/orders"
for host, what in [(None, "no Host"), (b"", "an empty Host"),
                   (b"h" * 300, "a Host of 300 bytes")]:
    row(cat, what, "any", write(P, body_of(P), key(), host=host), 400, KORE)
for line, what in [(b"NoColon", "a line without a colon"), (b"Bad Name: x", "a space in a name"),
                   (b"B@d: x", "a name with '@'"), (b"X-Folded: a\r\n b", "an obs-fold line")]:
    raw = write(P, body_of(P), key())
    top, _, body = raw.partition(b"\r\n\r\n")
    row(cat, what, "POST /v1/orders", top + b"\r\n" + line + b"\r\n\r\n" + body, 400, KORE)
for length, what, status, slug in [
        (None, "no Content-Length", 411, KORE), (b"-1", "Content-Length -1", 411, KORE),
        (b"abc", "Content-Length abc", 411, KORE), (b"1e3", "Content-Length 1e3", 411, KORE),
        (b"1" + b"0" * 20, "Content-Length 10^20", 411, KORE),
        (b"", "an empty Content-Length", 400, KORE),
        (b"9223372036854775807", "Content-Length 2^63-1", 413, KORE),
        (b"65537", "Content-Length 65537 (the limit + 1)", 413, KORE)]:
    k = key()
    raw = write(P, b"", k, length=length)
    row(cat, what, "POST /v1/orders", raw, status, slug, key=k)
k = key()
row(cat, "Content-Length 0", "POST /v1/orders", write(P, b"", k), 400, "invalid-json", key=k)
k, body = key(), body_of(P)
body = with_member(body, '"pad"', b'"' + b"x" * (65536 - len(body) - len(b'"pad":"",')) + b'"')
assert len(body) == 65536
row(cat, "a body of 65,536 bytes (the limit)", "POST /v1/orders", write(P, body, k), 201, OK,
    key=k, effect=EFFECT["POST /v1/orders"])
k, body = key(), body_of(P)
body = with_member(body, '"pad"', b'"' + b"x" * (65537 - len(body) - len(b'"pad":"",')) + b'"')
row(cat, "a body of 65,537 bytes (the limit + 1), sent whole", "POST /v1/orders",
    write(P, body, k), 413, KORE, key=k)
k = key()
row(cat, "two Content-Lengths (refused, closed)", "POST /v1/orders",
    write(P, b"{}", k, extra=[(b"Content-Length", b"60")]), 400, "invalid-request", key=k)
k = key()
row(cat, "Transfer-Encoding: chunked, no Content-Length", "POST /v1/orders",
    write(P, b"", k, length=None, extra=[(b"Transfer-Encoding", b"chunked")]) +
    b"2\r\n{}\r\n0\r\n\r\n", 411, KORE, key=k)
k = key()
chunked = b"%x\r\n" % len(body_of(P)) + body_of(P) + b"\r\n0\r\n\r\n"
row(cat, "Transfer-Encoding: chunked and a Content-Length (refused, closed)",
    "POST /v1/orders", write(P, chunked, k, extra=[(b"Transfer-Encoding", b"chunked")]),
    400, "invalid-request", key=k)


def padded(n_lines, key_):
    """A good order whose Idempotency-Key is its n-th and last header line."""
    body = body_of(P)
    hs = [(b"Host", b"127.0.0.1"), (b"Authorization", b"Bearer dev-shop-1"),
          (b"Content-Type", b"application/json"), (b"Content-Length", len(body)),
          (b"Connection", b"close")]
    hs += [(b"X-Pad-%d" % i, b"x") for i in range(n_lines - len(hs) - 1)]
    return head("POST", P, hs + [(b"Idempotency-Key", key_)]) + body


k = key()
row(cat, "23 header lines (the limit)", "POST /v1/orders", padded(23, k), 201, OK, key=k,
    effect=EFFECT["POST /v1/orders"])
k = key()
row(cat, "24 header lines: Kore drops the 24th, the key", "POST /v1/orders", padded(24, k),
    400, "idempotency-key-missing", key=k)


def head_of(size, key_):
    """A good order whose head (request line to the blank line) has size bytes."""
    body = body_of(P)
    raw = write(P, body, key_, extra=[(b"X-Pad", b"")])
    pad = size - (len(raw) - len(body))
    return write(P, body, key_, extra=[(b"X-Pad", b"x" * pad)])


k = key()
row(cat, "a head of 4,096 bytes (the limit)", "POST /v1/orders", head_of(4096, k), 201, OK,
    key=k, effect=EFFECT["POST /v1/orders"])
k = key()
row(cat, "a head of 4,097 bytes: closed, no answer", "POST /v1/orders", head_of(4097, k), None,
    key=k)
k, body = key(), body_of(P)
row(cat, "a NUL in the last header: the key is cut there", "POST /v1/orders",
    head("POST", P, [(b"Host", b"127.0.0.1"), (b"Authorization", b"Bearer dev-shop-1"),
                     (b"Content-Type", b"application/json"), (b"Content-Length", len(body)),
                     (b"Connection", b"close"), (b"Idempotency-Key", k.encode() + b"\x00-rest")])
    + body, 201, OK, key=k, effect=EFFECT["POST /v1/orders"])
nul = rows[-1]


# --- running the rows -----------------------------------------------------------

# Rows another test's leftovers can add while this one runs: the recovery
# job finishes in-progress payments and refunds of earlier tests (a payment
# to "fail" is retried for as long as it stays in progress, each time a
# provider request). Only the catalogue's own keys count there.
OWN_KEYS = {"payments": "idem_key like 'cat-%'", "refunds": "idem_key like 'cat-%'",
            "provider.requests": "idempotency_key like '%:cat-%'"}


def snapshot(key_, client):
    q = ("select " + ", ".join(f"(select count(*) from {tb}" +
                               (f" where {OWN_KEYS[tb]})" if tb in OWN_KEYS else ")")
                               for tb in TABLES) +
         ", (select count(*) from idempotency_keys where client_id = "
         f"{quote(client)} and idem_key = {quote(key_ or '')})" +
         ", (select count(*) from provider.requests where idempotency_key = "
         f"{quote(client + ':' + (key_ or ''))});")
    values = [int(v) for v in db.run(q)[0].split("|")]
    return dict(zip(TABLES, values[:len(TABLES)])), values[-2], values[-1]


def answered(rw):
    """Whether the answers are the expected ones, each in its documented form."""
    got = rw.got
    if [a.status for a in got] != [s for s, _ in rw.expect]:
        return False
    for a, (status, form) in zip(got, rw.expect):
        ctype = a.headers.get("content-type")
        if form == KORE:
            if ctype is not None or a.body != b"":
                return False
        elif form == OK:
            if ctype != "application/json" or not 200 <= status < 300:
                return False
        else:
            if ctype != "application/problem+json":
                return False
            if rw.head_only:
                continue
            try:
                p = json.loads(a.body)
            except ValueError:
                return False
            if p.get("status") != status or not str(p.get("type", "")).endswith(
                    "/problems/" + form) or not p.get("title") or not p.get("detail"):
                return False
    return True


def label(rw):
    if not rw.expect:
        return "no answer"
    return ", ".join(f"{s} {'(Kore)' if f == KORE else f if f != OK else ''}".strip()
                     for s, f in rw.expect)


def check(rw, i, before, after, key_left, calls, elapsed=None):
    name = f"row {i}: {rw.cat}: {rw.route}: {rw.name}"
    t.ok(answered(rw), f"{name}: {label(rw)}", rw.got)
    moved = {tb: after[tb] - before[tb] for tb in TABLES if after[tb] != before[tb]}
    want = {tb: n for tb, n in rw.effect.items() if n}
    left = (moved, key_left, calls)
    expect = (want, 1 if want.get("idempotency_keys") else 0, want.get("provider.requests", 0))
    t.ok(left == expect, f"{name}: "
         + ("leaves nothing" if not want else "leaves exactly its one operation"),
         f"left: {left}\nwant: {expect}")
    if rw.within is not None:
        t.ok(elapsed is not None and elapsed <= rw.within,
             f"{name}: closed within {rw.within} s", elapsed)


state, _, _ = snapshot(None, "shop-1")
for i, rw in enumerate(rows, 1):
    before = state
    data, closed, elapsed = exchange(rw.raw, rw.wait)
    rw.got = parse(data, rw.head_only)
    if rw.expect and rw.expect[-1][1] == KORE:
        t.ok(closed, f"row {i}: {rw.cat}: {rw.route}: {rw.name}: Kore closes the connection")
    state, key_left, calls = snapshot(rw.key, rw.client)
    check(rw, i, before, state, key_left, calls)
    if not answered(rw):
        t.note(f"row {i}: sent {rw.raw[:300]!r}")

# The row whose key was cut at a NUL: its order is under the cut key.
t.eq(nul.got and key_row(nul.key) and key_row(nul.key)["status"], "done",
     "the key cut at the NUL holds the order (docs/limits.md)")


# 8. Slow clients and pipelined requests, in batches of connections held
# at once, CONNS per worker, so that both workers hold some: Kore checks
# its timeouts only when a worker's event loop wakes up, and a worker
# with no request and no timer of its own slept on (docs/behaviour.md, wakeup.c).
# The first batch is idle connections only, nothing else to wake a
# worker; each connection must end within Kore's timeout.


def dribble(parts, pause):
    """Sends parts one after another, pause apart, until the server closes."""
    def go(s):
        for p in parts:
            try:
                s.sendall(p)
            except OSError:
                return
            time.sleep(pause)
    return go


def slow_row(batch, cat, name, route, talk, expect, k=None, limit=HEADER_TIMEOUT):
    rw = Row(cat, name, route, talk, None, key=k, wait=limit + 8, within=limit + 2)
    rw.expect = expect
    batch.append(rw)


PAY, ORD = "/v1/payments", "/v1/orders"
idle, slow, piped = [], [], []
for n in range(2 * CONNS):
    k = key()
    full = write(PAY, body_of(PAY), k)
    top = full[:full.index(b"\r\n\r\n")]
    what, route, parts, expect = [
        ("nothing sent", "any", [], [(408, KORE)]),
        ("the request line only", "POST /v1/payments", [top.split(b"\r\n")[0] + b"\r\n"],
         [(408, KORE)]),
        ("headers never finished", "POST /v1/payments", [top + b"\r\n"], [(408, KORE)]),
        ("kept alive, idle after an answer", "GET /v1/payments/{id}",
         [read("/v1/payments/0", close=False)], [(400, "invalid-request"), (408, KORE)]),
    ][n % 4]
    slow_row(idle, "slow clients", f"{what} ({n // 4 + 1})", route, dribble(parts, 0), expect,
             k if route.startswith("POST") else None)
for n in range(2):
    k = key()
    full = write(PAY, body_of(PAY), k)
    body = full[full.index(b"\r\n\r\n") + 4:]
    slow_row(slow, "slow clients", f"headers one byte every 0.2 s ({n + 1})",
             "POST /v1/payments", dribble([bytes([c]) for c in full], 0.2), [(408, KORE)], k)
    slow_row(slow, "slow clients", f"a body shorter than its Content-Length ({n + 1})",
             "POST /v1/payments", dribble([full[:-(len(body) // 2)]], 0), [(408, KORE)], k,
             BODY_TIMEOUT)
    slow_row(slow, "slow clients", f"a body one byte every 0.2 s ({n + 1})",
             "POST /v1/payments",
             dribble([full[:-len(body)]] + [bytes([c]) for c in body], 0.2),
             [(408, KORE)], k, BODY_TIMEOUT)

# Pipelined: Kore 4.1 reads one request per read of the socket; what came
# in the same read after a GET is dropped, after a POST it is read as more
# of its body (past its Content-Length), so the POST waits for the rest
# and gets Kore's 408. Nothing of them runs (docs/limits.md).
k1, k2, k3, k4 = key(), key(), key(), key()
for name, talk, expect, k in [
        ("three GETs in one write", [read("/v1/payments/0", close=False) * 3],
         [(400, "invalid-request"), (408, KORE)], None),
        ("two bad POSTs in one write",
         [write(ORD, b"{", k1, close=False) + write(ORD, b"[]", k1, close=False)],
         [(408, KORE)], k1),
        ("a bad POST, a bad key, a good order in one write",
         [write(ORD, b"{", k2, close=False) +
          write(ORD, body_of(ORD), "bad key", close=False) +
          write(ORD, body_of(ORD), k2, close=False)], [(408, KORE)], k2),
        ("a bad POST, then a good payment in one write",
         [write(PAY, b"[]", k3, close=False) + write(PAY, body_of(PAY), k3, close=False)],
         [(408, KORE)], k3),
        ("a GET, then a good payment in one write",
         [read("/v1/payments/0", close=False) + write(PAY, body_of(PAY), k4, close=False)],
         [(400, "invalid-request"), (408, KORE)], k4)]:
    slow_row(piped, "pipelined requests", name, "several", dribble(talk, 0), expect, k,
             HEADER_TIMEOUT + BODY_TIMEOUT)


def run_slow(rw):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", api.port)) as s:
        sender = threading.Thread(target=rw.raw, args=(s,), daemon=True)
        sender.start()
        data, closed = receive(s, rw.wait)
    rw.elapsed = time.monotonic() - start if closed else None
    rw.got = parse(data)


for batch, what in [(idle, "idle connections"), (slow, "slow senders"),
                    (piped, "pipelined requests")]:
    assert len(batch) <= 2 * CONNS
    before, _, _ = snapshot(None, "shop-1")
    threads = [threading.Thread(target=run_slow, args=(rw,)) for rw in batch]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    state, _, _ = snapshot(None, "shop-1")
    for i, rw in enumerate(batch, len(rows) + 1):
        _, key_left, calls = snapshot(rw.key, rw.client)
        check(rw, i, before, before, key_left, calls, rw.elapsed)
    t.eq(state, before, f"{len(batch)} {what} at once: nothing left in any table")
    rows += batch

# Kept alive, one request after another's answer: each answered in order.
k = key()
with socket.create_connection(("127.0.0.1", api.port)) as s:
    got = []
    for raw in (write(ORD, body_of(ORD), None, close=False),
                write(ORD, body_of(ORD), k, ctype=b"text/plain", close=False),
                write(ORD, b"{", k, close=False)):
        s.sendall(raw)
        s.settimeout(5)
        data = b""
        while not parse(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        got += parse(data)
rw = Row("pipelined requests", "three bad requests on one connection, each after "
         "the last answer", "POST /v1/orders", None, None, key=k)
rw.expect = [(400, "idempotency-key-missing"), (415, "unsupported-media-type"),
             (400, "invalid-json")]
rw.got = got
after, key_left, calls = snapshot(k, "shop-1")
check(rw, len(rows) + 1, state, after, key_left, calls)
rows.append(rw)
state = after


# 9. A client that disconnects at every step of a payment. Cut before its
# key is taken (mid-headers, mid-body, while the key is being taken), it
# leaves nothing; cut once the key is taken (while the provider thinks,
# while the outcome is being saved), its attempt keeps the lease until it
# expires, and the client's retry finishes the payment with the same
# derived key: one charge (docs/behaviour.md, "A client that disconnects").
provider.stop()
provider = Provider(port=provider.port, name="provider-slow",
                    IDEM_PROVIDER_LATENCY_MS=1500).start()
cat = "disconnects mid-payment"


def payment(k, rcpt):
    return write(PAY, json.dumps({"amount": 5000, "currency": "RUB", "recipient": rcpt}), k,
                 close=False)


def charges(rcpt):
    return int(db.run("select count(*) from provider.charges where recipient = "
                      f"{quote(rcpt)};")[0])


def retry_finishes(k, rcpt, what, cut_after_key):
    """The client's retry with the same key: at once a 409 while the cut
    attempt's lease holds, after it the payment, made once."""
    r = None
    if cut_after_key:
        r = post(api.port, PAY, {"amount": 5000, "currency": "RUB", "recipient": rcpt}, key=k)
        if r.status == 409:
            t.ok(r.headers.get("retry-after"),
                 f"{what}: a retry while the lease holds: 409 with Retry-After", r)
            wait_until(lambda: not key_row(k)["leased"], "the cut attempt's lease to end")
            r = None
        else:
            # The lease had ended before the retry came (a slow machine):
            # the retry took the key over (the next lease) and finished it.
            t.ok(r.status == 201 and key_row(k)["lease_id"] >= 2,
                 f"{what}: a retry once the lease ended takes the key over", r)
    if r is None:
        r = post(api.port, PAY, {"amount": 5000, "currency": "RUB", "recipient": rcpt},
                 key=k)
    t.ok(r.status == 201 and not r.replayed, f"{what}: the retry finishes the payment: 201", r)
    made = provider.charges(f"shop-1:{k}")
    t.ok(len(made) == 1 and r.json()["charge_id"] == made[0]["charge_id"] and
         charges(rcpt) == 1, f"{what}: one charge, the one the retry answers with", made)
    again = post(api.port, PAY, {"amount": 5000, "currency": "RUB", "recipient": rcpt}, key=k)
    t.ok(again.replayed and again.body == r.body, f"{what}: then replayed", again)


def cut(k, data):
    """Sends data and leaves; returns once the server has closed its end
    (the request read as far as it came, and freed)."""
    s = socket.create_connection(("127.0.0.1", api.port))
    s.sendall(data)
    wait_server_closed(api.port, s, "the server to close the cut connection")


for what, part in [("mid-headers", lambda raw: raw[:raw.index(b"Idempotency-Key") + 20]),
                   ("after the headers, before the body",
                    lambda raw: raw[:raw.index(b"\r\n\r\n") + 4]),
                   ("mid-body", lambda raw: raw[:-10])]:
    k, rcpt = key(), fresh("acc")
    before, _, _ = snapshot(None, "shop-1")
    cut(k, part(payment(k, rcpt)))
    after, key_left, calls = snapshot(k, "shop-1")
    rw = Row(cat, what, "POST /v1/payments", None, None, key=k)
    rw.got = []
    check(rw, len(rows) + 1, before, after, key_left, calls)
    rows.append(rw)
    retry_finishes(k, rcpt, f"{cat}: {what}", False)


def blocked(fn):
    return int(db.run("select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
                      f" and query like {quote('%' + fn + '(%')};")[0])


# While the key is being taken: lease_reserve_v2() waits on a lock of the key
# table. The cut request's statement is not cancelled (the service sends no
# cancel): the server ends it at lock_timeout, its answer read and
# dropped, and nothing is written.
k, rcpt = key(), fresh("acc")
before, _, _ = snapshot(None, "shop-1")
lock = PsqlSession()
lock.run("begin; lock table idempotency_keys in share mode;")
with socket.create_connection(("127.0.0.1", api.port)) as s:
    s.sendall(payment(k, rcpt))
    wait_until(lambda: blocked("lease_reserve_v2") == 1, "the reserve to wait on the lock")
wait_until(lambda: blocked("lease_reserve_v2") == 0, "the cut request's reserve to end")
lock.run("commit;")
lock.close()
after, key_left, calls = snapshot(k, "shop-1")
rw = Row(cat, "while the key is being taken", "POST /v1/payments", None, None, key=k)
rw.got = []
check(rw, len(rows) + 1, before, after, key_left, calls)
rows.append(rw)
retry_finishes(k, rcpt, f"{cat}: while the key is being taken", False)

# While the provider thinks (1.5 s): the key is taken, the charge made.
# The payment's completion is held (a lock on the payments table it
# writes) until the key's state is read, whatever the machine's speed: on
# an instance of its own whose statements wait up to HOLD_BOUND (this
# one's end at the default 5 s, a held completion too, as the sections
# around it need), and whose lease and provider bound outlast the steps.
HOLD_BOUND = 60
held = Api(name="catalogue-held", IDEM_PROVIDER_URL=provider.url,
           IDEM_LEASE_SECONDS=2 * HOLD_BOUND, IDEM_PROVIDER_TIMEOUT_MS=HOLD_BOUND * 1000,
           IDEM_DB_TIMEOUT_MS=HOLD_BOUND * 1000).start()
k, rcpt = key(), fresh("acc")
hold = PsqlSession()
hold.run("begin; lock table payments in share mode;")
with socket.create_connection(("127.0.0.1", held.port)) as s:
    s.sendall(payment(k, rcpt))
    wait_until(lambda: provider_calls(f"shop-1:{k}") == 1, "the provider to get the charge")
row_ = key_row(k)
t.ok(row_ and row_["status"] == "in_progress" and row_["lease_id"] == 1,
     f"{cat}: while the provider thinks: the key stays in_progress, under its "
     "attempt's lease", row_)
hold.run("commit;")
hold.close()
wait_until(lambda: charges(rcpt) == 1, "the provider to make the charge")
rw = Row(cat, "while the provider thinks", "POST /v1/payments", None, None, key=k)
rw.got = []
rows.append(rw)
# Its provider call was sent: the worker finishes the payment without the
# client (src/lease/handoff.c); the retry replays it: one charge.
wait_until(lambda: key_row(k)["status"] == "done",
           "the worker to finish the payment without its client")
r = post(held.port, PAY, {"amount": 5000, "currency": "RUB", "recipient": rcpt}, key=k)
made = provider.charges(f"shop-1:{k}")
t.ok(r.status == 201 and r.replayed and len(made) == 1 and
     r.json()["charge_id"] == made[0]["charge_id"] and charges(rcpt) == 1,
     f"{cat}: while the provider thinks: the worker finished it, the retry replays "
     "the one charge", (r, made))
held.stop()

# While the outcome is being saved: lease_complete() waits on a lock of
# the payments table. The cut request's statement runs on to the server's
# lock_timeout and saves nothing; the key stays in progress until its lease
# ends, and the client's retry finishes the payment, unless the recovery
# job (its lease ended while the test waited) has already saved the
# outcome: then the retry replays it. Either way, one charge.
k, rcpt = key(), fresh("acc")
lock = PsqlSession()
lock.run("begin; lock table payments in share mode;")
with socket.create_connection(("127.0.0.1", api.port)) as s:
    s.sendall(payment(k, rcpt))
    wait_until(lambda: blocked("lease_complete") == 1, "the completion to wait on the lock")
wait_until(lambda: blocked("lease_complete") == 0, "the cut completion to end")
lock.run("commit;")
lock.close()
row_ = key_row(k)
t.ok(row_ and row_["status"] in ("in_progress", "done") and charges(rcpt) == 1,
     f"{cat}: while the outcome is saved: one charge, the key in progress (or finished "
     "by the recovery job)", row_)
rw = Row(cat, "while the outcome is being saved", "POST /v1/payments", None, None, key=k)
rw.got = []
rows.append(rw)
if row_ and row_["status"] == "done":
    r = post(api.port, PAY, {"amount": 5000, "currency": "RUB", "recipient": rcpt}, key=k)
    made = provider.charges(f"shop-1:{k}")
    t.ok(r.status == 201 and r.replayed and len(made) == 1 and
         r.json()["charge_id"] == made[0]["charge_id"],
         f"{cat}: while the outcome is being saved: the retry replays the one charge", r)
elif row_ and row_["leased"]:
    retry_finishes(k, rcpt, f"{cat}: while the outcome is being saved", True)
else:
    retry_finishes(k, rcpt, f"{cat}: while the outcome is being saved", False)

# No worker died on any of it.
t.eq(sorted(api.workers()), workers, "the same workers as at the start: none died")
log = api.read_log()
crash = r"\) gone|died from|restarting worker|database call failed \(22"
t.ok(not re.search(crash, log), "the API's log has no worker that went, and no query refused"
     " for its bytes", "\n".join(l for l in log.splitlines() if re.search(crash, l)))
t.ok(all(a.status != 500 for rw in rows for a in (rw.got or [])), "no row was answered 500")

api.stop()
provider.stop()
db.close()

# The result, by category: rows, and the answers they got, by kind.
KINDS = ("problem+json", "Kore's bare answer", "served (a limit itself)")
order, tally = [], {}
for rw in rows + [None]:
    for c in ([rw.cat, "all"] if rw else []):
        if c not in tally:
            order.append(c)
            tally[c] = {"rows": 0, "none": 0, **{kind: {} for kind in KINDS}}
        tally[c]["rows"] += 1
        tally[c]["none"] += not rw.got
        for a in rw.got:
            ctype = a.headers.get("content-type")
            kind = KINDS[0] if ctype == "application/problem+json" else \
                KINDS[1] if ctype is None else KINDS[2]
            tally[c][kind][a.status] = tally[c][kind].get(a.status, 0) + 1
order.remove("all")
order.append("all")
lines = [("category", "rows") + KINDS + ("no answer",)]
for c in order:
    lines.append((c, str(tally[c]["rows"])) +
                 tuple(", ".join(f"{st} ×{n}" for st, n in sorted(tally[c][kind].items()))
                       for kind in KINDS) + (str(tally[c]["none"] or ""),))
width = [max(len(r[i]) for r in lines) for i in range(len(lines[0]))]
out = ["| " + " | ".join(c.ljust(w) for c, w in zip(lines[0], width)) + " |",
       "|" + "|".join("-" * (w + 2) for w in width) + "|"]
out += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |" for r in lines[1:]]
print("\n".join(out), file=sys.stderr)
t.done()
