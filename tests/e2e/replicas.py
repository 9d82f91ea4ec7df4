"""HAProxy in front of thaw replicas, for the routing tests and benches.

The configuration is written by deploy/haproxy.sh, the script operators run,
so the configuration under test is the one that ships. HAProxy runs in the
foreground (master-worker, `-W -db`) as the current user, with its pid file
and stats socket in the folder it is given."""
import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

import requests

from harness import REPO

SCRIPT = os.path.join(REPO, "deploy", "haproxy.sh")


def haproxy_binary():
    """The haproxy executable, or None. Debian installs it in /usr/sbin,
    which a normal user's PATH lacks."""
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)), None)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HAProxy:
    """A running HAProxy routing to `backends` [(host, port), ...]; they are
    servers thaw1..thawN of backend `replicas`, in that order.

    Starting waits until HAProxy listens and every backend has passed a
    health check. `check_ms` is the health-check interval (the shipped
    default is 2000; tests use less so a dead replica is seen quickly)."""

    BACKEND = "replicas"

    def __init__(self, dir, backends, balance_factor=150, check_ms=200, extra_args=(), timeout=30):
        self.dir = str(dir)
        os.makedirs(self.dir, exist_ok=True)
        self.socket_path = os.path.join(self.dir, "haproxy.sock")
        if len(self.socket_path.encode()) >= 108:  # sun_path
            raise ValueError(f"{self.socket_path} is too long for a unix socket")
        self.names = [f"thaw{i + 1}" for i in range(len(backends))]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["bash", SCRIPT, "-d", self.dir, "-l", f"127.0.0.1:{self.port}", "-f", str(balance_factor),
                "-i", str(check_ms), *extra_args, *[f"{h}:{p}" for h, p in backends]]
        self.config = subprocess.run(args, check=True, capture_output=True, text=True).stdout
        self.cfg_path = os.path.join(self.dir, "haproxy.cfg")
        with open(self.cfg_path, "w") as f:
            f.write(self.config)
        binary = haproxy_binary()
        if not binary:
            raise RuntimeError("haproxy is not installed (scripts/setup.sh installs it)")
        self.lines = []
        self.proc = subprocess.Popen([binary, "-W", "-db", "-f", self.cfg_path], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))

        self.reader = threading.Thread(target=pump, daemon=True)
        self.reader.start()
        try:
            self._wait_ready(timeout)
        except Exception:
            self.stop()
            raise

    def _wait_ready(self, timeout):
        deadline = time.time() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}:\n" + self.log())
            try:
                st = self.stats()
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                # every server checked at least once, and up
                if all(st[n]["status"] == "UP" and st[n]["check_status"] == "L7OK" for n in self.names):
                    return
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("haproxy did not see every backend up:\n" + self.log())
            time.sleep(0.05)

    def log(self):
        return "\n".join(self.lines)

    # ---- stats socket ----

    def command(self, cmd):
        """One command on the stats socket (admin level); its reply."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(self.socket_path)
            s.sendall(cmd.encode() + b"\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out.decode()

    def stats(self):
        """{server name: its `show stat` row} for the replicas' backend."""
        text = self.command("show stat")
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {r["svname"]: r for r in rows
                if r["pxname"] == self.BACKEND and r["svname"] not in ("FRONTEND", "BACKEND")}

    def backend_status(self):
        """{server name: status}: "UP", "DOWN", or on the way ("UP 1/2": one
        failed check of the two that take it down), "MAINT", "DRAIN"."""
        return {n: r["status"] for n, r in self.stats().items()}

    def wait_status(self, name, status, timeout=30):
        """Waits until server `name` has `status`; returns the seconds it took."""
        t0 = time.time()
        while (now := self.backend_status()[name]) != status:
            assert time.time() - t0 < timeout, f"{name} is still {now!r}, not {status!r}, after {timeout} s"
            time.sleep(0.05)
        return time.time() - t0

    def wait_down(self, name, timeout=30):
        return self.wait_status(name, "DOWN", timeout)

    def wait_up(self, name, timeout=30):
        return self.wait_status(name, "UP", timeout)

    # ---- HTTP, as harness.Server ----

    def post(self, path, body, headers=None, stream=False, timeout=300):
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return requests.post(self.url + path, data=data, headers=headers, stream=stream, timeout=timeout)

    def get(self, path, headers=None):
        return requests.get(self.url + path, headers=headers, timeout=60)

    def chat(self, messages, headers=None, **kw):
        body = {"messages": messages, "temperature": 0, "max_tokens": 16, **kw}
        r = self.post("/v1/chat/completions", body, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()

    def stop(self, timeout=10):
        """SIGTERM to the master (it stops its worker), SIGKILL if that hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
