"""make demo (scripts/demo), run as make runs it, with the app.so this run
built: it exits 0 and shows the naive route charging more than once and
the lease route once; afterwards its servers, its cluster and its
directory are gone, also after a Ctrl-C in the middle of the race."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, Tap, free_port  # noqa: E402

if os.environ.get("IDEM_TEST_KORE_PRELOAD"):
    print("1..0 # SKIP the demo's kore would need the sanitizer runtime; "
          "make test runs it")
    sys.exit(0)

t = Tap()
DEMO = os.path.join(ROOT, "scripts", "demo")
N = 3


def ports():
    return {"IDEM_PORT": str(free_port()), "IDEM_PROVIDER_PORT": str(free_port()),
            "IDEM_DEMO_PGPORT": str(free_port())}


def env(p, **extra):
    e = dict(os.environ, IDEM_DEMO_BUILD="0", IDEM_DEMO_REQUESTS=str(N),
             IDEM_PROVIDER_LATENCY_MS="500", **p)
    e.update(extra)
    return e


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


# The whole demo.
p = ports()
started = time.monotonic()
run = subprocess.run([DEMO], env=env(p), capture_output=True, text=True, timeout=120)
seconds = time.monotonic() - started
out = run.stdout
t.note(out)
t.eq(run.returncode, 0, "make demo exits 0")
t.ok(seconds < 60, f"within a minute ({seconds:.1f} s)")

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

# Ctrl-C while the naive race runs: the terminal's SIGINT reaches the
# whole foreground group.
p = ports()
proc = subprocess.Popen([DEMO], env=env(p), stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
lines = []
for line in proc.stdout:
    lines.append(line)
    if line.startswith("naive  POST"):
        os.killpg(proc.pid, signal.SIGINT)
        break
try:
    rest, _ = proc.communicate(timeout=30)
except subprocess.TimeoutExpired:
    proc.kill()
    rest, _ = proc.communicate()
out = "".join(lines) + rest
t.eq(proc.returncode, 130, "Ctrl-C: exit status 130")
t.ok("interrupted" in out and "\nnaive:" not in out, "it stopped where it was", out)
t.eq(left_behind(out, p), [], "Ctrl-C: nothing left behind")

bad = subprocess.run([DEMO], env=env(ports(), IDEM_DEMO_REQUESTS="1"),
                     capture_output=True, text=True, timeout=30)
t.ok(bad.returncode == 2 and "IDEM_DEMO_REQUESTS must be 2 to 10" in bad.stderr,
     "IDEM_DEMO_REQUESTS=1 is refused", bad)

t.done()
