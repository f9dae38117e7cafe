"""haproxy as the strict edge (conf/haproxy.cfg, or a configuration made
from it by deploy/edge-config) in front of the APIs a test started, on
loopback ports: tests/http/76_deploy.py and 77_reason_phrase.py."""

import atexit
import os
import signal
import subprocess

from harness import COMMAND_BOUND, EXIT_BOUND, HEALTH_BOUND, TMP, free_port, request, wait_until

_edges = []


@atexit.register
def _stop_leftovers():
    for e in _edges:
        e.kill()


def self_signed_pem(path):
    """A certificate for 127.0.0.1 and its key in one PEM file, as haproxy's
    crt takes it (the tests read plain HTTP, and HTTPS unverified)."""
    key, crt = path + ".key", path + ".crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-subj", "/CN=127.0.0.1", "-days", "2", "-keyout", key, "-out", crt],
                   check=True, capture_output=True, timeout=COMMAND_BOUND)
    with open(path, "w") as out:
        for part in (crt, key):
            with open(part) as f:
                out.write(f.read())
    os.remove(key)
    os.remove(crt)
    return path


class Edge:
    """haproxy -Ws -f cfg, with the environment given, run as `user` (a name,
    through setpriv) when one is given; its log (its standard output) in
    TMP/<name>.log."""

    def __init__(self, cfg, env, name="edge", user=None, pidfile=None):
        self.cfg = cfg
        self.env = dict(os.environ, **{k: str(v) for k, v in env.items()})
        self.port = int(self.env["IDEM_PORT"])
        self.tls_port = int(self.env["IDEM_TLS_PORT"])
        self.name = name
        self.user = user
        self.pidfile = pidfile or os.path.join(TMP, f"{name}.pid")
        self.logpath = os.path.join(TMP, f"{name}.log")
        self.proc = None

    def check(self):
        """haproxy -c: the configuration as haproxy reads it, with this
        environment."""
        return subprocess.run(self._as_user(["haproxy", "-c", "-q", "-f", self.cfg]),
                              env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_BOUND)

    def start(self):
        self.log = open(self.logpath, "a")
        self.proc = subprocess.Popen(
            self._as_user(["haproxy", "-Ws", "-f", self.cfg, "-p", self.pidfile]),
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        _edges.append(self)

        def ready():
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited: {self.read_log()}")
            try:
                return request(self.port, "GET", "/healthz", timeout=HEALTH_BOUND).status == 200
            except OSError:
                return False
        wait_until(ready, f"{self.name} to answer /healthz")
        return self

    def _as_user(self, argv):
        if self.user is None:
            return argv
        return ["setpriv", f"--reuid={self.user}", f"--regid={self.user}",
                "--init-groups", "--inh-caps=-all"] + argv

    def stop(self):
        """SIGTERM to the master, as systemd's stop does; True if it and
        its worker exited."""
        if self.proc is None or self.proc.poll() is not None:
            return True
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(EXIT_BOUND)
        except subprocess.TimeoutExpired:
            self.kill()
            return False
        return True

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(EXIT_BOUND)

    def read_log(self):
        with open(self.logpath, errors="replace") as f:
            return f.read()
