"""make demo (scripts/demo), run as make runs it, with the app.so this run
built: it exits 0 and shows the naive route charging more than once and
the lease route once; afterwards its servers, its cluster and its
directory are gone, also after a Ctrl-C in the middle of the race."""

import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, Tap, as_from_a_terminal, free_port  # noqa: E402

if os.environ.get("IDEM_TEST_KORE_PRELOAD"):
    print("1..0 # SKIP the demo's kore would need the sanitizer runtime; "
          "make test runs it")
    sys.exit(0)

t = Tap()
DEMO = os.path.join(ROOT, "scripts", "demo")
N = 3
# Bounds on hangs, far above need: the demo takes about 20 s on a quiet
# machine (its provider thinks 500 ms per charge), 40 s beside make
# test-loaded's CPU hog; a refused start ends in a second or two.
DEMO_BOUND = 120
REFUSAL_BOUND = 30


def ports():
    return {"IDEM_DEMO_PORT": str(free_port()), "IDEM_DEMO_PROVIDER_PORT": str(free_port()),
            "IDEM_DEMO_PGPORT": str(free_port())}


def env(p, **extra):
    e = dict(os.environ, IDEM_DEMO_BUILD="0", IDEM_DEMO_REQUESTS=str(N),
             IDEM_PROVIDER_LATENCY_MS="500", **p)
    e.update(extra)
    # Python's output into a pipe as a user's shell has it: held until
    # exit unless the demo asks for every line as it comes.
    e.pop("PYTHONUNBUFFERED", None)
    return e


class Impostor(http.server.BaseHTTPRequestHandler):
    """What make run's servers look like to the demo's readiness checks."""

    def do_GET(self):
        body = b'{"charges": []}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.send_error(418)

    def log_message(self, *args):
        pass


def impostor():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Impostor)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def listening(port):
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", int(port))) == 0


def left_behind(out, p):
    """What the demo left: its directory, a port still listening, a
    process still running out of its directory."""
    m = re.search(r"throwaway cluster in (/tmp/idem-demo\.\S+),", out)
    if m is None:
        return ["no directory named in the output"]
    tmp = m.group(1)
    left = [tmp] if os.path.exists(tmp) else []
    left += [f"port {v}" for v in p.values() if listening(v)]
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tmp.encode() in f.read():
                    left.append(f"pid {pid}")
        except OSError:
            pass
    return left


# The whole demo, in a shell that exports make run's ports, with make run
# (here servers that answer 200 to anything) listening on them: the demo
# runs on ports of its own.
busy = [impostor(), impostor()]
p = ports()
started = time.monotonic()
run = subprocess.run([DEMO], env=env(p, IDEM_PORT=str(busy[0].server_address[1]),
                                     IDEM_PROVIDER_PORT=str(busy[1].server_address[1])),
                     capture_output=True, text=True, timeout=DEMO_BOUND)
out = run.stdout
t.note(out)
t.note(f"make demo took {time.monotonic() - started:.1f} s")
t.eq(run.returncode, 0, "make demo exits 0")

naive = re.search(r"^naive: (\d+) requests with one key, answers ([\d, ]+); "
                  r"the provider charged (\d+) times \((\d+) x 100\.00 RUB\)$", out, re.M)
t.ok(naive is not None and int(naive.group(1)) == N, f"naive: {N} requests", out)
t.ok(naive is not None and int(naive.group(3)) > 1 and naive.group(3) == naive.group(4),
     "naive: the provider charged more than once", out)
t.ok(naive is not None and naive.group(2).split(", ").count("201") == 1,
     "naive: one of them got 201 (the others 500, once the money had moved)", out)
lease = re.search(r"^lease: (\d+) requests with one key, answers ([\d, ]+); "
                  r"the provider charged once \(1 x 100\.00 RUB\)$", out, re.M)
t.ok(lease is not None and int(lease.group(1)) == N, "lease: the provider charged once",
     out)
t.ok(lease is not None and lease.group(2) == ", ".join(["201"] + ["409"] * (N - 1)),
     "lease: one 201, the others 409", out)
t.ok(re.search(r"answers:  201, 409 \(Retry-After: \d+\), 409 \(Retry-After: \d+\)$",
               out, re.M) is not None, "the 409s carry Retry-After", out)
t.ok(re.search(r"the provider finds 0 \(the naive route sent fresh provider keys\)$",
               out, re.M) is not None,
     "the naive side's charges are not under the derived key", out)
t.eq(left_behind(out, p), [], "nothing left behind: directory, ports, processes")

# A port of its own that is taken: it says so and starts nothing.
p = ports()
p["IDEM_DEMO_PORT"] = str(busy[0].server_address[1])
taken = subprocess.run([DEMO], env=env(p), capture_output=True, text=True,
                       timeout=REFUSAL_BOUND)
t.ok(taken.returncode == 2 and f"port {p['IDEM_DEMO_PORT']} (IDEM_DEMO_PORT) is taken"
     in taken.stderr and "throwaway cluster" not in taken.stdout,
     "IDEM_DEMO_PORT taken: exit 2 before anything starts", taken)
for server in busy:
    server.shutdown()
    server.server_close()

# Ctrl-C while the naive race runs (its requests are out: the line before
# them has come through the pipe as it was printed): the terminal's SIGINT
# reaches the whole foreground group, twice, as an impatient user's.
p = ports()
proc = subprocess.Popen([DEMO], env=env(p), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, start_new_session=True,
                        preexec_fn=as_from_a_terminal)
# Whatever happens, the reading below ends.
watchdog = threading.Timer(DEMO_BOUND, lambda: os.killpg(proc.pid, signal.SIGKILL))
watchdog.start()
lines, interrupted = [], False
for line in proc.stdout:
    lines.append(line)
    if not interrupted and re.match(rf"  {N} requests at once, Idempotency-Key demo-naive-",
                                    line):
        os.killpg(proc.pid, signal.SIGINT)
        interrupted = True
    elif interrupted and line.startswith(" interrupted"):
        # A second Ctrl-C during the cleanup does not cut it short.
        time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
proc.wait()
watchdog.cancel()
out = "".join(lines)
t.ok(interrupted, "the race's lines come as they are printed", out)
t.eq(proc.returncode, 130, "Ctrl-C: exit status 130")
t.ok("interrupted" in out and "\nnaive:" not in out, "it stopped where it was", out)
t.eq(left_behind(out, p), [], "Ctrl-C twice: nothing left behind")

bad = subprocess.run([DEMO], env=env(ports(), IDEM_DEMO_REQUESTS="1"),
                     capture_output=True, text=True, timeout=REFUSAL_BOUND)
t.ok(bad.returncode == 2 and "IDEM_DEMO_REQUESTS must be 2 to 10" in bad.stderr,
     "IDEM_DEMO_REQUESTS=1 is refused", bad)

t.done()
