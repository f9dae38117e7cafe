"""Every example of the README and docs/ that talks to the service runs, and
prints what the page says it prints.

An example is a fenced block marked console: a line that starts with "$ "
is a command (a line ending in a backslash goes on), and the lines after
it, up to the next command, are its output. In that output "..." stands
for any text within a line, and a line that is only "..." for any number
of lines; the rest must match exactly. The commands run with bash from the
repository, with IDEM_PORT and IDEM_PROVIDER_PORT set, against one stack
of their own (a fresh database with the dev data), in the order a reader
meets them: the README first, then docs/ by name.

A block of another kind may not send curl to that stack: such an example
would escape this test. The ones left are about another stack (the
cluster, the Stripe kind), and say so."""

import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, DB_URL, ROOT, Api, Provider, Tap)  # noqa: E402

t = Tap()
name = f"idem_docs_{os.getpid()}"
admin = re.sub(r"dbname=\S+", "dbname=postgres", DB_URL)
url = re.sub(r"dbname=\S+", f"dbname={name}", DB_URL)
BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
OTHER_STACK = re.compile(r"IDEM_PROVIDER_KIND=stripe|--cacert|https://|\.cluster/")


def psql(conninfo, query):
    subprocess.run(["psql", conninfo, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-c", query],
                   check=True, capture_output=True)


def pages():
    return ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in
                                  glob.glob(os.path.join(ROOT, "docs", "*.md")))


def commands(block):
    """A console block's (command, expected output lines)."""
    out, lines = [], block.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise ValueError(f"output before any command: {line!r}")
        cmd = line[2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd + "\n" + lines[i]
        i += 1
        expect = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expect.append(lines[i])
            i += 1
        out.append((cmd, expect))
    return out


def matches(expect, got):
    pattern = ""
    for line in expect:
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += ".*".join(re.escape(p) for p in line.split("...")) + r"\n"
    text = got.replace("\r\n", "\n")
    if text and not text.endswith("\n"):
        text += "\n"
    return re.fullmatch(pattern, text) is not None


# The blocks that escape the test: curl to the dev stack outside console.
for page in pages():
    with open(os.path.join(ROOT, page)) as f:
        text = f.read()
    for kind, block in BLOCK.findall(text):
        if kind != "console" and "curl" in block and not OTHER_STACK.search(block):
            t.ok(False, f"{page}: a {kind or 'plain'} block sends curl to the dev stack: "
                 f"make it a console block", block)

psql(admin, f"drop database if exists {name}")
psql(admin, f"create database {name}")
for step in ("migrate", "load_dev_data"):
    subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/lib.sh"; {step} "$0"', url],
                   check=True, capture_output=True)

provider = Provider(IDEM_PROVIDER_LATENCY_MS=0)
provider.env["IDEM_DATABASE_URL"] = url
provider.start()
api = Api(IDEM_PROVIDER_URL=provider.url)
api.env["IDEM_DATABASE_URL"] = url
api.start()
env = dict(os.environ, IDEM_PORT=str(api.port), IDEM_PROVIDER_PORT=str(provider.port))

ran = 0
try:
    for page in pages():
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        for kind, block in BLOCK.findall(text):
            if kind != "console":
                continue
            try:
                steps = commands(block)
            except ValueError as e:
                t.ok(False, f"{page}: a console block that can be read: {e}")
                continue
            for cmd, expect in steps:
                first = cmd.splitlines()[0][:70]
                try:
                    r = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, timeout=COMMAND_BOUND,
                                       capture_output=True, text=True)
                except subprocess.TimeoutExpired:
                    t.ok(False, f"{page}: $ {first}", "it ran past 60 s")
                    continue
                t.ok(r.returncode == 0 and matches(expect, r.stdout),
                     f"{page}: $ {first}",
                     f"exit {r.returncode}\n--- the page says\n" + "\n".join(expect) +
                     f"\n--- it printed\n{r.stdout}{r.stderr}")
                ran += 1
    t.ok(ran >= 15, f"{ran} examples ran")
finally:
    api.stop()
    provider.stop()
    psql(admin, f"drop database if exists {name}")
t.done()
