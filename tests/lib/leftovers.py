"""Runs one test program (tests/run-one calls it) and checks that it left
no process behind: whatever a test starts, it stops, also when it fails.

A server left running by a test goes on acting after it: an API's recovery
job claims the next tests' keys and charges them at its own provider, and
the failure shows in a later test, far from its cause. So this process
becomes the test's child subreaper (prctl PR_SET_CHILD_SUBREAPER): every
process the test starts, however it detaches (setsid, a double fork, a
daemon), is reparented here, not to init, when its parent ends. When the
test has ended, whatever is still a child of this process was left behind
by it: it is named (pid, command line, working directory), killed with
SIGKILL with all its descendants, and the test fails (exit status 1 if it
had passed), so that a leak fails the test that leaked.

Two exceptions. A process ending by itself (a psql whose stdin the test's
exit closed) is given LEFTOVER_BOUND seconds to do so: a bound on a hang,
far above need; nothing is killed while it ends. The suite's own
PostgreSQL, which a test may stop and start again (43_outage,
49_outage_queued_requests, 60_database_layer: pg_ctl's postmaster is then
reparented here), is the suite's, not a leftover: it is left alone.

Usage: leftovers.py PROGRAM [ARGS...]; exits with the program's status."""

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
# A bound on a hang: what is ending by itself ends in well under a second.
LEFTOVER_BOUND = 30


def children(pid):
    """The children of pid, over all its threads."""
    out = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def descendants(pid):
    """pid and all its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo += children(p)
    return out


def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def describe(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "?"
    return f"pid {pid}: {cmd} (in {cwd})"


def reap():
    """Reaps every child that has ended (orphans reparented here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def suite_postmaster():
    """The pid of the suite's own PostgreSQL, if it runs."""
    pgdata = os.environ.get("IDEM_TEST_PGDATA")
    if not pgdata:
        return None
    try:
        with open(os.path.join(pgdata, "postmaster.pid")) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


def left():
    """This process's living children but the suite's PostgreSQL."""
    keep = suite_postmaster()
    return [p for p in children(os.getpid())
            if p != keep and state(p) not in (None, "Z")]


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        # No subreaper (an old kernel): run the test unchecked.
        os.execvp(sys.argv[1], sys.argv[1:])
    test = os.fork()
    if test == 0:
        os.execvp(sys.argv[1], sys.argv[1:])

    # A SIGTERM or SIGHUP to the runner is passed to the test; a Ctrl-C in
    # a terminal reaches the test by itself, and this one waits for the
    # test to end and then stops what it left. A signal ignored here is
    # left ignored.
    def forward(sig, _frame):
        try:
            os.kill(test, sig)
        except ProcessLookupError:
            pass
    for sig, handler in ((signal.SIGTERM, forward), (signal.SIGHUP, forward),
                         (signal.SIGINT, lambda sig, frame: None)):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler)

    # Waits for the test, reaping the orphans that end meanwhile.
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == test:
            break
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        code = 128 - code

    deadline = time.monotonic() + LEFTOVER_BOUND
    while True:
        reap()
        stay = left()
        if not stay or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not stay:
        return code

    named = []
    for top in stay:
        tree = descendants(top)
        named += [describe(p) for p in tree]
        for p in tree:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    # The killed ones, and their children as they are reparented here.
    deadline = time.monotonic() + LEFTOVER_BOUND
    while left() and time.monotonic() < deadline:
        reap()
        for p in left():
            for q in descendants(p):
                try:
                    os.kill(q, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)
    reap()
    text = (f"{sys.argv[-1]} left {len(named)} process(es) running "
            f"{LEFTOVER_BOUND} s after it ended (killed now):\n" +
            "\n".join("  " + n for n in named))
    for line in text.splitlines():
        print(f"# {line}")
    sys.stdout.flush()
    print(text, file=sys.stderr)
    return code or 1


if __name__ == "__main__":
    sys.exit(main())
