"""Test drivers for the controller: real ``ferrymq controller`` processes, a real 3-member etcd cluster on
loopback, and fake brokers (threads that register and heartbeat over HTTP, following the leader)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from support import _live, free_port, http

ETCD = shutil.which("etcd")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class _Child:
    """A child process whose output goes to a log file; stopped by PID."""

    proc: subprocess.Popen[bytes] | None = None
    log_path: Path

    def _spawn(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(list(args), stdout=logf, stderr=subprocess.STDOUT,
                                         env={**os.environ, **(env or {})})
        _live.add(self.proc)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self, timeout: float = 20) -> int:
        return self._signal(signal.SIGTERM, timeout)

    def _signal(self, sig: int, timeout: float = 20) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        rc = self.proc.wait(timeout)
        _live.discard(self.proc)
        return rc


class ControllerProcess(_Child):
    """``python -m ferrymq controller`` on a free port."""

    def __init__(self, workdir: Path, store: str, *, name: str = "controller", heartbeat_timeout_ms: int = 1500,
                 unclean: bool = False, lease_seconds: int = 2, switch_timeout_ms: int | None = None,
                 scan_interval_ms: int = 200, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.store = store
        self.log_path = workdir / f"{name}.log"
        self.args = [sys.executable, "-m", "ferrymq", "controller", "--listen", f"127.0.0.1:{self.port}",
                     "--store", store, "--heartbeat-timeout-ms", str(heartbeat_timeout_ms),
                     "--lease-seconds", str(lease_seconds), "--scan-interval-ms", str(scan_interval_ms)]
        if unclean:
            self.args.append("--enable-elect-unclean-master")
        if switch_timeout_ms is not None:
            self.args += ["--switch-timeout-ms", str(switch_timeout_ms)]
        self.env = env

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20) -> ControllerProcess:
        self._spawn(self.args, self.env)
        wait_for(lambda: self._healthy(), timeout, f"controller on {self.port} to answer\n{self.log()[-2000:]}")
        return self

    def _healthy(self) -> bool:
        if not self.running:
            raise AssertionError(f"controller exited: {self.log()[-3000:]}")
        with contextlib.suppress(OSError):
            return http("GET", f"{self.url}/v1/health", timeout=1)[0] == 200
        return False

    def health(self) -> dict[str, Any]:
        status, body = http("GET", f"{self.url}/v1/health", timeout=5)
        assert status == 200, body
        return body

    def is_leader(self) -> bool:
        with contextlib.suppress(OSError, AssertionError):
            return bool(self.health()["leader"])
        return False

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(method, f"{self.url}{path}", body, timeout=10)


class EtcdCluster:
    """Three etcd members on loopback, each on free client and peer ports, data in a temp dir."""

    def __init__(self, workdir: Path, size: int = 3) -> None:
        assert ETCD is not None
        self.workdir = workdir
        self.members = []
        names = [f"m{i}" for i in range(size)]
        peers = {n: free_port() for n in names}
        clients = {n: free_port() for n in names}
        initial = ",".join(f"{n}=http://127.0.0.1:{peers[n]}" for n in names)
        token = f"ferrymq-test-{os.getpid()}-{time.monotonic_ns()}"
        for n in names:
            m = _Child()
            m.log_path = workdir / f"etcd-{n}.log"
            m.args = [ETCD, "--name", n, "--data-dir", str(workdir / f"etcd-{n}"),  # type: ignore[attr-defined]
                      "--listen-client-urls", f"http://127.0.0.1:{clients[n]}",
                      "--advertise-client-urls", f"http://127.0.0.1:{clients[n]}",
                      "--listen-peer-urls", f"http://127.0.0.1:{peers[n]}",
                      "--initial-advertise-peer-urls", f"http://127.0.0.1:{peers[n]}",
                      "--initial-cluster", initial, "--initial-cluster-token", token,
                      "--initial-cluster-state", "new", "--log-level", "warn"]
            self.members.append(m)
        self.client_ports = [clients[n] for n in names]

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.client_ports)

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoints}/{prefix}"

    def start(self, timeout: float = 30) -> EtcdCluster:
        for m in self.members:
            m._spawn(m.args)  # type: ignore[attr-defined]

        def healthy() -> bool:
            for m, port in zip(self.members, self.client_ports, strict=True):
                if not m.running:
                    raise AssertionError(f"etcd exited: {m.log()[-2000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as resp:
                        if json.loads(resp.read()).get("health") not in ("true", True):
                            return False
                except (OSError, ValueError):
                    return False
            return True

        wait_for(healthy, timeout, "the etcd cluster to become healthy", interval=0.2)
        return self

    def stop(self) -> None:
        for m in self.members:
            if m.proc is not None:
                with contextlib.suppress(Exception):
                    m.terminate(10)


def post_json(url: str, body: Any, timeout: float = 3) -> tuple[int, Any, str | None]:
    """POST without following redirects: (status, body, Location)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"null"), None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        return exc.code, payload, exc.headers.get("Location")


class FakeBroker:
    """A test driver that speaks the controller's broker API: register, then heartbeat on a thread.

    It follows the leader the way a broker must: a 307 names the leader; a 503 or a refused connection
    moves on to the next controller in its list. ``stop()`` silences it (a dead broker, for the controller).
    """

    def __init__(self, controllers: Sequence[str], group: str, name: str, *, max_offset: int = 0, epoch: int = 0,
                 priority: int = 0, interval: float = 0.25, topics: dict[str, Any] | None = None) -> None:
        self.controllers = list(controllers)
        self.group = group
        self.name = name
        self.max_offset = max_offset
        self.epoch = epoch
        self.priority = priority
        self.interval = interval
        self.topics = topics
        self.writable: bool | None = True
        self.broker_id: int | None = None
        self.last: dict[str, Any] | None = None  # the last answer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leader = 0

    def _post(self, path: str, body: Any) -> tuple[int, Any]:
        url = f"{self.controllers[self._leader]}{path}"
        for _ in range(2 * len(self.controllers) + 2):
            try:
                status, payload, location = post_json(url, body)
            except OSError:
                status, payload, location = 0, None, None
            if status == 307 and location:
                url = location
                continue
            if status in (0, 503):
                self._leader = (self._leader + 1) % len(self.controllers)
                url = f"{self.controllers[self._leader]}{path}"
                continue
            base = url[: -len(path)]
            if base in self.controllers:
                self._leader = self.controllers.index(base)
            return status, payload
        return status, payload

    def register(self) -> dict[str, Any]:
        status, body = self._post("/v1/brokers/register", {
            "group": self.group, "name": self.name, "httpAddress": f"127.0.0.1:{1000 + hash(self.name) % 999}",
            "tcpAddress": "127.0.0.1:1", "haAddress": "127.0.0.1:2", "brokerId": self.broker_id,
            "electionPriority": self.priority})
        assert status == 200, (status, body)
        self.broker_id = body["brokerId"]
        self.last = body["group"]
        return body

    def heartbeat(self) -> tuple[int, Any]:
        status, body = self._post("/v1/brokers/heartbeat", {
            "group": self.group, "brokerId": self.broker_id, "epoch": self.epoch, "maxOffset": self.max_offset,
            "confirmOffset": self.max_offset, "electionPriority": self.priority, "writable": self.writable,
            "topics": self.topics})
        if status == 404 and isinstance(body, dict) and body["error"]["code"] == "BROKER_NOT_REGISTERED":
            self.register()
        elif status == 200:
            self.last = body
            # like a broker: a master asked to stop taking writes (graceful switch) stops, and says so
            self.writable = bool(body.get("writable"))
        return status, body

    def start(self) -> FakeBroker:
        if self.broker_id is None:
            self.register()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=f"fake-broker-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                self.heartbeat()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
