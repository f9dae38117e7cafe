"""What the HTTP tests are made of: TAP output, the real API and fake
provider processes (kore, started and killed with real signals), HTTP over
loopback, and psql against the throwaway database of `make test`.

Only the Python standard library is used, and Debian's python3-jsonschema
for the check of every API response against docs/openapi.json
(tests/lib/openapi.py): a response the document does not describe fails
the test that received it, in Tap.done().
"""

import atexit
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DB_URL = os.environ.get("IDEM_TEST_DATABASE_URL", "")
TMP = os.environ.get("IDEM_TEST_TMP", "/tmp")
TOKENS = {"shop-1": "dev-shop-1", "shop-2": "dev-shop-2"}
# Every timeout in a test is a bound on a hang, never a verdict on speed:
# a test waits for a condition (a row, a log line, a state the service
# reports) and fails on its bound only when that condition never comes.
# The bounds are named here, or as a module's own *_BOUND with the reason
# for its size.
#
# WAIT_SECONDS, wait_until()'s and Background's default: a condition that
# needs no more than the service's own work (a request, a statement, a
# worker's start), typically well under a second on a quiet machine and a
# few seconds beside make test-loaded's CPU hog.
WAIT_SECONDS = 20
# ANSWER_BOUND: a request that waits, on purpose, for one of the service's
# stated timeouts before it answers (IDEM_DB_TIMEOUT_MS, a lock wait, the
# provider's timeout, a test's slowed provider): its answer comes after
# that timeout, so its bound is above it.
ANSWER_BOUND = 30
# JOB_BOUND: a condition reached through the service's background jobs
# (recovery, cleanup, reconcile): their interval, a lease's expiry and the
# retry backoff come before it, several seconds by design.
JOB_BOUND = 60
# REQUEST_BOUND: request()'s socket timeout, and concurrently()'s bound:
# a request that may wait out one of the stated timeouts above, in a queue
# behind others that do.
REQUEST_BOUND = 60
# HEALTH_BOUND: one GET /healthz, which the service promises to answer
# (200 or 503) within a second whatever the database does
# (docs/operations.md): a stated bound, kept with a margin.
HEALTH_BOUND = 5
# COMMAND_BOUND: one command a test runs and waits for (make, psql, a
# client script): seconds; a test whose command builds or starts a cluster
# names a bound of its own.
COMMAND_BOUND = 300
# EXIT_BOUND: a process told to stop (SIGTERM, SIGKILL, its parent gone,
# its stdin closed) to exit.
EXIT_BOUND = 15
# CONNECT_BOUND: a connection a test's proxy or gateway makes to a server
# on loopback (PostgreSQL, a provider) to pass a client's on.
CONNECT_BOUND = 30
# NETNS_TEST_BOUND: a whole test run again inside a network namespace.
NETNS_TEST_BOUND = 600


# --- TAP --------------------------------------------------------------------

class Tap:
    """Test Anything Protocol output; the plan is printed at the end."""

    def __init__(self):
        self.count = 0
        self.failed = 0
        if not DB_URL:
            print("Bail out! IDEM_TEST_DATABASE_URL is not set: run make test")
            sys.exit(255)

    def ok(self, cond, name, diag=None):
        self.count += 1
        if cond:
            print(f"ok {self.count} - {name}")
        else:
            self.failed += 1
            print(f"not ok {self.count} - {name}")
            if diag is not None:
                for line in str(diag).splitlines():
                    print(f"#   {line}")
        sys.stdout.flush()
        return cond

    def eq(self, got, want, name):
        return self.ok(got == want, name, f"got:  {got!r}\nwant: {want!r}")

    def note(self, text):
        for line in str(text).splitlines():
            print(f"# {line}")
        sys.stdout.flush()

    def done(self):
        if _checked[0] or _mismatches:
            self.ok(not _mismatches, f"the API requests and {_checked[0]} responses of this "
                    "test agree with docs/openapi.json", "\n".join(_mismatches))
        print(f"1..{self.count}")
        sys.stdout.flush()
        sys.exit(1 if self.failed else 0)


def wait_until(cond, what, timeout=WAIT_SECONDS, interval=0.01, show=None):
    """Polls cond() until it is truthy; raises if it never becomes so,
    saying what show() (the state waited on: a count, a row) last read."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            last = f" (last: {show()})" if show is not None else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{last}")
        time.sleep(interval)


def fingerprint(fields):
    """The contract's fingerprint, computed the way a client would."""
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()


def new_key(prefix="k"):
    return f"{prefix}-{uuid.uuid4()}"


# --- HTTP -------------------------------------------------------------------

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    @property
    def replayed(self):
        return self.headers.get("idempotent-replayed") == "true"

    def __repr__(self):
        return f"<{self.status} {self.body[:300]!r}>"


# The ports of the APIs this test started (Api): their responses are
# checked against the OpenAPI document, the fake provider's are not.
_api_ports = set()
_checked = [0]
_mismatches = []


# Ports served over TLS (make cluster's haproxy): port -> an SSL context
# that verifies the chain against the cluster's CA and the name 127.0.0.1.
_tls_ports = {}


def cluster_port():
    """The port make cluster's clients use: haproxy's HTTPS port, its
    certificate verified against IDEM_TEST_TLS_CA, when that is set
    (make test-cluster sets it); else its plain HTTP port."""
    ca = os.environ.get("IDEM_TEST_TLS_CA")
    if not ca:
        return int(os.environ["IDEM_PORT"])
    port = int(os.environ["IDEM_TLS_PORT"])
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    _tls_ports[port] = ctx
    return port


def request(port, method, path, body=None, headers=None, timeout=REQUEST_BOUND,
            bad=False):
    """One request; to an API this test started it must agree with the
    document (tests/lib/openapi.py, check_request) unless bad=True says the
    test sends bad input on purpose: a test that sends what the document
    forbids by mistake fails in Tap.done()."""
    if port in _api_ports and not bad:
        check_request(method, path, headers, body)
    if port in _tls_ports:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout,
                                           context=_tls_ports[port])
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
        if port in _api_ports:
            check_openapi(method, path, resp.status, hdrs, data)
        return Response(resp.status, hdrs, data)
    finally:
        conn.close()


def check_openapi(method, path, status, headers, body):
    """Records a response that does not agree with docs/openapi.json; the
    test fails in Tap.done(). Also for responses read off a raw socket."""
    import openapi  # tests/lib/openapi.py: jsonschema, loaded on first use

    _checked[0] += 1
    why = openapi.check(method, path, status, headers, body)
    if why is not None:
        _mismatches.append(why)
        print(f"# openapi mismatch: {why}")
        sys.stdout.flush()


def check_request(method, path, headers, body):
    """Records a request that does not agree with docs/openapi.json; the
    test fails in Tap.done()."""
    import openapi

    why = openapi.check_request(method, path, headers,
                                body.decode(errors="replace")
                                if isinstance(body, bytes) else body)
    if why is not None:
        _mismatches.append(why + " (bad input on purpose: bad=True)")
        print(f"# openapi mismatch: {why}")
        sys.stdout.flush()


def post(port, path, body, key=None, client="shop-1", token=None,
         content_type="application/json", headers=None, timeout=REQUEST_BOUND,
         bad=False):
    """POSTs body (a dict is sent as JSON) with the client's token."""
    hdrs = {}
    if token is None:
        token = TOKENS[client]
    if token is not False:
        hdrs["Authorization"] = f"Bearer {token}"
    if key is not None:
        hdrs["Idempotency-Key"] = key
    if content_type is not None:
        hdrs["Content-Type"] = content_type
    hdrs.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    return request(port, "POST", path, body, hdrs, timeout, bad=bad)


def send_and_keep(port, path, body, key, client="shop-1"):
    """A POST sent on a raw socket, kept open, its answer never read: the
    test closes it when it chooses (a client that leaves)."""
    payload = json.dumps(body).encode()
    check_request("POST", path, {"Authorization": f"Bearer {TOKENS[client]}",
                                 "Idempotency-Key": key,
                                 "Content-Type": "application/json"}, payload)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
              b"Authorization: Bearer " + TOKENS[client].encode() + b"\r\n"
              b"Idempotency-Key: " + key.encode() + b"\r\n"
              b"Content-Type: application/json\r\n"
              b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    return s


def get(port, path, client="shop-1", timeout=REQUEST_BOUND, bad=False):
    return request(port, "GET", path, None,
                   {"Authorization": f"Bearer {TOKENS[client]}"}, timeout,
                   bad=bad)


class Background:
    """A request running in a thread; done() tells if it has answered."""

    def __init__(self, fn, *args, **kwargs):
        self.result = None
        self.error = None
        self._thread = threading.Thread(target=self._run, args=(fn, args, kwargs),
                                        daemon=True)
        self._thread.start()

    def _run(self, fn, args, kwargs):
        try:
            self.result = fn(*args, **kwargs)
        except Exception as e:  # reported by wait()
            self.error = e

    def done(self):
        return not self._thread.is_alive()

    def cut(self, timeout=WAIT_SECONDS):
        """Waits for a request whose server was killed: true if it got no
        answer (the connection was closed under it)."""
        self._thread.join(timeout)
        return not self._thread.is_alive() and self.result is None and \
            isinstance(self.error, (ConnectionError, http.client.HTTPException))

    def wait(self, timeout=WAIT_SECONDS):
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError("request did not answer")
        if self.error is not None:
            raise self.error
        return self.result


def concurrently(n, fn, *args, **kwargs):
    """Runs fn n times at once (released together by a barrier)."""
    barrier = threading.Barrier(n)

    def go():
        barrier.wait()
        return fn(*args, **kwargs)

    jobs = [Background(go) for _ in range(n)]
    return [j.wait(REQUEST_BOUND) for j in jobs]


# --- PostgreSQL -------------------------------------------------------------

def sql(query):
    """Runs query with psql; returns the rows as lists of strings."""
    out = subprocess.run(
        ["psql", DB_URL, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
         "-F", "\x1f", "-c", query],
        check=True, capture_output=True, text=True).stdout
    return [line.split("\x1f") for line in out.splitlines() if line != ""]


def sql_value(query):
    rows = sql(query)
    return rows[0][0] if rows else None


def quote(s):
    return "'" + str(s).replace("'", "''") + "'"


class PsqlSession:
    """An open psql session, to hold a transaction while a test acts."""

    # Its own waits for a lock end (an error, the test failed) rather than
    # hang: a bound on a hang, far above any wait a test means.
    LOCK_BOUND_S = 60

    def __init__(self):
        env = dict(os.environ)
        env["PGOPTIONS"] = (env.get("PGOPTIONS", "") +
                            f" -c lock_timeout={self.LOCK_BOUND_S}s").strip()
        self.proc = subprocess.Popen(
            ["psql", DB_URL, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)

    def run(self, statements):
        marker = f"__done_{uuid.uuid4().hex}__"
        self.proc.stdin.write(f"{statements}\nselect '{marker}';\n")
        self.proc.stdin.flush()
        lines = []
        while True:
            line = self.proc.stdout.readline()
            if line == "":
                raise RuntimeError("psql session ended: " + "".join(lines))
            if line.strip() == marker:
                return lines
            lines.append(line.rstrip("\n"))

    def backend_pid(self):
        return int(self.run("select pg_backend_pid();")[0])

    def close(self):
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(EXIT_BOUND)


def cluster(action):
    """Stops or starts the test's PostgreSQL cluster (scripts/lib.sh)."""
    subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib.sh"; cluster_{action} '
                    '"$IDEM_TEST_PGDATA" "$IDEM_TEST_PGPORT"'], check=True)


# A health check's call waits for its pool's connection under a second in
# all (DB_HEALTH_TIMEOUT_MS in src/core/db.h), then /healthz answers 503.
HEALTH_GAVE_UP = "database call failed (timeout): no database connection came free in time"


def database_errors(log):
    """The "database call failed" lines of a server's log, but those of a
    /healthz that waited out its own bound for the health pool's connection
    and answered 503: a worker that has just started (or found the database
    again) on a loaded machine may still be making that connection when the
    harness's readiness poll comes, and a 503 within a second is then the
    service's right answer. Such a line is the one followed, among its
    worker's access lines, by that /healthz 503 (outcome=db_error); any
    other call's give-up is kept."""
    lines = log.splitlines()
    errors = []
    for i, line in enumerate(lines):
        if "database call failed" not in line:
            continue
        worker = line.split("]:", 1)[0]
        if line.endswith(HEALTH_GAVE_UP):
            nxt = next((l for l in lines[i + 1:] if l.startswith(worker + "]: access ")), "")
            if " path=/healthz status=503 " in nxt and "outcome=db_error" in nxt:
                continue
        errors.append(line)
    return errors


def metric(port, name, labels=""):
    """The value of one metric line of GET /metrics."""
    text = request(port, "GET", "/metrics").body.decode()
    line = name + ("{" + labels + "}" if labels else "") + " "
    for l in text.splitlines():
        if l.startswith(line):
            return float(l[len(line):])
    raise KeyError(line)


def waiting_backends(query_like):
    """Backends blocked on a lock while running a query like query_like."""
    return int(sql_value(
        "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
        f" and query like {quote(query_like)}"))


def server_socket(server_port, client_port):
    """The TCP state of a loopback server's end of the connection from
    client_port ("ESTABLISHED", "CLOSE_WAIT", "FIN_WAIT2", ...), or None
    when there is none: read off /proc/net/tcp and tcp6, as ss would."""
    states = {"01": "ESTABLISHED", "06": "TIME_WAIT", "07": "CLOSE",
              "08": "CLOSE_WAIT", "09": "LAST_ACK", "04": "FIN_WAIT1",
              "05": "FIN_WAIT2", "0B": "CLOSING"}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            r = line.split()
            if r[1].endswith(f":{server_port:04X}") and r[2].endswith(f":{client_port:04X}"):
                return states.get(r[3], r[3])
    return None


def server_end(server_port, client_port):
    """The state of a loopback server's end of the connection from
    client_port while the server holds it open ("ESTABLISHED",
    "CLOSE_WAIT"), or None once the server has closed it (or it is not
    there)."""
    state = server_socket(server_port, client_port)
    return None if state in ("LAST_ACK", "CLOSE", "FIN_WAIT1", "FIN_WAIT2",
                             "TIME_WAIT", "CLOSING") else state


def wait_server_closed(server_port, client, what):
    """Closes a client socket the server holds open, and waits for the
    server to close its end. Its end is seen first (a lookup that never
    finds it would pass at once), and seen closed twice in a row (the
    kernel's tables are read in pieces)."""
    port = client.getsockname()[1]
    # Open, or closed by the server first: not a TIME_WAIT of an older
    # connection on the same ports.
    wait_until(lambda: server_socket(server_port, port) in
               ("ESTABLISHED", "CLOSE_WAIT", "FIN_WAIT1", "FIN_WAIT2"),
               f"the server's end of the connection to be seen ({what})")
    client.close()
    wait_until(lambda: server_end(server_port, port) is None and
               server_end(server_port, port) is None, what)


# --- processes --------------------------------------------------------------

def as_from_a_terminal():
    """A preexec_fn for a program a test then stops as a user's terminal
    would (Ctrl-C, SIGQUIT): those signals at their defaults, as a
    terminal's shell starts a program. The suite may run with them ignored
    (make test started in the background by a script or a CI runner: a
    non-interactive shell starts its background jobs so, and Popen passes
    ignored signals on), and a shell cannot trap a signal that was ignored
    when it started: make run's and make demo's Ctrl-C traps would then be
    ignored in silence."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def alive(pid):
    """True while pid runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open, or between the open and the read.
        return False


# Ports for the servers a test starts, below Linux's ephemeral range
# (32768-60999): a port the kernel picked (bind to 0) is one that any
# client's connection may take as its own before the server binds it, or
# while a test restarts the server on it. The ports of the suites'
# clusters (25439-25459, 26200-26203, or where IDEM_TEST_PGPORT and
# IDEM_TEST_CLUSTER_PGPORT put them) are left out: a test stops its
# cluster for a while (43_outage), and the port must still be its own.
_TAKEN = {int(os.environ[v]) + i for v in ("IDEM_TEST_PGPORT", "IDEM_TEST_CLUSTER_PGPORT")
          if os.environ.get(v, "").isdigit() for i in range(4)}
_PORTS = [p for p in range(20000, 32000)
          if not 25430 <= p < 25470 and not 26190 <= p < 26220 and p not in _TAKEN]
_given = set()
_port_choice = random.Random().choice   # a test's own seeded random stays its own


def copy_tree(name):
    """A copy of the checkout's files (tracked and new, not ignored) in
    TMP/name, links kept as links (assets/openapi.json): a tree a test may
    edit and build."""
    copy = os.path.join(TMP, name)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    for f in files:
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.join(copy, os.path.dirname(f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(copy, f),
                         follow_symlinks=False)
    return copy


def free_port():
    """A port no server listens on, not given before to this process."""
    for _ in range(1000):
        port = _port_choice(_PORTS)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError("no free port in 20000-32000")


class DbProxy:
    """A TCP proxy in front of the test's PostgreSQL, for the database's bad
    days: it waits `delay` before it passes a new connection on (a slow or
    distant server), holds new connections without ever passing them on
    while `hold` is set (an address that accepts and never answers), and
    cuts the connections it passed on (black_hole()).

    In front of an HTTP server (http=True, a provider), it first reads each
    connection's whole first request (its headers and Content-Length bytes
    of body), keeps it in `requests` and counts it in `sent`, then waits
    `delay` and passes it on: a test sees that a given request is on the
    wire, whole, by its bytes (requested()), whatever else its API sends
    through the proxy (a recovery job's call), and may kill the API then
    knowing that the server will get all of it.

    While `hold_answers` is set, what the server sends back is kept from
    the client, and passed on once it is cleared (to a client still
    there): a provider has acted and answered, and its client has not
    heard, for as long as the test needs, whatever the machine's speed."""

    def __init__(self, delay=0.0, target=None, unix=None, host="127.0.0.1",
                 port=None, http=False):
        # Another loopback server (a provider) instead of PostgreSQL, or
        # PostgreSQL's Unix socket (reachable from a network namespace).
        self.target = target or int(os.environ["IDEM_TEST_PGPORT"])
        self.unix = unix
        # Connections whose client has sent its first bytes (a request on
        # the wire), counted before the delay; with http, its whole first
        # request, kept in requests.
        self.sent = 0
        self.http = http
        self.requests = []
        self.delay = delay
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port or free_port()))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        # The client port of each connection accepted, in order.
        self.peers = []
        self.hold = False
        self.hold_answers = False
        self.lock = threading.Lock()
        self.held = []
        self.open = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:     # closed (close())
                return
            try:
                peer = client.getpeername()[1]
            except OSError:     # already gone: counted all the same
                peer = None
            with self.lock:
                self.accepted += 1
                self.peers.append(peer)
            threading.Thread(target=self._open, args=(client,), daemon=True).start()

    def all_accepted(self):
        """Every connection made to the proxy so far, accepted: a marker
        connection made now is accepted after them (a listening socket's
        queue is first in, first out); it is closed, and not counted.
        Returns how many there were. Only connections whose handshake
        is done are in the queue: exact once their client has stopped."""
        marker = socket.create_connection(("127.0.0.1", self.port))
        port = marker.getsockname()[1]
        wait_until(lambda: port in self.peers, "the proxy to accept its marker connection")
        marker.close()
        with self.lock:
            self.accepted -= 1
            n = self.peers.index(port)
            self.peers.remove(port)
        return n

    def requested(self, text):
        """True once a whole first request containing text has come in."""
        with self.lock:
            return any(text.encode() in r for r in self.requests)

    @staticmethod
    def _read_request(client):
        """An HTTP request's bytes, read whole (or as far as the client
        sent it before it closed)."""
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = client.recv(65536)
                if not chunk:
                    return data
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:[ \t]*(\d+)", head)
            need = int(length.group(1)) if length else 0
            while len(body) < need:
                chunk = client.recv(65536)
                if not chunk:
                    break
                body += chunk
                data += chunk
        except OSError:
            pass
        return data

    def _open(self, client):
        first = b""
        if self.http:
            first = self._read_request(client)
            with self.lock:
                self.requests.append(first)
                self.sent += 1
        elif self.delay:
            try:
                client.recv(1, socket.MSG_PEEK)
            except OSError:
                pass
            with self.lock:
                self.sent += 1
        time.sleep(self.delay)
        with self.lock:
            if self.hold:
                self.held.append(client)
                return
        try:
            if self.unix:
                server = socket.socket(socket.AF_UNIX)
                server.settimeout(CONNECT_BOUND)
                server.connect(self.unix)
            else:
                server = socket.create_connection(("127.0.0.1", self.target),
                                                  timeout=CONNECT_BOUND)
            server.settimeout(None)
        except OSError:
            client.close()
            return
        with self.lock:
            self.open.extend([client, server])
        if first:
            try:
                server.sendall(first)
            except OSError:
                pass
        for a, b, answers in ((client, server, False), (server, client, True)):
            threading.Thread(target=self._pump, args=(a, b, answers), daemon=True).start()

    def _pump(self, src, dst, answers=False):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while answers and self.hold_answers:
                    time.sleep(0.01)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        """Stops listening: new connections are refused."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def black_hole(self):
        """Cuts every connection passed on and holds the new ones."""
        with self.lock:
            self.hold = True
            for s in self.open:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.open = []

    def restore(self):
        """Passes new connections on again; the held ones are closed."""
        with self.lock:
            self.hold = False
            for s in self.held:
                s.close()
            self.held = []


def pg_socket():
    """The test PostgreSQL's Unix socket, when the test URL uses one."""
    for word in DB_URL.split():
        if word.startswith("host=/"):
            return f"{word[5:]}/.s.PGSQL.{os.environ['IDEM_TEST_PGPORT']}"
    return None


def in_netns(tag, files=None):
    """Runs the calling test again in a network namespace of its own, as
    root: its own loopback (tc rules there touch no one else's traffic)
    and its own /etc/resolv.conf (ip netns exec binds
    /etc/netns/NS/resolv.conf over it), naming a resolver on that
    loopback that waits 30 s for an answer. files: more files of /etc
    seen so inside (e.g. {"hosts": "..."}), the machine's untouched.
    PostgreSQL is reached through its Unix socket
    (DbProxy(unix=pg_socket())). Returns inside the namespace; outside,
    exits with the inner run's status."""
    if os.environ.get("IDEM_TEST_NETNS"):
        return os.environ["IDEM_TEST_NETNS"]
    if os.geteuid() != 0 or not shutil.which("ip") or not pg_socket():
        print("1..0 # SKIP needs root, iproute2 and the test database's Unix socket")
        sys.exit(0)
    ns = f"idem-{tag}-{os.getpid()}"
    etc = f"/etc/netns/{ns}"
    os.makedirs(etc, exist_ok=True)
    with open(f"{etc}/resolv.conf", "w") as f:
        f.write("nameserver 127.0.0.1\noptions timeout:30 attempts:1\n")
    for name, text in (files or {}).items():
        with open(f"{etc}/{name}", "w") as f:
            f.write(text)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"],
                       check=True)
        env = dict(os.environ, IDEM_TEST_NETNS=ns)
        rc = subprocess.run(["ip", "netns", "exec", ns, sys.executable,
                             os.path.abspath(sys.argv[0])], env=env,
                            timeout=NETNS_TEST_BOUND).returncode
    finally:
        subprocess.run(["ip", "netns", "del", ns])
        shutil.rmtree(etc, ignore_errors=True)
    sys.exit(rc)


_running = []


@atexit.register
def _kill_leftovers():
    """A test that dies half-way must not leave servers behind."""
    for k in _running:
        if k.proc is not None and k.proc.poll() is None:
            k.kill9()


class Kore:
    """A kore process (the API or the fake provider) with its workers."""

    def __init__(self, conf, name, env, app=None, conf_extra=()):
        self.name = name
        self.env = dict(os.environ)
        # The fake provider unless the test says otherwise, whatever the
        # shell that runs make test exported.
        for var in ("IDEM_PROVIDER_KIND", "IDEM_PROVIDER_SECRET",
                    "IDEM_FAKE_PROVIDER_KEEPS_5XX"):
            self.env.pop(var, None)
        self.env.update({k: str(v) for k, v in env.items()})
        self.env["IDEM_DATABASE_URL"] = DB_URL
        # make test-sanitize: the sanitizers' runtime, for kore alone.
        if os.environ.get("IDEM_TEST_KORE_PRELOAD"):
            self.env["LD_PRELOAD"] = os.environ["IDEM_TEST_KORE_PRELOAD"]
        self.conf = os.path.join(TMP, f"{name}.conf")
        self.logpath = os.path.join(TMP, f"{name}.log")
        with open(os.path.join(ROOT, conf)) as f:
            text = f.read()
        text = text.replace("load ./app.so", f"load {app or ROOT + '/app.so'}")
        lines = [l for l in text.splitlines() if not l.startswith("pidfile")]
        lines.append(f"pidfile {TMP}/{name}.pid")
        # Global settings a test changes (say, "http_header_timeout 2").
        lines.extend(conf_extra)
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")
        self.proc = None

    def start(self, ready):
        self.log = open(self.logpath, "a")
        self.proc = subprocess.Popen(["kore", "-fnrc", self.conf], cwd=ROOT,
                                     env=self.env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        _running.append(self)
        wait_until(lambda: self._ready(ready), f"{self.name} to answer")
        return self

    def _ready(self, ready):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.read_log()}")
        try:
            return ready()
        except OSError:
            return False

    def workers(self):
        path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        try:
            with open(path) as f:
                return [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return []

    def kill9(self):
        """SIGKILL to the parent and every worker, as a crash would."""
        pids = [self.proc.pid] + self.workers()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(EXIT_BOUND)
        wait_until(lambda: not any(alive(p) for p in pids), f"{self.name} to die")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        pids = [self.proc.pid] + self.workers()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            self.kill9()
        wait_until(lambda: not any(alive(p) for p in pids), f"{self.name} to exit")

    def read_log(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()


class Api(Kore):
    def __init__(self, name="api", port=None, app=None, conf_extra=(), **env):
        self.port = port or free_port()
        _api_ports.add(self.port)
        env.setdefault("IDEM_PORT", self.port)
        super().__init__("kore.conf", name, env, app, conf_extra=conf_extra)

    def start(self):
        return super().start(lambda: request(self.port, "GET", "/healthz",
                                             timeout=HEALTH_BOUND).status == 200)

    def post(self, path, body, **kw):
        return post(self.port, path, body, **kw)

    def get(self, path, **kw):
        return get(self.port, path, **kw)


class Provider(Kore):
    def __init__(self, name="provider", port=None, conf_extra=(), **env):
        self.port = port or free_port()
        env.setdefault("IDEM_PROVIDER_PORT", self.port)
        super().__init__("conf/fake-provider.conf", name, env,
                         conf_extra=conf_extra)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        return super().start(lambda: request(
            self.port, "GET", "/v1/charges?idempotency_key=ready",
            timeout=HEALTH_BOUND).status == 200)

    def charges(self, key):
        """GET /v1/charges?idempotency_key=key: the charges made under it."""
        return self._made("charges", key)

    def refunds(self, key):
        """GET /v1/refunds?idempotency_key=key: the refunds made under it."""
        return self._made("refunds", key)

    def _made(self, what, key):
        r = request(self.port, "GET", f"/v1/{what}?idempotency_key=" +
                    urllib.parse.quote(key, safe=""))
        return r.json()[what]


STRIPE_MOCK = os.path.join(ROOT, "tools", "stripe-mock", "serve.js")
STRIPE_SECRET = "sk_test_idem_tests"


class StripeMock:
    """stripe-stateful-mock (npm, pinned in tools/stripe-mock, installed by
    scripts/deps): Stripe's API v1 written by others, a real Node.js process
    on a loopback port, stopped by its pid. Its state lives in its memory:
    charges_of(K) pages through all of GET /v1/charges and keeps those whose
    metadata[idempotency_key] is K, as a test counts charges per key."""

    def __init__(self, port=None):
        self.port = port or free_port()
        self.name = f"stripe-mock-{self.port}"
        self.logpath = os.path.join(TMP, f"{self.name}.log")
        self.proc = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        env = dict(os.environ, PORT=str(self.port), LOG_LEVEL="warn")
        self.log = open(self.logpath, "a")
        self.proc = subprocess.Popen(["node", STRIPE_MOCK], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        _running.append(self)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Stripe mock exited: {self.read_log()}")
            try:
                return self.get("/v1/charges?limit=1")[0] == 200
            except OSError:
                return False
        wait_until(ready, "the Stripe mock to answer")
        return self

    def get(self, path):
        import base64
        auth = base64.b64encode(f"{STRIPE_SECRET}:".encode()).decode()
        r = request(self.port, "GET", path, headers={"Authorization": "Basic " + auth},
                    timeout=REQUEST_BOUND)
        return r.status, r.json()

    def _all(self, what):
        items, after = [], None
        while True:
            path = f"/v1/{what}?limit=100" + (f"&starting_after={after}" if after else "")
            status, page = self.get(path)
            if status != 200:
                raise RuntimeError(f"GET {path}: {status} {page}")
            items.extend(page["data"])
            if not page.get("has_more") or not page["data"]:
                return items
            after = page["data"][-1]["id"]

    def charges_of(self, key, status="succeeded"):
        """The charges whose metadata[idempotency_key] is key."""
        return [c for c in self._all("charges")
                if (c.get("metadata") or {}).get("idempotency_key") == key and
                (status is None or c.get("status") == status)]

    def refunds_of(self, key):
        return [r for r in self._all("refunds")
                if (r.get("metadata") or {}).get("idempotency_key") == key]

    def kill9(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(EXIT_BOUND)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            self.kill9()

    def read_log(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()


class StubProvider:
    """A payment provider that answers whatever a test tells it to, to reach
    answers the fake provider never gives (a 2xx without a charge id, a 404,
    a 409 with its own Retry-After). A real HTTP server on loopback, in a
    thread of the test; answers[recipient] is (status, headers, body), or a
    function of the call number giving one; default answers every other
    recipient. calls lists (monotonic time, Idempotency-Key, recipient)."""

    def __init__(self, answers=None, default=(503, {}, b""), port=None):
        import http.server

        self.answers = dict(answers or {})
        self.default = default
        self.calls = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    recipient = json.loads(body).get("recipient")
                except ValueError:
                    recipient = None
                key = self.headers.get("Idempotency-Key")
                stub.calls.append((time.monotonic(), key, recipient))
                answer = stub.answers.get(recipient, stub.default)
                if callable(answer):
                    answer = answer(len(stub.calls_of(key)))
                status, headers, data = answer
                if isinstance(data, (dict, list)):
                    data = json.dumps(data).encode()
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def calls_of(self, key):
        return [c for c in self.calls if c[1] == key]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Gateway:
    """An ordinary gateway between the service and its provider (an egress
    proxy, a load balancer): a real HTTP server on loopback, in a thread of
    the test, that passes requests to upstream and their answers back, all
    headers included. With hold_first, the first POST of each
    Idempotency-Key is answered at once with the gateway's own HTML 502 (no
    Request-Id) while the request itself is HELD, and sent on to upstream
    only when the test says so (release()): the provider makes the charge
    after the service was told 502. held() lists the keys held."""

    def __init__(self, upstream_port, hold_first=True, port=None):
        import http.server
        import http.client

        self.upstream_port = upstream_port
        self.hold_first = hold_first
        self.seen = set()
        self._held = []
        self.forwarded = []
        gw = self

        def forward(method, path, headers, body):
            conn = http.client.HTTPConnection("127.0.0.1", gw.upstream_port,
                                              timeout=REQUEST_BOUND)
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                return r.status, r.getheaders(), r.read()
            finally:
                conn.close()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _pass(self, method):
                n = int(self.headers.get("Content-Length", 0) or 0)
                body = self.rfile.read(n) if n else None
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("connection", "keep-alive")}
                key = self.headers.get("Idempotency-Key")
                if method == "POST" and gw.hold_first and key and key not in gw.seen:
                    gw.seen.add(key)
                    gw._held.append((key, method, self.path, headers, body))
                    page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                    self.send_response(502)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                status, rheaders, data = forward(method, self.path, headers, body)
                gw.forwarded.append((method, self.path, key, status))
                self.send_response(status)
                for name, value in rheaders:
                    if name.lower() not in ("connection", "keep-alive",
                                            "transfer-encoding", "content-length",
                                            "date", "server"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                self._pass("POST")

            def do_GET(self):
                self._pass("GET")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def held(self):
        return [h[0] for h in self._held]

    def release(self):
        """Sends every held request on to the provider, as the gateway's
        own upstream connection would have: their answers go nowhere."""
        out = []
        while self._held:
            key, method, path, headers, body = self._held.pop(0)
            import http.client
            conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port,
                                              timeout=REQUEST_BOUND)
            try:
                conn.request(method, path, body=body, headers=headers)
                r = conn.getresponse()
                r.read()
                out.append((key, r.status))
            finally:
                conn.close()
        return out

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def derived_key(key, generation=1, client="shop-1", key_max=0):
    """The provider's Idempotency-Key of a generation of a client's key, as
    src/lease/lease.c's provider_key() derives it (key_max: the provider's
    longest key, 255 for Stripe, 0 for none): <client>:<key>[:<n>], or
    <client>~sha256:<hex>[:<n>] for a key too long."""
    import hashlib
    tag = f":{generation}" if generation > 1 else ""
    if key_max == 0 or len(client) + 1 + len(key) + 11 <= key_max:
        return f"{client}:{key}{tag}"
    return f"{client}~sha256:{hashlib.sha256(key.encode()).hexdigest()}{tag}"


def provider_calls(key, kind="charge"):
    """Requests of a kind ("charge" or "refund") the fake provider answered
    for an Idempotency-Key, refusals included (provider.requests): how
    often the API called it."""
    return int(sql_value("select count(*) from provider.requests"
                         f" where idempotency_key = {quote(key)}"
                         f" and kind = {quote(kind)}"))


def charges_to(recipient):
    """Charges the provider made to a recipient, whatever their key."""
    return int(sql_value("select count(*) from provider.charges"
                         f" where recipient = {quote(recipient)}"))


def refunds_to(recipient):
    """Refunds the provider made of charges to a recipient, whatever their
    key."""
    return int(sql_value("select count(*) from provider.refunds r"
                         " join provider.charges c using (charge_id)"
                         f" where c.recipient = {quote(recipient)}"))


def refunded(charge_id):
    """The amount refunded of a charge, in all."""
    return int(sql_value("select coalesce(sum(amount), 0) from provider.refunds"
                         f" where charge_id = {quote(charge_id)}"))


def key_row(key, client="shop-1"):
    """The key's row as a dict, or None."""
    rows = sql("select status, lease_id, status_code, response,"
               " locked_until > now() from idempotency_keys"
               f" where client_id = {quote(client)} and idem_key = {quote(key)}")
    if not rows:
        return None
    status, lease, code, response, leased = rows[0]
    return {"status": status, "lease_id": int(lease), "status_code": code or None,
            "response": response or None, "leased": leased == "t"}
