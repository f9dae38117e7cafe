"""The canonical JSON behind the fingerprint equals, byte for byte, Python's
json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False),
checked against python3 as the oracle over generated documents: non-ASCII,
escapes, \\u sequences and surrogate pairs, control characters, nesting,
large integers, floats. The dev build exposes the canonical form at
POST /dev/canonical-json for this."""

import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, request  # noqa: E402

t = Tap()
api = Api().start()
rnd = random.Random(20261130)
DOCUMENTS = 600

ALPHABET = (['"', "\\", "/", "\b", "\f", "\n", "\r", "\t", "\x00", "\x01", "\x1f",
             "\x7f", "\u2028", "\u2029", "é", "ж", "€", "\ufeff", "\uffff",
             "😀", "\U0010ffff", "𝄞", " ", "a", "Z", "0", "{", "]", ":", ","])


def text():
    out = []
    for _ in range(rnd.randint(0, 12)):
        if rnd.random() < 0.5:
            out.append(rnd.choice(ALPHABET))
        else:
            cp = rnd.choice([rnd.randint(0x20, 0x7e), rnd.randint(0xa0, 0xd7ff),
                             rnd.randint(0xe000, 0xfffd), rnd.randint(0x10000, 0x10ffff)])
            out.append(chr(cp))
    return "".join(out)


def number():
    kind = rnd.randint(0, 5)
    if kind == 0:
        return rnd.randint(-10, 10)
    if kind == 1:
        return rnd.randint(-(10 ** 300), 10 ** 300)
    if kind == 2:
        return rnd.choice([2 ** 53 - 1, 2 ** 53, 2 ** 63, -(2 ** 64), 10 ** 30])
    if kind == 3:
        return rnd.choice([0.0, -0.0, 0.1, 1.5, 1e16, 1e15, 1e-4, 1e-5, 123456.789,
                           5e-324, 1.7976931348623157e308, 2.5e-7, 1e22, 100.0])
    while True:
        d = struct.unpack("<d", struct.pack("<Q", rnd.getrandbits(64)))[0]
        if d == d and d not in (float("inf"), float("-inf")):
            return d


def value(depth=0):
    kind = rnd.randint(0, 9 if depth < 5 else 5)
    if kind <= 1:
        return text()
    if kind <= 3:
        return number()
    if kind == 4:
        return rnd.choice([True, False, None])
    if kind == 5:
        return text()
    if kind <= 7:
        return {text(): value(depth + 1) for _ in range(rnd.randint(0, 6))}
    return [value(depth + 1) for _ in range(rnd.randint(0, 6))]


def serialise(doc):
    """The same document as different clients would send it."""
    style = rnd.randint(0, 3)
    if style == 0:
        return json.dumps(doc, ensure_ascii=True).encode()
    if style == 1:
        return json.dumps(doc, ensure_ascii=False).encode()
    if style == 2:
        return json.dumps(doc, ensure_ascii=True, indent=2).encode()
    items = list(doc.items())
    rnd.shuffle(items)
    return json.dumps(dict(items), ensure_ascii=False, indent="\t").encode()


mismatches = []
for i in range(DOCUMENTS):
    doc = {text(): value() for _ in range(rnd.randint(1, 6))}
    raw = serialise(doc)
    want = json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode()
    r = request(api.port, "POST", "/dev/canonical-json", raw,
                {"Content-Type": "application/json"})
    if r.status != 200 or r.body != want:
        mismatches.append((raw, r.status, r.body, want))

t.eq(len(mismatches), 0, f"{DOCUMENTS} generated documents: canonical form equals Python's")
for raw, status, got, want in mismatches[:3]:
    t.note(f"sent {raw[:200]!r}\ngot {status} {got[:200]!r}\nwant {want[:200]!r}")

# Hand-picked cases.
for raw, want in [
        (b'{"b":1,"a":2}', b'{"a":2,"b":1}'),
        (b'{"a":"\\u00e9\\ud83d\\ude00"}', '{"a":"é😀"}'.encode()),
        (b'{"a":"\\u0000\\u001f\\u007f"}', b'{"a":"\\u0000\\u001f\x7f"}'),
        (b'{"a":"\\/"}', b'{"a":"/"}'),
        (b'{"a":-0,"b":-0.0,"c":1E2,"d":1e-7}', b'{"a":0,"b":-0.0,"c":100.0,"d":1e-07}'),
        (b'{"\xc3\xa9":1,"z":2,"\xf0\x9f\x98\x80":3,"Z":4}',
         '{"Z":4,"z":2,"é":1,"😀":3}'.encode()),
        (b' [ 1 , {"x" : [ ] } ] ', b'[1,{"x":[]}]')]:
    r = request(api.port, "POST", "/dev/canonical-json", raw,
                {"Content-Type": "application/json"})
    t.eq(r.body, want, f"canonical form of {raw!r}")
    t.eq(json.dumps(json.loads(raw), sort_keys=True, separators=(",", ":"),
                    ensure_ascii=False).encode(), want, f"(and Python agrees on {raw!r})")

for raw in [b'{"a":"\\ud800"}', b'{"a":"\\udc00x"}', b'{"a":"\xed\xa0\x80"}',
            b'{"a":"\xc0\xaf"}', b'{"a":"\xf4\x90\x80\x80"}', b'{"a":1e999}',
            b'[' * 40 + b']' * 40]:
    r = request(api.port, "POST", "/dev/canonical-json", raw,
                {"Content-Type": "application/json"})
    t.eq(r.status, 400, f"rejected: {raw[:30]!r}")

api.stop()
t.done()
