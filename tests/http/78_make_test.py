"""make test itself (scripts/test), run from within a run: IDEM_TESTS
naming a file that does not exist is refused at once, naming it, before
anything is built or migrated; a test cluster left on IDEM_TEST_PGPORT
(by a run killed before its cleanup) is named, its directory and its
pid, as is a port another program holds; a run whose reader goes away
(make test | head) still stops its cluster and deletes its folder; and
make test-loaded exits 143 after a SIGTERM, its hog stopped. As root, a
cluster's folder the postgres user cannot enter is said at once."""

import glob
import os
import signal
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (HEALTH_BOUND, ROOT, TMP, Tap, alive, free_port, wait_until)  # noqa: E402

t = Tap()
TEST = os.path.join(ROOT, "scripts", "test")
LIB = os.path.join(ROOT, "scripts", "lib.sh")
SOME_TEST = "tests/sql/01_schema.sql"
# A bound on a hang of a whole nested run (a build, a cluster, a
# migration), far above its need; not a verdict.
RUN_BOUND = 900

# Programs that record that they ran, first in the PATH: kodev builds,
# psql migrates, prove runs the tests. A refusal made "at once" runs none.
fakes = os.path.join(TMP, "make-test-fakes")
ran = os.path.join(TMP, "make-test-ran")
os.makedirs(fakes, exist_ok=True)
for prog in ("kodev", "psql", "prove"):
    with open(os.path.join(fakes, prog), "w") as f:
        f.write(f"#!/bin/sh\necho {prog} >> {ran}\nexit 1\n")
    os.chmod(os.path.join(fakes, prog), 0o755)


def nested(port, tests, fake=True):
    if os.path.exists(ran):
        os.unlink(ran)
    env = dict(os.environ, IDEM_TEST_PGPORT=str(port), IDEM_TESTS=tests)
    if fake:
        env["PATH"] = fakes + os.pathsep + env["PATH"]
    return subprocess.run([TEST], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=RUN_BOUND)


def nothing_ran():
    return not os.path.exists(ran) or open(ran).read() == ""


def clusters_on(port):
    """Test clusters (their postmaster.pid) that say they listen on port,
    with a live postmaster: (directory, pid)."""
    out = []
    for pidfile in glob.glob("/tmp/idem-test.*/pgdata/postmaster.pid"):
        try:
            lines = open(pidfile).read().splitlines()
            pid = int(lines[0])
            if lines[3] == str(port):
                os.kill(pid, 0)
                out.append((lines[1], pid))
        except (OSError, ValueError, IndexError):
            pass
    return out


def accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=HEALTH_BOUND).close()
        return True
    except OSError:
        return False


def lib(cmd, *args):
    subprocess.run(["bash", "-c", f'. "{LIB}"; {cmd} "$@"', "lib"] + list(args),
                   check=True, capture_output=True, text=True, timeout=RUN_BOUND)


# --- IDEM_TESTS naming a file that does not exist -------------------------------
r = nested(free_port(), f"{SOME_TEST} tests/http/99_no_such_test.py")
t.ok(r.returncode == 2 and "tests/http/99_no_such_test.py, which does not exist" in r.stderr,
     "IDEM_TESTS naming a missing file: exit 2, naming it", r.stdout + r.stderr)
t.ok(nothing_ran(), "at once: nothing built, migrated or run",
     open(ran).read() if os.path.exists(ran) else "")

# --- a test cluster left on the port --------------------------------------------
stale = tempfile.mkdtemp(prefix="idem-test.", dir="/tmp")
os.chmod(stale, 0o755)
port = free_port()
try:
    lib("cluster_start", os.path.join(stale, "pgdata"), str(port))
    [(directory, pid)] = clusters_on(port)
    r = nested(port, SOME_TEST)
    t.ok(r.returncode != 0 and f"its directory {directory}" in r.stderr and
         f"its postmaster pid {pid}" in r.stderr,
         "a test cluster left on IDEM_TEST_PGPORT is named: its directory and its pid",
         r.stdout + r.stderr)
    t.ok(nothing_ran(), "before anything is built",
         open(ran).read() if os.path.exists(ran) else "")
finally:
    lib("cluster_stop", os.path.join(stale, "pgdata"))
    subprocess.run(["rm", "-rf", stale])

# --- a port another program holds -------------------------------------------------
holder = socket.create_server(("127.0.0.1", 0))
r = nested(holder.getsockname()[1], SOME_TEST)
holder.close()
t.ok(r.returncode != 0 and "is taken by a program that is no test cluster" in r.stderr and
     nothing_ran(), "a port another program holds is said, before anything is built",
     r.stdout + r.stderr)

# --- make test | head ----------------------------------------------------------------
# The reader takes the first line (the first migration's) and goes: the
# run's next write fails. Its cleanup must still stop its cluster.
port = free_port()
try:
    cut = subprocess.run(["bash", "-c", f'"{TEST}" | head -n 1'], cwd=ROOT,
                         env=dict(os.environ, IDEM_TEST_PGPORT=str(port),
                                  IDEM_TESTS=SOME_TEST),
                         capture_output=True, text=True, timeout=RUN_BOUND)
    left = clusters_on(port)
    t.ok(cut.stdout.startswith("applied ") and not left and not accepts(port),
         "make test | head: the run's cluster is stopped when it ends",
         f"left: {left}; out: {cut.stdout!r}; err: {cut.stderr[-2000:]}")
    t.ok("Traceback" not in cut.stderr and "write error" not in cut.stderr,
         "and its cleanup writes no error to a reader gone", cut.stderr[-2000:])
finally:
    for directory, pid in clusters_on(port):
        # What scripts/test left before it cleaned up after SIGPIPE.
        os.kill(pid, signal.SIGQUIT)
        subprocess.run(["rm", "-rf", os.path.dirname(directory)])

# --- a checkout postgres cannot enter ------------------------------------------------
# As root, PostgreSQL runs as postgres: a clone under /root (mode 700)
# is said at once, not left to initdb's "Permission denied".
if os.geteuid() == 0:
    closed = tempfile.mkdtemp(prefix="closed-", dir=TMP)     # mode 700, root's
    r = subprocess.run(["bash", "-c", f'. "{LIB}"; cluster_start "$1" "$2"', "lib",
                        os.path.join(closed, ".pgdata"), str(free_port())],
                       capture_output=True, text=True, timeout=RUN_BOUND)
    t.ok(r.returncode != 0 and f"the postgres user cannot reach {closed}" in r.stderr and
         "not under /root" in r.stderr and "initdb" not in r.stderr,
         "a cluster's folder postgres cannot enter is named, with what to do", r.stderr)
    subprocess.run(["rm", "-rf", closed])
else:
    t.ok(True, "# SKIP as root only")

# --- make test-loaded and SIGTERM ---------------------------------------------------
# A SIGTERM to scripts/test-loaded alone is acted on when its tests end:
# it exits 143 (128 + 15, as make test does) and stops its hog. Here the
# hog is a stand-in that sleeps, and the tests end at a failed build, a
# stand-in kodev that waits until the signal has been sent.
loaded = os.path.join(TMP, "make-test-loaded")
os.makedirs(loaded, exist_ok=True)
for name in ("started", "go", "hog"):
    if os.path.exists(os.path.join(loaded, name)):
        os.unlink(os.path.join(loaded, name))
with open(os.path.join(loaded, "kodev"), "w") as f:
    # Its wait bounded (6000 x 0.05 s) should this test die first.
    f.write(f'#!/bin/sh\ntouch "{loaded}/started"\ni=0\n'
            f'while [ ! -e "{loaded}/go" ] && [ $i -lt 6000 ]; do sleep 0.05; i=$((i+1)); done\n'
            'exit 1\n')
with open(os.path.join(loaded, "stress-ng"), "w") as f:
    f.write(f'#!/bin/sh\necho $$ > "{loaded}/hog"\nexec sleep 600\n')
for prog in ("kodev", "stress-ng"):
    os.chmod(os.path.join(loaded, prog), 0o755)
def hog_pid():
    try:
        return int(open(os.path.join(loaded, "hog")).read())
    except (OSError, ValueError):       # not yet written, or half
        return None


# scripts/test-loaded installs stress-ng, the package (the stand-in on the
# PATH does not count): a plain make test where it is missing skips this.
if subprocess.run(["dpkg-query", "-W", "-f=${Status}", "stress-ng"], capture_output=True,
                  text=True).stdout.endswith("installed"):
    run = subprocess.Popen([os.path.join(ROOT, "scripts", "test-loaded")], cwd=ROOT,
                           env=dict(os.environ, IDEM_TEST_PGPORT=str(free_port()),
                                    IDEM_TESTS=SOME_TEST, IDEM_TEST_FLAVOR="dev",
                                    PATH=loaded + os.pathsep + os.environ["PATH"]),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)
    try:
        wait_until(lambda: run.poll() is not None or
                   (os.path.exists(os.path.join(loaded, "started")) and hog_pid()),
                   "the loaded run's build to start, its hog running", timeout=RUN_BOUND)
        if run.poll() is not None:
            t.ok(False, "make test-loaded ran until its build", run.stdout.read())
        else:
            hog = hog_pid()
            run.send_signal(signal.SIGTERM)
            open(os.path.join(loaded, "go"), "w").close()
            out, _ = run.communicate(timeout=RUN_BOUND)
            t.ok(run.returncode == 143,
                 f"make test-loaded after SIGTERM: exit 143 ({run.returncode})", out)
            t.ok(not alive(hog), "and its hog stopped", out)
    finally:
        open(os.path.join(loaded, "go"), "w").close()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        if hog_pid() and alive(hog_pid()):
            os.kill(hog_pid(), signal.SIGKILL)
else:
    t.ok(True, "# SKIP make test-loaded's SIGTERM: stress-ng is not installed")

t.done()
