"""The dev loop: `make run` (scripts/run) watches the sources; an edited .c
or .h file is built and loaded into the running processes by a reload, with
the same workers and the same database; a build or a migration that fails
leaves the old code serving; Ctrl-C stops the stack, and `make run` ends
with exit status 0.

`make run` runs in a terminal of its own (a pseudo-terminal), as a user
runs it: Ctrl-C there signals the terminal's foreground process group,
which holds make too.

Runs on a copy of the tree, so that the edits touch nothing of the repo."""

import fcntl
import os
import pty
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (DB_URL, ROOT, TMP, Tap, alive, free_port, new_key,  # noqa: E402
                     post, request, wait_until)

t = Tap()

copy = os.path.join(TMP, "devloop")
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                       check=True, capture_output=True, text=True).stdout.split()
for f in files:
    if os.path.isfile(os.path.join(ROOT, f)):
        os.makedirs(os.path.join(copy, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(copy, f))

port, provider_port = free_port(), free_port()
# Its jobs stay out of the way of the other tests' keys in the shared
# database: this test is about the loop, not the jobs.
env = dict(os.environ, IDEM_DATABASE_URL=DB_URL, IDEM_PORT=str(port),
           IDEM_PROVIDER_PORT=str(provider_port),
           IDEM_PROVIDER_URL=f"http://127.0.0.1:{provider_port}",
           IDEM_RECOVERY_AFTER_SECONDS="604800",
           IDEM_CLEANUP_INTERVAL_SECONDS="86400")
logpath = os.path.join(TMP, "devloop.log")
log = open(logpath, "wb", buffering=0)
terminal, tty = pty.openpty()


def take_terminal():
    # A session of its own, whose controlling terminal is the pty.
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


run = subprocess.Popen(["make", "-s", "run"], cwd=copy, env=env, stdin=tty, stdout=tty,
                       stderr=tty, start_new_session=True, preexec_fn=take_terminal)
os.close(tty)


def copy_terminal():
    while True:
        try:
            data = os.read(terminal, 4096)
        except OSError:
            return
        if not data:
            return
        log.write(data)


reader = threading.Thread(target=copy_terminal, daemon=True)
reader.start()


def output():
    with open(logpath, errors="replace") as f:
        return f.read()


def answers():
    try:
        return request(port, "GET", "/healthz", timeout=2).status == 200
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


try:
    wait_until(lambda: run.poll() is not None or answers(), "make run to serve",
               timeout=180)
    t.ok(answers(), "make run serves the API", output()[-3000:])
    before = workers()
    t.eq(title(), "No such resource", "the code as it was")
    t.eq(order("x" * 1500).status, 400, "a 1500-byte comment is refused (limit 1024)")

    # A .c file.
    edit("src/core/problem.c", '"No such resource"', '"No such resource here"')
    wait_until(lambda: title() == "No such resource here", "the edit to serve", timeout=90)
    t.ok(all(title() == "No such resource here" for _ in range(10)),
         "an edited .c file serves within seconds")
    t.eq(workers(), before, "by the same workers: none lost")

    # A header: every file that includes it is built again.
    edit("src/core/idem.h", "#define IDEM_TEXT_MAX\t\t1024", "#define IDEM_TEXT_MAX\t\t2048")
    wait_until(lambda: order("x" * 1500).status == 201, "the header edit to serve",
               timeout=120)
    t.eq(order("x" * 1500).status, 201, "an edited header rebuilds what includes it")
    t.eq(workers(), before, "still the same workers")

    # A migration that fails is named, and the code is not reloaded over
    # it (the new code may call what it defines).
    bad = os.path.join(copy, "sql", "099_dev_loop_bad.sql")
    with open(bad, "w") as f:
        f.write("select idem_dev_loop_no_such_function();\n")
    wait_until(lambda: "migration failed" in output(), "the failed migration to be reported",
               timeout=90)
    t.ok("099_dev_loop_bad.sql failed" in output() and
         "reloaded" not in output().split("migration failed")[-1],
         "a failed migration is named and nothing is reloaded", output()[-1500:])
    t.ok(answers() and title() == "No such resource here", "the old code keeps serving")
    with open(bad, "w") as f:
        f.write("select 1;\n")
    wait_until(lambda: "reloaded" in output().split("migration failed")[-1],
               "the fixed migration to reload", timeout=90)
    os.unlink(bad)

    # A build that fails keeps the last good code.
    edit("src/core/problem.c", '"No such resource here"', '"No such resource here" !')
    wait_until(lambda: "build failed" in output(), "the broken build to be reported",
               timeout=90)
    t.eq(title(), "No such resource here", "a failed build leaves the old code serving")
    t.ok("error" in output(), "and prints the compiler's errors")
    edit("src/core/problem.c", '"No such resource here" !', '"No such resource again"')
    wait_until(lambda: title() == "No such resource again", "the fix to serve",
               timeout=90)
    t.eq(workers(), before, "the same workers after all three edits")
finally:
    # Ctrl-C, typed in make run's terminal.
    pids = []
    try:
        pids = workers()
    except (OSError, ValueError):
        pass
    if run.poll() is None:
        os.write(terminal, b"\x03")
    try:
        status = run.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        status = run.wait(10)
    reader.join(5)

t.ok(status == 0, "Ctrl-C stops make run with exit status 0",
     f"status {status}\n" + output()[-1500:])
t.ok("Interrupt" not in output() and "Error" not in output().split("stopped")[-1],
     "and make reports no interrupt or error", output()[-800:])
time.sleep(0.5)
t.ok(not answers(), "and the API with it")
t.ok(not any(alive(p) for p in pids), "no worker is left behind")

# kodev as Kore users run it, in the checkout make built once: kodev build
# compiles an edited .c file, and kodev run serves it (kodev names the
# application after the directory: make build linked conf/devloop.conf).
edit("src/core/problem.c", '"No such resource again"', '"No such resource by kodev"')
built = subprocess.run(["kodev", "build"], cwd=copy, env=env, capture_output=True, text=True)
t.ok(built.returncode == 0 and "problem.c" in built.stdout + built.stderr,
     "kodev build compiles the edited file", built.stdout + built.stderr)
kodev = subprocess.Popen(["kodev", "run"], cwd=copy, env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.STDOUT, start_new_session=True)
try:
    wait_until(lambda: kodev.poll() is not None or answers(), "kodev run to serve",
               timeout=120)
    t.eq(title(), "No such resource by kodev", "kodev run serves it")
finally:
    os.killpg(kodev.pid, signal.SIGINT)
    try:
        kodev.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(kodev.pid, signal.SIGKILL)
        kodev.wait(10)
t.ok(not answers(), "and stops on Ctrl-C")
shutil.rmtree(copy, ignore_errors=True)
t.done()
