"""The dev loop: `make run` (scripts/run) watches the sources; an edited .c
or .h file is built and loaded into the running processes by a reload, with
the same workers and the same database; a build or a migration that fails
leaves the old code serving; Ctrl-C stops the stack, and `make run` ends
with exit status 0.

`make run` runs in a terminal of its own (a pseudo-terminal), as a user
runs it: Ctrl-C there signals the terminal's foreground process group,
which holds make too.

Runs on a copy of the tree, so that the edits touch nothing of the repo."""

import atexit
import fcntl
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, DB_URL, EXIT_BOUND, HEALTH_BOUND, ROOT, TMP, Tap,  # noqa: E402
                     alive, as_from_a_terminal, copy_tree, free_port, get, metric, new_key, post,
                     request, wait_until)

t = Tap()

# Bounds on hangs, far above need. make run stops within a few seconds of
# a Ctrl-C on a quiet machine (its servers get 10 s to stop before
# SIGKILL), and starts in well under a minute.
STOP_BOUND = 180
START_BOUND = 300
# A bound on a hang for a change to be built and served: under a minute
# on a loaded machine, a header's full rebuild included.
BUILD_BOUND = 240
# A bound on a hang for what make run stopped to end once make run has
# ended: at once, a second at most for a worker whose parent was killed.
SETTLE_BOUND = 30
# A bound on a hang for kodev run to stop on a Ctrl-C: a few seconds.
KODEV_STOP_BOUND = 30

copy = copy_tree("devloop")

port, provider_port = free_port(), free_port()
# Its jobs stay out of the way of the other tests' keys in the shared
# database: this test is about the loop, not the jobs.
env = dict(os.environ, IDEM_DATABASE_URL=DB_URL, IDEM_PORT=str(port),
           IDEM_PROVIDER_PORT=str(provider_port),
           IDEM_PROVIDER_URL=f"http://127.0.0.1:{provider_port}",
           IDEM_RECOVERY_AFTER_SECONDS="604800",
           IDEM_CLEANUP_INTERVAL_SECONDS="86400")


def take_terminal():
    # A session of its own, whose controlling terminal is the pty, and
    # Ctrl-C's signal at its default, as a terminal's shell has it.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    as_from_a_terminal()


class MakeRun:
    """`make -s run` in the copy, in a pseudo-terminal of its own, with
    what it prints in a log."""

    def __init__(self, name, env, servers=True):
        # servers: the copy's servers are this one's (False for a second
        # make run of the copy, which must leave the first one's alone).
        self.servers = servers
        self.logpath = os.path.join(TMP, f"{name}.log")
        self.log = open(self.logpath, "wb", buffering=0)
        self.terminal, tty = pty.openpty()
        self.proc = subprocess.Popen(["make", "-s", "run"], cwd=copy, env=env, stdin=tty,
                                     stdout=tty, stderr=tty, start_new_session=True,
                                     preexec_fn=take_terminal)
        os.close(tty)
        self.reader = threading.Thread(target=self.copy_terminal, daemon=True)
        self.reader.start()

    def copy_terminal(self):
        while True:
            try:
                data = os.read(self.terminal, 4096)
            except OSError:
                return
            if not data:
                return
            self.log.write(data)

    def output(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def ctrl_c(self):
        os.write(self.terminal, b"\x03")

    def wait(self, timeout=STOP_BOUND, serving=None):
        """Its exit status; None if it did not end within timeout, and then
        what still ran is kept in self.hung. What of it still runs then, or
        once it has ended when the rest has (a worker whose parent is gone
        and a prefixing sed end by themselves, within SETTLE_BOUND), is kept
        in self.left (self.left_pids), and whether serving() was true then
        in self.served. Then it and everything it started are killed
        (kill_stack()), so that a failed test leaves nothing behind."""
        self.hung, self.left, self.left_pids, self.served = "", "", [], False
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            status = None
            self.hung = processes(self.proc.pid, self.servers, self.terminal)
        else:
            try:
                wait_until(lambda: not ours(self.proc.pid, self.servers),
                           "what make run started to end", timeout=SETTLE_BOUND)
            except TimeoutError:
                pass
        self.left_pids = ours(self.proc.pid, self.servers)
        if self.left_pids:
            self.left = processes(self.proc.pid, self.servers)
        self.served = serving is not None and serving()
        kill_stack(self.proc.pid, self.servers)
        self.proc.wait(EXIT_BOUND)
        self.reader.join(EXIT_BOUND)
        return status


def stat(pid):
    """(state, ppid, pgid, session) of pid, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None


def ours(sid, servers=True):
    """The processes of make run: those of its session (make, scripts/run,
    a build) and, with servers, those whose working directory is the copy
    or under it (the servers, which run in sessions of their own, their
    workers, the embedded cluster's postgres), zombies left out."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        st = stat(pid)
        if st is None or st[0] == "Z":
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = ""
        if st[3] == sid or servers and (cwd == copy or cwd.startswith(copy + "/") or
                                        cwd.startswith(copy + " (deleted)")):
            found.append(int(pid))
    return found


def processes(sid, servers=True, terminal=None):
    """What of make run still runs, one line each (pid, ppid, process
    group, session, state, what it waits in, command line), and the
    terminal's foreground group: a hang's diagnostics."""
    lines = []
    if terminal is not None:
        try:
            lines.append(f"terminal's foreground process group: {os.tcgetpgrp(terminal)}")
        except OSError as e:
            lines.append(f"terminal's foreground process group: {e}")
    for pid in ours(sid, servers):
        st = stat(pid)
        if st is None:
            continue
        try:
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"{pid} ppid {st[1]} pgid {st[2]} sid {st[3]} {st[0]} {wchan}: {cmd}")
    return "\n".join(lines)


def kill_stack(sid, servers=True):
    """SIGKILL to all of make run (ours()): a failed test leaves nothing
    of it running. A server left running goes on acting on the shared
    database: its recovery job would claim the next tests' keys."""
    for _ in range(50):
        left = ours(sid, servers)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.1)


run = MakeRun("devloop", env)
# However this test ends (a failed assertion, an exception), nothing of
# the make runs it started is left: the one running then is stopped.
atexit.register(lambda: kill_stack(run.proc.pid))


def output():
    return run.output()


def answers():
    try:
        return request(port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200
    except OSError:
        return False


def title():
    return request(port, "GET", "/nope").json()["title"]


def workers():
    with open(os.path.join(copy, "kore.pid")) as f:
        pid = int(f.read())
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return sorted(int(p) for p in f.read().split())


def edit(path, old, new):
    path = os.path.join(copy, path)
    with open(path) as f:
        text = f.read()
    assert old in text, (path, old)
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def order(comment):
    return post(port, "/v1/orders", {"customer_id": "c-loop", "amount": 500,
                                     "currency": "RUB", "comment": comment},
                key=new_key("loop"))


held_build = os.path.join(TMP, "devloop-build.pid")
try:
    wait_until(lambda: run.proc.poll() is not None or answers(), "make run to serve",
               timeout=START_BOUND)
    t.ok(answers(), "make run serves the API", output()[-3000:])
    before = workers()
    t.eq(title(), "No such resource", "the code as it was")
    t.eq(order("x" * 1500).status, 400, "a 1500-byte comment is refused (limit 1024)")

    # A second make run of the same checkout says who holds it and exits
    # non-zero, touching nothing: no build, no pid file, no reload.
    pid_files = {f: open(os.path.join(copy, f)).read()
                 for f in ("kore.pid", "provider.pid") if os.path.exists(os.path.join(copy, f))}
    app_mtime = os.stat(os.path.join(copy, "app.so")).st_mtime
    second = MakeRun("devloop-second", env, servers=False)
    second_status = second.wait()
    said = second.output()
    held = re.search(r"make run, pid (\d+)", said)
    t.ok(second_status not in (None, 0) and held is not None,
         "a second make run of the checkout exits non-zero and names the holder",
         f"status {second_status}\n{said[-1500:]}")
    holder = int(held.group(1)) if held else 0
    t.ok(holder > 0 and alive(holder) and "scripts/run" in open(
        f"/proc/{holder}/cmdline").read().replace("\0", " "),
        "the holder it names is the first make run's script")
    t.eq({f: open(os.path.join(copy, f)).read() for f in pid_files}, pid_files,
         "the first one's pid files are untouched")
    t.eq(os.stat(os.path.join(copy, "app.so")).st_mtime, app_mtime,
         "nothing was built over its code")
    t.ok(answers() and workers() == before, "and the first one serves on, same workers")

    # A .c file.
    edit("src/core/problem.c", '"No such resource"', '"No such resource here"')
    wait_until(lambda: title() == "No such resource here", "the edit to serve",
               timeout=BUILD_BOUND)
    t.ok(all(title() == "No such resource here" for _ in range(10)),
         "an edited .c file serves within seconds")
    t.eq(workers(), before, "by the same workers: none lost")

    # scripts/ is watched too: the OpenAPI document is written by
    # scripts/openapi.py at every build, and served from the build.
    edit("scripts/openapi.py", '"title": "Idempotent payments API"',
         '"title": "Idempotent payments API, edited"')
    wait_until(lambda: b"payments API, edited" in request(port, "GET", "/openapi.json").body,
               "the scripts/ edit to serve", timeout=BUILD_BOUND)
    t.ok(b"payments API, edited" in request(port, "GET", "/openapi.json").body,
         "an edit to scripts/openapi.py is built and served")
    t.eq(workers(), before, "by the same workers")

    # A header: every file that includes it is built again.
    edit("src/core/idem.h", "#define IDEM_TEXT_MAX\t\t1024", "#define IDEM_TEXT_MAX\t\t2048")
    wait_until(lambda: order("x" * 1500).status == 201, "the header edit to serve",
               timeout=BUILD_BOUND)
    t.eq(order("x" * 1500).status, 201, "an edited header rebuilds what includes it")
    t.eq(workers(), before, "still the same workers")

    # A migration that fails is named, and the code is not reloaded over
    # it (the new code may call what it defines).
    bad = os.path.join(copy, "sql", "099_dev_loop_bad.sql")
    with open(bad, "w") as f:
        f.write("select idem_dev_loop_no_such_function();\n")
    wait_until(lambda: "migration failed" in output(), "the failed migration to be reported",
               timeout=BUILD_BOUND)
    t.ok("099_dev_loop_bad.sql failed" in output() and
         "reloaded" not in output().split("migration failed")[-1],
         "a failed migration is named and nothing is reloaded", output()[-1500:])
    t.ok(answers() and title() == "No such resource here", "the old code keeps serving")
    with open(bad, "w") as f:
        f.write("select 1;\n")
    wait_until(lambda: "reloaded" in output().split("migration failed")[-1],
               "the fixed migration to reload", timeout=BUILD_BOUND)
    os.unlink(bad)

    # A build that fails keeps the last good code.
    edit("src/core/problem.c", '"No such resource here"', '"No such resource here" !')
    wait_until(lambda: "build failed" in output(), "the broken build to be reported",
               timeout=BUILD_BOUND)
    t.eq(title(), "No such resource here", "a failed build leaves the old code serving")
    t.ok("error:" in output().split("changed:")[-1], "and prints the compiler's errors",
         output()[-1500:])
    edit("src/core/problem.c", '"No such resource here" !', '"No such resource again"')
    wait_until(lambda: title() == "No such resource again", "the fix to serve",
               timeout=BUILD_BOUND)
    t.eq(workers(), before, "the same workers after all three edits")

    # A build whose counters are laid out otherwise (a counter added),
    # loaded by a reload into the same workers: the counters start again
    # from zero, on the right labels, and the log says so.
    created = 'route="POST /v1/orders",outcome="created"'
    t.ok(metric(port, "idem_requests_total", created) >= 1, "orders were counted")
    mark = len(output())
    # The next free counter, whatever the counters are now.
    with open(os.path.join(copy, "src/core/metrics.h")) as f:
        n = int(re.search(r"#define COUNTER_MAX\t+(\d+)", f.read()).group(1))
    edit("src/core/metrics.h", f"#define COUNTER_MAX\t\t\t{n}",
         f"#define COUNTER_DEV_LOOP\t\t{n}\n#define COUNTER_MAX\t\t\t{n + 1}")
    edit("src/core/metrics.c", "\t[COUNTER_REPLAY_CACHE_HITS] = {",
         '\t[COUNTER_DEV_LOOP] = { "idem_dev_loop_total", "A counter of the dev '
         'loop\'s test." },\n\t[COUNTER_REPLAY_CACHE_HITS] = {')
    wait_until(lambda: b"idem_dev_loop_total" in request(port, "GET", "/metrics").body,
               "the new counter to be served", timeout=BUILD_BOUND)
    # Both workers on the new build (a worker still on the old one counts
    # nothing); their log lines reach make run's terminal through a pipe.
    wait_until(lambda: all(f"api      | [wrk {w}]: reloaded" in output()[mark:]
                           for w in (1, 2)), "both workers to reload", timeout=ANSWER_BOUND)
    # The line comes from the first process of the new build to attach to
    # the counters (this test saw it missing once, in a plain run beside
    # two loaded ones; if it is again, the failure shows the reload's lines).
    try:
        wait_until(lambda: "they start again from zero" in output(),
                   "the log to say the counters start again")
    except TimeoutError:
        pass
    t.ok("they start again from zero" in output(),
         "a reload with another layout of the counters says they start from zero",
         "\n".join(line for line in output()[mark:].splitlines()
                   if re.search(r"reload|metrics:|build|changed|started|exited", line)))
    t.eq(metric(port, "idem_requests_total", created), 0, "and they do")
    t.eq(order("fresh").status, 201, "an order is served")
    t.eq(metric(port, "idem_requests_total", created), 1,
         "and counted on its own label")
    t.eq(metric(port, "idem_dev_loop_total"), 0, "the new counter reads 0")
    t.eq(workers(), before, "by the same workers: none crashed")

    # A new line in the route table: Kore routes a path when it starts, so
    # make run restarts the API by itself, and says so.
    edit("src/operations/routes.c", "#if defined(DEV_ROUTES)\n\t{ HTTP_METHOD_POST",
         '\t{ HTTP_METHOD_GET, "/v1/orders-again", "GET /v1/orders-again",\n'
         "\t    &order_list_operation },\n#if defined(DEV_ROUTES)\n\t{ HTTP_METHOD_POST")
    wait_until(lambda: "restarted: the API serves the new route table" in output(),
               "the API to restart on the new route table", timeout=BUILD_BOUND)
    wait_until(answers, "the restarted API to answer")
    t.ok("the route table changed: restarting the API" in output(),
         "a route table change restarts the API, and make run says so", output()[-1500:])
    t.eq(get(port, "/v1/orders-again?customer_id=c-loop").status, 200,
         "the new route is served")
    t.ok(workers() != before, "by new workers")
    t.eq(title(), "No such resource again", "with the code as last edited")

    # A Ctrl-C during a build (below, in finally): the build is held in
    # scripts/openapi.py, which the build runs first, until it is killed.
    edit("scripts/openapi.py", "def main():\n",
         f"def main():\n    open({held_build!r}, 'w').write(str(os.getpid()))\n"
         "    import time\n    time.sleep(600)\n")
    wait_until(lambda: os.path.exists(held_build) and os.path.getsize(held_build) > 0,
               "the build to be held")
finally:
    # Ctrl-C, typed in make run's terminal.
    pids = []
    try:
        pids = workers()
    except (OSError, ValueError):
        pass
    if run.proc.poll() is None:
        run.ctrl_c()
    status = run.wait(serving=answers)

t.ok(status == 0, "Ctrl-C during a build stops make run with exit status 0",
     f"status {status}\n" + output()[-1500:] +
     (f"\nstill running after {STOP_BOUND} s:\n{run.hung}" if run.hung else ""))
t.ok(os.path.exists(held_build) and status is not None and
     int(open(held_build).read() or 0) not in run.left_pids,
     "and the build with it")
# The builds below are not held.
shutil.copy2(os.path.join(ROOT, "scripts", "openapi.py"),
             os.path.join(copy, "scripts", "openapi.py"))
t.ok("Interrupt" not in output() and "Error" not in output().split("stopped")[-1],
     "and make reports no interrupt or error", output()[-800:])
t.ok(not run.served, "and the API with it")
t.ok(pids and not run.left, "no worker is left behind: nothing of the stack runs",
     f"workers before: {pids}\nleft running:\n{run.left}")

# make run on the embedded cluster (the copy's .pgdata, on a port of its
# own), stopped with SIGTERM to make, as a process manager or `kill`
# stops it, then with two Ctrl-Cs a second apart, as an impatient user
# stops it: either way all of it stops, the cluster too.
embedded = dict(env, IDEM_EMBEDDED_PGPORT=str(free_port()))
del embedded["IDEM_DATABASE_URL"]
pgdata = os.path.join(copy, ".pgdata")
embedded_url = (f"host=127.0.0.1 port={embedded['IDEM_EMBEDDED_PGPORT']} dbname=idem "
                "user=idem")
slow = os.path.join(copy, "sql", "098_dev_loop_slow.sql")


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def stack():
    """The stack's processes: both kore parents, their workers, and the
    cluster's postmaster."""
    pids = []
    for name in ("kore.pid", "provider.pid", ".pgdata/postmaster.pid"):
        with open(os.path.join(copy, name)) as f:
            pid = int(f.readline())
        pids += [pid] + children(pid)
    return pids


def provider_answers():
    try:
        return request(provider_port, "GET", "/v1/charges?idempotency_key=x",
                       timeout=HEALTH_BOUND).status == 200
    except OSError:
        return False


for how in ("SIGTERM", "Ctrl-C twice"):
    for name in ("kore.pid", "provider.pid"):
        if os.path.exists(os.path.join(copy, name)):
            os.unlink(os.path.join(copy, name))
    run = MakeRun("devloop-" + how.split()[0].lower(), embedded)
    pids = []
    try:
        wait_until(lambda: run.proc.poll() is not None or
                   (answers() and provider_answers() and
                    all(os.path.exists(os.path.join(copy, f)) for f in
                        ("kore.pid", "provider.pid", ".pgdata/postmaster.pid"))),
                   f"make run on the embedded cluster to serve ({how})", timeout=START_BOUND)
        pids = stack()
        t.ok(answers() and len(pids) > 4 and all(alive(p) for p in pids),
             f"make run serves on the embedded cluster ({how})", output()[-2000:])
        if how == "SIGTERM":
            os.kill(run.proc.pid, signal.SIGTERM)
        else:
            # During a migration, held in PostgreSQL until it is stopped.
            with open(slow, "w") as f:
                f.write("select pg_sleep(600);\n")
            def held():
                return subprocess.run(
                    ["psql", embedded_url, "-XAtc", "select count(*) from pg_stat_activity"
                     " where query like 'select pg_sleep(600)%'"],
                    capture_output=True, text=True).stdout.strip()

            wait_until(lambda: held() == "1", "the migration to be held")
            run.ctrl_c()
            # The second while the stop runs: its first step ends the
            # change being applied (the migration ignores Ctrl-C itself).
            wait_until(lambda: held() != "1", "the first Ctrl-C's stop to end the migration",
                       timeout=STOP_BOUND)
            run.ctrl_c()
    finally:
        status = run.wait(serving=lambda: answers() or provider_answers())
        if os.path.exists(slow):
            os.unlink(slow)
    if how == "SIGTERM":
        t.ok(status is not None, "SIGTERM to make: make run ends",
             output()[-1500:] + f"\nstill running after {STOP_BOUND} s:\n{run.hung}")
    else:
        t.ok(status == 0, "two Ctrl-Cs during a migration: make run ends with exit status 0",
             f"status {status}\n" + output()[-1500:] +
             (f"\nstill running after {STOP_BOUND} s:\n{run.hung}" if run.hung else ""))
        t.ok("Interrupt" not in output(), "and make reports no interrupt", output()[-800:])
    t.ok("stopped" in output(), f"{how}: the stack says it stopped", output()[-1500:])
    t.ok(all(re.search(rf"^{who} +\| .*goodbye", output(), re.M)
             for who in ("provider", "api")),
         f"{how}: and the servers' last lines reach the terminal", output()[-1500:])
    t.ok(not run.left, f"{how}: no kore process, no postgres of the cluster left",
         f"the stack's processes: {pids}\nleft running:\n{run.left}")
    t.ok(not run.served, f"{how}: the API and provider no longer answer")
subprocess.run(["bash", "-c", f'. "{copy}/scripts/lib.sh"; cluster_stop "{pgdata}"'],
               env=embedded)

# kodev as Kore users run it, in the checkout make built once: kodev build
# compiles an edited .c file, and kodev run serves it (kodev names the
# application after the directory: make build linked conf/devloop.conf).
# The migration held above is gone, and the list of sql/ the module
# expects (src/core/schema_list.c) is written by make build, not kodev:
# made again as make build would, or the module would find its database
# behind it (docs/development.md).
subprocess.run(["bash", "-c", f'. "{copy}/scripts/lib.sh"; schema_list'], check=True)
edit("src/core/problem.c", '"No such resource again"', '"No such resource by kodev"')
built = subprocess.run(["kodev", "build"], cwd=copy, env=env, capture_output=True, text=True)
t.ok(built.returncode == 0 and "problem.c" in built.stdout + built.stderr,
     "kodev build compiles the edited file", built.stdout + built.stderr)
kodev = subprocess.Popen(["kodev", "run"], cwd=copy, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.STDOUT, start_new_session=True,
                         preexec_fn=as_from_a_terminal)
try:
    wait_until(lambda: kodev.poll() is not None or answers(), "kodev run to serve",
               timeout=START_BOUND)
    t.eq(title(), "No such resource by kodev", "kodev run serves it")
finally:
    os.killpg(kodev.pid, signal.SIGINT)
    try:
        kodev_status = kodev.wait(KODEV_STOP_BOUND)
    except subprocess.TimeoutExpired:
        kodev_status = None
        os.killpg(kodev.pid, signal.SIGKILL)
        kodev.wait(EXIT_BOUND)
t.ok(kodev_status is not None, f"kodev run stops on Ctrl-C (a bound on a hang: {KODEV_STOP_BOUND} s)")
t.eq(kodev_status, 0, "with exit status 0")
t.ok(not answers(), "and the API with it")
shutil.rmtree(copy, ignore_errors=True)
t.done()
