"""docs/deploy.md's pieces, run as its systemd units would run them
(systemd itself is not started: this machine's services are left alone).

- The units of deploy/systemd/ pass `systemd-analyze verify` (no word of
  it, with the release path pointing at this tree) and say what the page
  promises: the instance template's user, its two environment files, its
  runtime directory, Kore's flags as make cluster runs it, Restart=always,
  a LimitNOFILE above kore.conf's worker_rlimit_nofiles, the edge's check
  before its start.
- Every variable of the example environment files has a row in
  docs/operations.md's Configuration.
- Two instances are started from the template's own command lines
  (ExecStartPre, then ExecStart, %i and the paths put in), with its
  environment files (the database, the provider's address and secret put
  in) and its LimitNOFILE, as an unprivileged user (nobody, for idem):
  they serve with the release's tree read-only to them, their kore.conf
  and pid file in their runtime directory, and their workers hold the
  files Kore asks for.
- The edge is made by deploy/edge-config for their ports and run from the
  edge unit's command lines as the haproxy user: a client added with
  scripts/idemctl gets its orders served by both instances in turn, a
  payment charged once at the Stripe mock (IDEM_PROVIDER_KIND=stripe, as
  the example sets), a 422 with its reason phrase, HTTPS with HSTS.
- SIGTERM, systemd's stop, ends each instance and the edge.
- The instance unit runs instance-conf from /opt/idem/bin, outside the
  releases, and it makes 1.0.0's kore.conf too (a rollback to 1.0.0,
  whose tree has no deploy/, starts under these units).
- make test-upgrade in a release as docs/deploy.md makes one (no history,
  a prod build) refuses before it builds: the prod build stays."""

import atexit
import grp
import os
import pwd
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import http.client

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import harness  # noqa: E402
from harness import (COMMAND_BOUND, DB_URL, HEALTH_BOUND, REQUEST_BOUND, ROOT,  # noqa: E402
                     STRIPE_SECRET, StripeMock, Tap, alive, free_port, new_key, post, sql_value,
                     wait_until)
from edge import Edge, self_signed_pem  # noqa: E402

t = Tap()
DEPLOY = os.path.join(ROOT, "deploy")
UNIT_DIR = os.path.join(DEPLOY, "systemd")
RELEASE = "/opt/idem/current"
# deploy/instance-conf as docs/deploy.md installs it, outside the releases.
INSTANCE_CONF = "/opt/idem/bin/instance-conf"
# The unprivileged user the instances run as here, for the units' idem.
USER = "nobody"


def unit(name):
    """A unit file's [section] key=value lines, keys repeated as systemd
    allows: {(section, key): [values]}."""
    out, section = {}, None
    with open(os.path.join(UNIT_DIR, name)) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            m = re.match(r"^\[(\w+)\]$", line)
            if m:
                section = m.group(1)
                continue
            k, _, v = line.partition("=")
            out.setdefault((section, k.strip()), []).append(v.strip())
    return out


def env_file(path):
    """NAME=value lines as systemd's EnvironmentFile reads them (a value in
    single or double quotes is unquoted), comments and blank lines left."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            k, _, v = line.partition("=")
            if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                v = v[1:-1]
            out[k] = v
    return out


def one(u, section, key):
    values = u.get((section, key), [])
    return values[0] if len(values) == 1 else None


api_unit = unit("idem@.service")
edge_unit = unit("idem-edge.service")

# --- what the units say -----------------------------------------------------------
t.eq(one(api_unit, "Service", "User"), "idem", "the instances run as idem")
t.eq(api_unit.get(("Service", "EnvironmentFile")), ["/etc/idem/idem.env", "/etc/idem/%i.env"],
     "their settings: /etc/idem/idem.env, then the instance's /etc/idem/<instance>.env")
t.eq(one(api_unit, "Service", "RuntimeDirectory"), "idem/%i",
     "each its runtime directory, /run/idem/<instance>")
start = one(api_unit, "Service", "ExecStart")
cluster_flags = re.findall(r"\bkore (-\w+) ", open(os.path.join(ROOT, "scripts", "cluster")).read())
t.ok(start is not None and shlex.split(start)[:2] == ["/usr/bin/kore", cluster_flags[0]] and
     cluster_flags == ["-fnrc"], "ExecStart is kore with make cluster's flags (-fnrc)",
     f"{start!r}, scripts/cluster: {cluster_flags}")
t.eq(one(api_unit, "Service", "Restart"), "always", "Restart=always")
nofile = int(re.search(r"^worker_rlimit_nofiles\s+(\d+)", open(os.path.join(ROOT, "kore.conf")).read(),
                       re.M).group(1))
limit = one(api_unit, "Service", "LimitNOFILE")
t.ok(limit is not None and limit.isdigit() and int(limit) >= 2 * nofile,
     f"LimitNOFILE ({limit}) leaves room above worker_rlimit_nofiles ({nofile})")
t.ok(any("kill -HUP $MAINPID" in v for v in api_unit.get(("Service", "ExecReload"), [])),
     "ExecReload sends SIGHUP (the module's new build)")
t.eq(one(api_unit, "Install", "WantedBy"), "multi-user.target", "started at boot")
pre = shlex.split(one(api_unit, "Service", "ExecStartPre") or "-")
t.eq(pre[0], INSTANCE_CONF, "ExecStartPre runs instance-conf from outside the releases: a "
     "rollback to a release without deploy/instance-conf (1.0.0) starts")

t.eq(edge_unit.get(("Service", "EnvironmentFile")), ["/etc/idem/edge.env"],
     "the edge's settings: /etc/idem/edge.env")
t.eq(one(edge_unit, "Service", "ExecStartPre"), "/usr/sbin/haproxy -c -q -f /etc/idem/haproxy.cfg",
     "the edge checks its configuration before it starts")
t.ok((one(edge_unit, "Service", "ExecStart") or "").startswith(
    "/usr/sbin/haproxy -Ws -f /etc/idem/haproxy.cfg"), "and runs it in master-worker mode")
t.eq([one(edge_unit, "Service", k) for k in ("User", "Restart", "AmbientCapabilities")],
     ["haproxy", "always", "CAP_NET_BIND_SERVICE"],
     "as the haproxy user, restarted always, allowed ports below 1024")

# The hardening both units share (systemd-analyze security), and each
# one's capabilities: none for an instance, the low ports for the edge.
HARDENING = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
             "PrivateTmp": "yes", "PrivateDevices": "yes", "ProtectKernelTunables": "yes",
             "ProtectKernelModules": "yes", "ProtectControlGroups": "yes",
             "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
             "LockPersonality": "yes", "UMask": "0077"}
for name, u, caps in (("idem@", api_unit, ""), ("idem-edge", edge_unit, "CAP_NET_BIND_SERVICE")):
    want = dict(HARDENING, CapabilityBoundingSet=caps)
    got = {k: one(u, "Service", k) for k in want}
    t.eq(got, want, f"{name}.service is hardened: read-only system, no home, private /tmp "
         f"and devices, its address families, capabilities {caps or 'none'}")
t.eq(one(api_unit, "Service", "Environment"), "PGPASSFILE=/etc/idem/pgpass",
     "the instances read the database's password from /etc/idem/pgpass, not the URL")

# --- systemd's own check --------------------------------------------------------------
if shutil.which("systemd-analyze"):
    vdir = tempfile.mkdtemp(prefix="idem-units-")
    atexit.register(shutil.rmtree, vdir, True)
    for name in os.listdir(UNIT_DIR):
        with open(os.path.join(UNIT_DIR, name)) as f:
            text = f.read().replace(INSTANCE_CONF, os.path.join(DEPLOY, "instance-conf"))
            text = text.replace(RELEASE, ROOT)
        with open(os.path.join(vdir, name), "w") as f:
            f.write(text)
    os.symlink("idem@.service", os.path.join(vdir, "idem@api1.service"))
    # A bound on a hang, not a verdict.
    v = subprocess.run(["systemd-analyze", "verify", os.path.join(vdir, "idem@api1.service"),
                        os.path.join(vdir, "idem-edge.service")],
                       capture_output=True, text=True, timeout=COMMAND_BOUND)
    t.ok(v.returncode == 0 and not (v.stdout + v.stderr).strip(),
         "systemd-analyze verify: not a word about either unit", v.stdout + v.stderr)
else:
    t.note("systemd-analyze is not installed: the units were only parsed")

# --- make test-upgrade in a deployed release ---------------------------------------------
# A release as step 2 makes it: a clone without the previous release's
# commit (here: the tracked files as they are, one commit), built prod.
# make test-upgrade refuses it before it builds anything: the tree keeps
# its prod build (it once built the dev flavor over it, then refused).
rel = tempfile.mkdtemp(prefix="idem-release-")
atexit.register(shutil.rmtree, rel, True)
tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                         check=True).stdout.decode().split("\0")
for f in filter(None, tracked):
    src = os.path.join(ROOT, f)
    if os.path.isfile(src) and not os.path.islink(src):
        os.makedirs(os.path.join(rel, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(src, os.path.join(rel, f))
git = ["git", "-C", rel, "-c", "user.name=t", "-c", "user.email=t@localhost"]
for g in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the release"]):
    subprocess.run(git + g, check=True, capture_output=True)
with open(os.path.join(rel, ".build-flavor"), "w") as f:
    f.write("prod\n")
os.symlink("release.so", os.path.join(rel, "app.so"))
# A bound on a hang (the old order built the module first), not a verdict.
UPGRADE_BOUND = 900
up = subprocess.run(["make", "-s", "-C", rel, "test-upgrade"], capture_output=True, text=True,
                    timeout=UPGRADE_BOUND, env=dict(os.environ, IDEM_TEST_CLUSTER_PORT=str(free_port())))
t.ok(up.returncode != 0 and "not in this clone's history" in up.stderr and
     "development checkout" in up.stderr, "make test-upgrade in a deployed release: "
     "refused, told to run in a development checkout", up.stdout + up.stderr)
t.eq((open(os.path.join(rel, ".build-flavor")).read(), os.readlink(os.path.join(rel, "app.so")),
      sorted(n for n in os.listdir(rel) if n.endswith(".so"))),
     ("prod\n", "release.so", ["app.so"]), "and built nothing over its prod build")

# --- a rollback to 1.0.0: the installed instance-conf serves its kore.conf ----------------
first, commit = next(l.split() for l in open(os.path.join(ROOT, "RELEASES"))
                     if l.strip() and not l.startswith("#"))
shown = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:kore.conf"], capture_output=True,
                       text=True)
if shown.returncode == 0:
    old = os.path.join(rel, "old")
    os.makedirs(os.path.join(old, "run"))
    with open(os.path.join(old, "kore.conf"), "w") as f:
        f.write(shown.stdout)
    open(os.path.join(old, "app.so"), "w").close()
    made = subprocess.run([os.path.join(DEPLOY, "instance-conf"), old, os.path.join(old, "run")],
                          capture_output=True, text=True, timeout=COMMAND_BOUND)
    conf = open(os.path.join(old, "run", "kore.conf")).read() if made.returncode == 0 else ""
    t.ok(re.search(rf"^load {re.escape(os.path.realpath(old))}/app\.so ", conf, re.M) and
         f"pidfile {old}/run/kore.pid" in conf, f"instance-conf makes release {first}'s "
         "kore.conf (a rollback to it under these units)", made.stderr + conf)
else:
    t.note(f"release {first} ({commit}) is not in this clone: its kore.conf was not tried")

# --- the example environment files ----------------------------------------------------
documented = set()
ops = open(os.path.join(ROOT, "docs", "operations.md")).read()
section = re.search(r"^## Configuration\s*$(.*?)(?=^## )", ops, re.M | re.S).group(1)
for line in section.splitlines():
    m = re.match(r"^\|\s*([^|]*)\|", line)
    if m:
        documented |= set(re.findall(r"`(IDEM_[A-Z0-9_]+)`", m.group(1)))
envs = {n: env_file(os.path.join(DEPLOY, "env", n)) for n in ("idem.env", "api1.env", "edge.env")}
unknown = {k for e in envs.values() for k in e} - documented
t.ok(not unknown, "every variable of deploy/env/*.env has its row in docs/operations.md",
     ", ".join(sorted(unknown)))
t.eq((envs["idem.env"].get("IDEM_PROVIDER_KIND"), envs["idem.env"].get("IDEM_PROVIDER_URL")),
     ("stripe", "https://api.stripe.com"), "the example speaks to Stripe's real API")
t.eq(envs["api1.env"].get("IDEM_HOST"), "127.0.0.1", "an instance listens on loopback only")

# --- the instances, as the template runs them -------------------------------------------
run = tempfile.mkdtemp(prefix="idem-run-")    # /run, as systemd makes it
atexit.register(shutil.rmtree, run, True)
os.chmod(run, 0o755)
uid, gid = pwd.getpwnam(USER).pw_uid, pwd.getpwnam(USER).pw_gid
hgid = grp.getgrnam("haproxy").gr_gid
stripe = StripeMock().start()
tcp_db = re.sub(r"host=\S+", "host=127.0.0.1", DB_URL)


# The unit's LimitNOFILE, or this machine's hard limit where it is lower (a
# container's: only systemd, with CAP_SYS_RESOURCE, may raise it).
import resource  # noqa: E402
applied = min(int(limit), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
if applied < int(limit):
    t.note(f"LimitNOFILE={limit} applied as {applied}, this machine's hard limit")


def command(line, instance):
    """A unit's command line with %i and the paths of this machine put in."""
    line = line.replace(INSTANCE_CONF, os.path.join(DEPLOY, "instance-conf"))
    line = line.replace(RELEASE, ROOT).replace("/run/idem/%i", os.path.join(run, instance))
    return shlex.split(line.replace("%i", instance))


def as_user(argv, limit=None):
    pre = ["prlimit", f"--nofile={limit}:{limit}", "--"] if limit else []
    # The unit's NoNewPrivileges=yes and empty CapabilityBoundingSet=.
    return pre + ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"] + argv


class Instance:
    def __init__(self, name):
        self.name = name
        self.port = free_port()
        self.dir = os.path.join(run, name)
        os.mkdir(self.dir)
        os.chown(self.dir, uid, gid)
        # systemd's environment: the two files, nothing of this shell's.
        self.env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
        self.env.update(envs["idem.env"])
        self.env.update(envs["api1.env"])
        self.env.update(dict(v.split("=", 1) for v in api_unit.get(("Service", "Environment"), [])))
        self.env.update(IDEM_DATABASE_URL=tcp_db + f" application_name=deploy-{name}",
                        IDEM_PORT=str(self.port), IDEM_PROVIDER_URL=stripe.url,
                        IDEM_PROVIDER_SECRET=STRIPE_SECRET)
        # make test-sanitize: the sanitizers' runtime and its options.
        if os.environ.get("IDEM_TEST_KORE_PRELOAD"):
            self.env["LD_PRELOAD"] = os.environ["IDEM_TEST_KORE_PRELOAD"]
            for v in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS"):
                if v in os.environ:
                    self.env[v] = os.environ[v]
        self.logpath = os.path.join(harness.TMP, f"deploy-{name}.log")
        self.proc = None

    def start(self):
        pre = subprocess.run(as_user(command(one(api_unit, "Service", "ExecStartPre"), self.name)),
                             cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=COMMAND_BOUND)
        if pre.returncode != 0:
            raise RuntimeError(f"ExecStartPre of {self.name}: {pre.stderr}")
        self.log = open(self.logpath, "a")
        self.proc = subprocess.Popen(as_user(command(start, self.name), applied), cwd=ROOT,
                                     env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.kill)
        wait_until(lambda: self._ready(), f"{self.name} to answer")
        return self

    def _ready(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.read_log()}")
        try:
            return harness.request(self.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200
        except OSError:
            return False

    def workers(self):
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return []

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            for pid in [self.proc.pid] + self.workers():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(harness.EXIT_BOUND)

    def read_log(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()

    def access(self, path, status):
        return len(re.findall(rf" access .*path={re.escape(path)} status={status} ",
                              self.read_log()))


instances = [Instance("api1").start(), Instance("api2").start()]
for i in instances:
    with open(os.path.join(i.dir, "kore.conf")) as f:
        conf = f.read()
    t.ok(f"load {os.path.realpath(ROOT)}/app.so" in conf and f"pidfile {i.dir}/kore.pid" in conf,
         f"{i.name}: instance-conf made its kore.conf (the module by its path, its own pid file)")
    t.eq(open(os.path.join(i.dir, "kore.pid")).read().strip(), str(i.proc.pid),
         f"{i.name}: its pid file in its runtime directory")
    ws = i.workers()
    limits = []
    for w in ws:
        with open(f"/proc/{w}/limits") as f:
            limits += [int(l.split()[3]) for l in f if l.startswith("Max open files")]
        with open(f"/proc/{w}/status") as f:
            t.ok(any(l.split()[1:2] == [str(uid)] for l in f if l.startswith("Uid:")),
                 f"{i.name}: worker {w} runs as the unit's user, not root")
    t.ok(len(ws) == 2 and all(n >= nofile for n in limits) and "setrlimit" not in i.read_log(),
         f"{i.name}: each worker holds at least {nofile} files (under a limit of {applied})",
         f"{limits} {i.read_log()[-2000:]}")

# --- the edge, as its unit runs it -------------------------------------------------------
edir = os.path.join(run, "idem-edge")
os.mkdir(edir)
os.chown(edir, 0, hgid)
os.chmod(edir, 0o770)
cfg = os.path.join(edir, "haproxy.cfg")
made = subprocess.run([os.path.join(DEPLOY, "edge-config")] + [str(i.port) for i in instances],
                      capture_output=True, text=True, timeout=COMMAND_BOUND)
t.ok(made.returncode == 0 and made.stdout.count(" check") >= 4, "edge-config writes a backend "
     "of the two instances", made.stderr)
with open(cfg, "w") as f:
    f.write(made.stdout)
pem = self_signed_pem(os.path.join(edir, "tls.pem"))
for p in (cfg, pem):
    os.chown(p, 0, hgid)
    os.chmod(p, 0o640)
eport = free_port()
eenv = dict(envs["edge.env"], IDEM_BIND_ADDRESS="127.0.0.1", IDEM_PORT=eport,
            IDEM_TLS_PORT=free_port(), IDEM_TLS_PEM=pem,
            IDEM_PUBLIC_URL=f"http://127.0.0.1:{eport}")
edge = Edge(cfg, eenv, name="deploy-edge", user="haproxy",
            pidfile=os.path.join(edir, "haproxy.pid"))
checked = edge.check()
t.ok(checked.returncode == 0, "the edge's ExecStartPre: haproxy -c accepts it", checked.stderr)
edge.start()
harness._api_ports.add(edge.port)    # its answers are the API's: checked against the document

# Both instances in haproxy's rotation: its checks (rise 2) have reached each.
wait_until(lambda: all(i.access("/healthz", 200) >= 3 for i in instances),
           "haproxy's checks to reach both instances")

added = subprocess.run([os.path.join(ROOT, "scripts", "idemctl"), "client", "add",
                        f"deploy-{os.getpid()}"], env=dict(os.environ, IDEM_DATABASE_URL=DB_URL),
                       capture_output=True, text=True, timeout=COMMAND_BOUND)
token = added.stdout.strip().splitlines()[-1] if added.returncode == 0 else ""
t.ok(token.startswith("idem_"), "the first client, added with scripts/idemctl", added.stderr)

before = [i.access("/v1/orders", 201) for i in instances]
keys = [new_key("deploy") for _ in range(8)]
answers = [post(edge.port, "/v1/orders", {"customer_id": "c-deploy", "amount": 300,
                                          "currency": "RUB"}, key=k, token=token).status
           for k in keys]
t.eq(answers, [201] * 8, "eight orders through the edge, with the new client's token")
# An access line is written once the answer is sent: the last one may
# come after its client has read the answer.
served = wait_until(lambda: (lambda s: s if sum(s) == 8 else None)(
    [i.access("/v1/orders", 201) - b for i, b in zip(instances, before)]),
    "both instances' access lines for the eight orders",
    show=lambda: [i.access("/v1/orders", 201) - b for i, b in zip(instances, before)])
t.ok(sum(served) == 8 and all(s > 0 for s in served), "both instances served them "
     "(round robin)", served)
t.eq(int(sql_value("select count(*) from orders where idem_key in (" +
                   ",".join(f"'{k}'" for k in keys) + ")")), 8, "eight orders in the database")

pkey = new_key("deploy-pay")
p = post(edge.port, "/v1/payments", {"amount": 1500, "currency": "RUB", "recipient": "acc-1",
                                     "payment_method": "tok_visa"}, key=pkey, token=token)
t.ok(p.status == 201 and len(stripe.charges_of(f"deploy-{os.getpid()}:{pkey}")) == 1,
     "a payment: one charge at the Stripe mock (IDEM_PROVIDER_KIND=stripe)", p)

conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=REQUEST_BOUND)
conn.request("POST", "/v1/orders", body=b'{"customer_id":"c-deploy","amount":301,'
             b'"currency":"RUB"}', headers={"Authorization": f"Bearer {token}",
                                           "Content-Type": "application/json",
                                           "Idempotency-Key": keys[0]})
r = conn.getresponse()
r.read()
conn.close()
t.eq((r.status, r.reason), (422, "Unprocessable Content"), "a key reused: its 422 with its "
     "reason phrase")

ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
conn = http.client.HTTPSConnection("127.0.0.1", edge.tls_port, timeout=REQUEST_BOUND, context=ctx)
conn.request("GET", "/healthz")
r = conn.getresponse()
r.read()
conn.close()
t.ok(r.status == 200 and r.getheader("Strict-Transport-Security") ==
     f"max-age={envs['edge.env']['IDEM_HSTS_MAX_AGE']}", "HTTPS, with HSTS as edge.env sets it",
     r.getheaders())

# --- systemd's stop: SIGTERM ---------------------------------------------------------------
for i in instances:
    pids = [i.proc.pid] + i.workers()
    i.proc.send_signal(signal.SIGTERM)
    i.proc.wait(int(one(api_unit, "Service", "TimeoutStopSec") or 15))
    wait_until(lambda: not any(alive(p) for p in pids), f"{i.name}'s workers to exit")
    t.ok(not os.path.exists(os.path.join(i.dir, "kore.pid")), f"{i.name}: SIGTERM stops it, "
         "parent and workers, and its pid file goes")
t.ok(edge.stop(), "SIGTERM stops the edge")
stripe.stop()
t.done()
