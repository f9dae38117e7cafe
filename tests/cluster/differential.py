"""Differential testing of the edge (haproxy, conf/haproxy.cfg) against
the instances behind it (Kore 4.1): a seeded, reproducible generator of
malformed and borderline requests (methods as sent, bodies on every
method, lengths that lie, two lengths, chunked framing, pipelining,
folded and empty headers, no Host, control bytes and bytes past ASCII, header
counts and sizes, requests smuggled in a body around and past Kore's
4 KiB read, HTTP/1.1 plain and over TLS, HTTP/2 through TLS with curl),
sent through the edge. The verdict reads no answer; it compares the two
logs and the database:

- every access line an instance wrote during the run carries a request
  id the edge logged as forwarded, and each such id once (one to one);
  a request the edge never saw has none (a health check's GET /healthz
  aside, which does not pass the frontend);
- every request the edge logged as forwarded has its access line;
- no key of the run was taken unless an access line of an edge-forwarded
  request created it (a refused or smuggled request takes none).

run(cases, seed) returns (failures, stats); each failure names the
case's seed and number, so that it is replayed with the same seed and
kept in REGRESSIONS. Environment: IDEM_PORT, IDEM_TLS_PORT,
IDEM_TEST_TLS_CA, IDEM_TEST_TMP (haproxy.log and api*.log), and
IDEM_TEST_DATABASE_URL (tests/lib/harness.py)."""

import glob
import os
import random
import re
import socket
import ssl
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, sql, wait_until)  # noqa: E402

PORT = int(os.environ["IDEM_PORT"])
TLS_PORT = int(os.environ["IDEM_TLS_PORT"])
CA = os.environ["IDEM_TEST_TLS_CA"]
TMP = os.environ["IDEM_TEST_TMP"]
# Bounds on a hang only: no verdict waits on them.
SOCKET_BOUND = 12
CURL_BOUND = 20
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

# Cases a run found once, replayed in every run: (seed, case number).
REGRESSIONS = []

BODY = b'{"customer_id":"c-diff","amount":100,"currency":"RUB"}'


def fields(line, marker):
    return dict(FIELD.findall(line.split(marker, 1)[1]))


def order(key, method=b"POST", token=b"dev-shop-1", close=True, body=BODY):
    return (method + b" /v1/orders HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Authorization: Bearer " + token + b"\r\nIdempotency-Key: " + key +
            b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body) +
            (b"Connection: close\r\n" if close else b"") + b"\r\n" + body)


class Case:
    def __init__(self, seed, n, rng, run):
        self.seed, self.n = seed, n
        self.key = f"diff-{run}-{seed}-{n}".encode()
        self.smuggled_key = self.key + b"-s"
        self.what = []
        self.h2 = rng.random() < 0.04
        self.tls = self.h2 or rng.random() < 0.3
        self.raw = self.h2_args = None
        if self.h2:
            self.make_h2(rng)
        else:
            self.make_h1(rng)

    def pick(self, rng, name, options):
        i = rng.randrange(len(options))
        self.what.append(f"{name}={i}")
        return options[i]

    def make_h1(self, rng):
        method = self.pick(rng, "method", [b"GET", b"POST", b"POST", b"POST", b"HEAD",
                                           b"DELETE", b"OPTIONS", b"PUT", b"PATCH", b"post",
                                           b"Get", b"TRACE", b"FOO"])
        path = self.pick(rng, "path", [b"/v1/orders", b"/v1/orders?customer_id=c-diff",
                                       b"/v1/payments/x", b"/v1/bonuses/c-diff", b"/healthz",
                                       b"/nowhere", b"/v1/orders?" + b"p" * 990,
                                       b"/v1/orders?" + b"p" * 1000, b"/v1/orders%00x",
                                       b"/v1/orders?q=\xc3\xa9"])
        version = self.pick(rng, "version", [b"HTTP/1.1"] * 8 + [b"HTTP/1.0", b"HTTP/1.2"])
        host = self.pick(rng, "host", [b"127.0.0.1"] * 9 + [None])
        hs = [(b"Host", host)] if host is not None else []
        auth = self.pick(rng, "auth", [b"Bearer dev-shop-1"] * 5 + [
            None, b"", b"Bearer dev-shop-1\x00x", b"Bearer\tdev-shop-1", b"Bearer nope",
            b"Bearer dev-shop-1\xff"])
        if auth is not None:
            hs.append((b"Authorization", auth))
        if self.pick(rng, "auth2", [False] * 9 + [True]):
            hs.append((b"Authorization", b"Bearer dev-shop-2"))
        key = self.pick(rng, "key", [self.key] * 5 + [
            None, b"", self.key + b"\x00x", self.key + b"\tx", b'"' + self.key + b'"',
            self.key + b"\x7f", b"k" * 256])
        if key is not None:
            hs.append((b"Idempotency-Key", key))
        if self.pick(rng, "key2", [False] * 9 + [True]):
            hs.append((b"Idempotency-Key", self.key + b"-2"))
        hs.append((b"Content-Type", self.pick(rng, "ctype", [b"application/json"] * 4 +
                                                [b"text/plain", b""])))
        for i in range(self.pick(rng, "extra", [0, 0, 0, 1, 5, 14, 16, 17, 18, 22, 30])):
            hs.append((b"X-Filler-%d" % i, b"f" * rng.choice([1, 10, 150, 200])))
        odd = self.pick(rng, "odd", [None] * 6 + [
            b"X-Fold: a\r\n b", b"X-Empty:", b"X-Tab: a\tb", b"X-Ctl: a\x01b",
            b"X-High: \xc3\xa9", b"Bad Name: x", b"NoColon", b"X-Space : x",
            b"X-Long: " + b"l" * 2900, b"Host: other", b"Expect: 100-continue",
            b"Connection: keep-alive, Upgrade\r\nUpgrade: h2c"])
        if odd is not None:
            hs.append(tuple(odd.split(b":", 1)) if b":" in odd else (odd, None))

        body = BODY
        smuggle = self.pick(rng, "smuggle", [None] * 5 + ["4k", "4k-", "4k+", "past", "start"])
        if smuggle is not None:
            inner = order(self.smuggled_key)
            head_len = len(self.assemble(method, path, version, hs, None, b"", close=True))
            target = {"4k": 4096, "4k-": 4096 - rng.randrange(1, 300),
                      "4k+": 4096 + rng.randrange(1, 300), "past": 8192,
                      "start": head_len + 30}[smuggle]
            pad = max(0, target - head_len - 30)
            body = b"z" * pad + inner
        framing = self.pick(rng, "framing", ["cl"] * 6 + [
            "none", "zero", "short", "two-same", "two-differ", "chunked", "chunked+cl",
            "cl-space", "cl-plus", "cl-neg"])
        if method in (b"GET", b"HEAD", b"DELETE", b"OPTIONS") and smuggle is None and \
                framing == "cl" and rng.random() < 0.7:
            framing = "none"
        self.raw = self.assemble(method, path, version, hs, framing, body, close=True)
        pipe = self.pick(rng, "pipeline", [None] * 7 + ["get", "post", "smuggled"])
        if pipe is not None:
            first = self.assemble(method, path, version, hs, framing, body, close=False)
            second = {"get": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                             b"Connection: close\r\n\r\n",
                      "post": order(self.key + b"-p"),
                      "smuggled": order(self.smuggled_key, token=b"dev-shop-1\x00x")}[pipe]
            self.raw = first + second

    def assemble(self, method, path, version, hs, framing, body, close):
        lines = [method + b" " + path + b" " + version]
        for k, v in hs:
            lines.append(k if v is None else k + b": " + v.lstrip() if v else k + b":")
        if framing in (None, "none"):
            body = b""
        elif framing == "zero":
            lines.append(b"Content-Length: 0")
            body = b""
        elif framing == "cl":
            lines.append(b"Content-Length: %d" % len(body))
        elif framing == "short":
            lines.append(b"Content-Length: %d" % max(0, len(body) - 10))
        elif framing == "two-same":
            lines += [b"Content-Length: %d" % len(body)] * 2
        elif framing == "two-differ":
            lines += [b"Content-Length: %d" % len(body), b"Content-Length: 3"]
        elif framing == "chunked":
            lines.append(b"Transfer-Encoding: chunked")
            body = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
        elif framing == "chunked+cl":
            lines += [b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(body)]
        elif framing == "cl-space":
            lines.append(b"Content-Length:  %d " % len(body))
        elif framing == "cl-plus":
            lines.append(b"Content-Length: +%d" % len(body))
        elif framing == "cl-neg":
            lines.append(b"Content-Length: -1")
        if close:
            lines.append(b"Connection: close")
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    def make_h2(self, rng):
        method = self.pick(rng, "h2method", ["GET", "POST", "DELETE", "OPTIONS", "post", "PUT"])
        path = self.pick(rng, "h2path", ["/v1/orders", "/v1/orders?customer_id=c-diff",
                                         "/healthz", "/v1/payments/x"])
        args = ["-X", method, "-H", "Content-Type: application/json"]
        args += self.pick(rng, "h2auth", [["-H", "Authorization: Bearer dev-shop-1"]] * 3 + [
            ["-H", "Authorization;"], ["-H", "Authorization: Bearer dev-shop-1",
                                       "-H", "Authorization: Bearer dev-shop-2"]])
        args += self.pick(rng, "h2key", [["-H", "Idempotency-Key: " + self.key.decode()]] * 3 + [
            ["-H", "Idempotency-Key;"], ["-H", "Idempotency-Key: a\tb"]])
        body = self.pick(rng, "h2body", [None, BODY, BODY, b"x" * 65536,
                                         b"z" * 4000 + order(self.smuggled_key)])
        if body is not None:
            args += ["--data-binary", "@-"]
        self.h2_args, self.h2_body = args + [f"https://127.0.0.1:{TLS_PORT}{path}"], body

    def send(self):
        if self.h2:
            try:
                subprocess.run(["curl", "-s", "-o", "/dev/null", "--http2", "--cacert", CA,
                                "--max-time", str(CURL_BOUND)] + self.h2_args,
                               input=self.h2_body or b"", capture_output=True,
                               timeout=CURL_BOUND + 5)
            except subprocess.TimeoutExpired:
                pass
            return
        try:
            s = socket.create_connection(("127.0.0.1", TLS_PORT if self.tls else PORT),
                                         timeout=SOCKET_BOUND)
            if self.tls:
                ctx = ssl.create_default_context(cafile=CA)
                ctx.set_alpn_protocols(["http/1.1"])
                s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
            s.sendall(self.raw)
            while s.recv(65536):
                pass
        except (OSError, ssl.SSLError):
            pass
        finally:
            try:
                s.close()
            except Exception:
                pass

    def name(self):
        return f"seed {self.seed} case {self.n} ({'h2' if self.h2 else 'tls' if self.tls else 'h1'}" \
               f": {' '.join(self.what)})"


def log_sizes():
    return {p: os.path.getsize(p) for p in glob.glob(os.path.join(TMP, "*.log"))}


def read_new(sizes, pattern):
    out = []
    for p in sorted(glob.glob(os.path.join(TMP, pattern))):
        with open(p, "rb") as f:
            f.seek(sizes.get(p, 0))
            out += f.read().decode(errors="replace").splitlines()
    return out


def edge_lines(sizes):
    return [fields(l, "edge ") for l in read_new(sizes, "haproxy.log") if "edge time=" in l]


def access_lines(sizes):
    return [fields(l, " access ") for l in read_new(sizes, "api*.log") if " access time=" in l]


def run(cases, seed, threads=6, extra=()):
    """Sends `cases` generated cases from `seed` (and the (seed, n) pairs
    of extra), then the verdict. Returns (failures, stats)."""
    run_id = "%x" % random.SystemRandom().getrandbits(32)
    made = [Case(seed, n, random.Random(f"{seed}-{n}"), run_id) for n in range(cases)]
    made += [Case(s, n, random.Random(f"{s}-{n}"), run_id) for s, n in extra]
    sizes = log_sizes()
    todo = list(made)
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                c = todo.pop()
            c.send()

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()

    def forwarded():
        return {e["request_id"] for e in edge_lines(sizes)
                if e.get("server") not in (None, "<NOSRV>") and e.get("request_id") != "-"}

    def seen():
        return {a.get("request_id") for a in access_lines(sizes)}

    # Each access line is written when Kore frees the request, each edge
    # line when haproxy ends the stream: both may follow the answers.
    try:
        wait_until(lambda: forwarded() <= seen(), "every forwarded request's access line",
                   timeout=JOB_BOUND)
    except TimeoutError:
        pass

    failures = []
    edges = edge_lines(sizes)
    fwd = {}
    for e in edges:
        if e.get("server") not in (None, "<NOSRV>"):
            fwd[e.get("request_id")] = e
    ids = {}
    for a in access_lines(sizes):
        rid = a.get("request_id", "-")
        if rid == "-":
            if not (a.get("method") == "GET" and a.get("path") == "/healthz"):
                failures.append(f"an instance handled a request the edge never saw: {a}")
            continue
        ids[rid] = ids.get(rid, 0) + 1
        if rid not in fwd:
            failures.append(f"an access line's request_id is not one the edge forwarded: {a}")
    for rid, n in ids.items():
        if n > 1:
            failures.append(f"request_id {rid} handled {n} times")
    for rid, e in fwd.items():
        if rid not in ids:
            failures.append(f"forwarded by the edge, no access line: {e}")
        elif not UUID.match(rid):
            failures.append(f"not an edge id: {rid}")
    created = {a.get("key") for a in access_lines(sizes)
               if a.get("request_id", "-") in fwd and a.get("outcome") == "created"}
    rows = sql(f"select idem_key from idempotency_keys where idem_key like 'diff-{run_id}-%'")
    by_key = {c.key.decode(): c for c in made}
    by_key.update({c.smuggled_key.decode(): c for c in made})
    for (k,) in rows:
        if k not in created:
            base = k[:-2] if k.endswith(("-s", "-p", "-2")) else k
            c = by_key.get(base)
            failures.append(f"key {k} taken without an edge-forwarded request that created it"
                            f" ({c.name() if c else 'no such case'})")
    stats = {"cases": len(made), "edge_lines": len(edges), "forwarded": len(fwd),
             "handled": sum(ids.values()), "keys": len(rows)}
    return failures, stats


if __name__ == "__main__":
    # make test-edge: a long run against a running make cluster.
    n = int(os.environ.get("IDEM_EDGE_CASES", "5000"))
    seed = int(os.environ.get("IDEM_EDGE_SEED", str(int(time.time()))))
    fails, st = run(n, seed, extra=REGRESSIONS)
    print(f"# seed {seed}: {st}")
    for f in fails[:50]:
        print("not ok:", f)
    print("ok" if not fails else f"{len(fails)} failures")
    sys.exit(1 if fails else 0)
