"""The configuration tables of docs/operations.md (its Configuration
section) name exactly the environment variables the code reads:

- every variable the service reads (getenv() in src/, the settings
  tables of src/core/settings.c) and every one the scripts read
  (scripts/*, the Makefile, conf/*, deploy/*: $VAR and ${VAR...} outside comments,
  os.environ in Python, env(VAR) in haproxy's file) has a row;
- every row names a variable something reads: the service, the scripts,
  or the test programs (tests/: the knobs of the test targets);
- every variable of the environment table of the shared contract
  (/work/shared/API.md, Running) and of docs/API.md has a row.

Each failure lists the names."""

import glob
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import ROOT, Tap  # noqa: E402

t = Tap()

NAME = r"IDEM_[A-Z0-9_]+"
# The shared contract, beside the worktrees (absent from a plain clone).
SHARED_API = next((p for p in (os.path.join(ROOT, "..", "shared", "API.md"),
                                os.path.join(ROOT, "..", "..", "shared", "API.md"))
                   if os.path.isfile(p)), "")

# Issue 28's two settings: read by the service now; they must have rows.
ISSUE_28 = {"IDEM_PROVIDER_SETTLE_SECONDS", "IDEM_PROVIDER_KEY_RETENTION_SECONDS"}


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def service_reads():
    """getenv("IDEM_...") and getenv(MACRO) of a #define, and the names of
    the settings tables, in the C sources of the module."""
    out = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "**", "*.c"), recursive=True)):
        rel = os.path.relpath(path, ROOT)
        text = re.sub(r"/\*.*?\*/", "", read(rel), flags=re.S)
        defines = dict(re.findall(r'#define\s+(\w+)\s+"(' + NAME + ')"', text))
        for arg in re.findall(r"getenv\(\s*([^)]*?)\s*\)", text):
            name = arg.strip('"') if arg.startswith('"') else defines.get(arg)
            if name and re.fullmatch(NAME, name):
                out.setdefault(name, set()).add(rel)
        if rel == os.path.join("src", "core", "settings.c"):
            for name in re.findall(r'\{\s*"(' + NAME + ')"\s*,', text):
                out.setdefault(name, set()).add(rel)
    return out


SHELL_REF = re.compile(r"\$\{?(" + NAME + ")")
PY_REF = re.compile(r"(?:environ\.get|environ\.setdefault|getenv)\(\s*['\"](" + NAME +
                    r")|environ\[\s*['\"](" + NAME + ")")
HAPROXY_REF = re.compile(r"env\((" + NAME + r")\)")


def references(paths):
    """The variables the files read, outside comment lines."""
    out = {}
    for rel in paths:
        for line in read(rel).splitlines():
            if line.lstrip().startswith("#"):
                continue
            names = set(SHELL_REF.findall(line)) | set(HAPROXY_REF.findall(line))
            names |= {a or b for a, b in PY_REF.findall(line)}
            for name in names:
                out.setdefault(name, set()).add(rel)
    return out


def files(*patterns):
    out = []
    for p in patterns:
        for path in sorted(glob.glob(os.path.join(ROOT, p), recursive=True)):
            if os.path.isfile(path) and not path.endswith(".c"):
                out.append(os.path.relpath(path, ROOT))
    return out


def table_names(markdown, section=None):
    """The variables in the first column of the tables of a Markdown text
    (of one '## ' section of it, when named)."""
    if section:
        m = re.search(r"^## " + re.escape(section) + r"\s*$(.*?)(?=^## |\Z)", markdown,
                      flags=re.M | re.S)
        markdown = m.group(1) if m else ""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^\|\s*([^|]*)\|", line)
        if m:
            out |= set(re.findall(r"`(" + NAME + r")`", m.group(1)))
    return out


def listing(names, where):
    return "\n".join(f"{n} ({', '.join(sorted(where.get(n, ())))})" if where else n
                     for n in sorted(names))


service = service_reads()
scripts = references(files("scripts/*", "Makefile", "conf/*", "deploy/*"))
tests = references(files("tests/**/*.py"))
operations = read(os.path.join("docs", "operations.md"))
documented = table_names(operations, "Configuration")

t.ok(len(service) >= 20 and "IDEM_DATABASE_URL" in service and
     "IDEM_PROVIDER_SECRET" in service, "the service's reads are found (getenv, settings.c)",
     ", ".join(sorted(service)))
t.ok("IDEM_TLS_PORT" in scripts and "IDEM_API_PORT" in scripts and
     "IDEM_LATE_TABLE" in scripts, "the scripts' reads are found (shell, Python, haproxy)",
     ", ".join(sorted(scripts)))
t.ok(len(documented) >= 20, "docs/operations.md's Configuration has its tables")

missing = set(service) - documented
t.ok(not missing, "every variable the service reads has a row in docs/operations.md's "
     "Configuration", "read but not documented:\n" + listing(missing, service))
missing = set(scripts) - documented
t.ok(not missing, "every variable the scripts read has a row there too",
     "read but not documented:\n" + listing(missing, scripts))

never = documented - set(service) - set(scripts) - set(tests)
t.ok(not never, "every row names a variable the service, the scripts or the "
     "tests read", "documented but never read:\n" + listing(never, {}))
for name in sorted(ISSUE_28):
    t.ok(name in documented and name in service, f"{name} (issue 28) has its row, "
         "and the service reads it")

for must in ("IDEM_PROVIDER_KIND", "IDEM_PROVIDER_SECRET", "IDEM_FAKE_PROVIDER_KEEPS_5XX"):
    t.ok(must in documented, f"{must} has its row")

running = {}
if os.path.isfile(SHARED_API):
    with open(SHARED_API, encoding="utf-8") as f:
        running["the shared contract"] = table_names(f.read(), "Running")
else:
    t.note(f"no shared contract at {SHARED_API}: only docs/API.md is compared")
running["docs/API.md"] = table_names(read(os.path.join("docs", "API.md")), "Running")
for what, names in running.items():
    t.ok(len(names) >= 10, f"{what}'s environment table is found")
    missing = names - documented
    t.ok(not missing, f"every variable of {what}'s environment table has a row in "
         "docs/operations.md", "in the contract's table but not documented:\n" +
         listing(missing, {}))

t.done()
