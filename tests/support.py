"""Test support: free ports, and real broker processes that are always stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

_live: set[subprocess.Popen[bytes]] = set()
# Test brokers use small commit-log segments: the 1 GiB default is preallocated (and the next segment
# allocated ahead), which would fill CI's disk with a few dozen brokers.
TEST_BROKER_CONFIG: dict[str, Any] = {"mappedFileSizeCommitLog": 16 * 1024 * 1024}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
    """One HTTP call; returns (status, parsed JSON or None). Never raises on 4xx/5xx."""
    data = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw and resp.headers.get_content_type() == "application/json"
                                 else raw.decode() if raw else None)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")


class BrokerProcess:
    """``ferrymq standalone`` in a child process on free ports."""

    def __init__(self, data_dir: Path, *, flush: str = "sync", config: dict[str, Any] | None = None,
                 http_port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.flush = flush
        self.config = {**TEST_BROKER_CONFIG, **(config or {})}
        self.http_port = http_port or free_port()
        self.tcp_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 30) -> BrokerProcess:
        args = [sys.executable, "-m", "ferrymq", "standalone", "--data-dir", str(self.data_dir),
                "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port), "--flush", self.flush]
        if self.config:
            cfg = self.data_dir.parent / f"{self.data_dir.name}-config.json"
            cfg.write_text(json.dumps(self.config))
            args += ["--config", str(cfg)]
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, env={**os.environ})
        logf.close()
        _live.add(self.proc)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                status, _ = http("GET", f"{self.url}/v1/health", timeout=1)
                if status == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"broker did not become healthy: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def kill9(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self, timeout: float = 30) -> int:
        return self._signal(signal.SIGTERM, timeout)

    def _signal(self, sig: int, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        rc = self.proc.wait(timeout)
        _live.discard(self.proc)
        return rc

    def call(self, method: str, path: str, body: Any = None, timeout: float = 30) -> tuple[int, Any]:
        return http(method, f"{self.url}{path}", body, timeout)


def kill_all() -> None:
    for proc in list(_live):
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(10)
        _live.discard(proc)


class ControllerProcess:
    """``ferrymq controller`` in a child process (file store unless told otherwise)."""

    def __init__(self, workdir: Path, *, store: str | None = None, extra: list[str] | None = None,
                 port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.store = store or f"file://{self.workdir / 'controller-state.json'}"
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"controller-{self.port}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> ControllerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "ferrymq", "controller", "--listen", f"127.0.0.1:{self.port}",
                "--store", self.store, *self.extra]
        logf = open(self.log_path, "ab")  # handed to the child
        self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        _live.add(self.proc)
        _wait_healthy(self.proc, f"{self.url}/v1/health", timeout, self.log_path)
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        _stop(self.proc, sig)

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        return http(method, f"{self.url}{path}", body, timeout)


class ReplicaProcess:
    """``ferrymq broker`` (one replica in controller mode) in a child process on free ports."""

    def __init__(self, workdir: Path, name: str, group: str, controller: str, *, flush: str = "sync",
                 replication: str = "sync", config: dict[str, Any] | None = None) -> None:
        self.workdir = Path(workdir)
        self.name = name
        self.group = group
        self.controller = controller
        self.flush = flush
        self.replication = replication
        self.config = {**TEST_BROKER_CONFIG, **(config or {})}
        self.data_dir = self.workdir / name
        self.http_port, self.tcp_port, self.ha_port = free_port(), free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"{name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 30) -> ReplicaProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self.workdir / f"{self.name}-config.json"
        cfg.write_text(json.dumps(self.config))
        args = [sys.executable, "-m", "ferrymq", "broker", "--group", self.group, "--data-dir", str(self.data_dir),
                "--http-port", str(self.http_port), "--tcp-port", str(self.tcp_port), "--ha-port", str(self.ha_port),
                "--controller", self.controller, "--flush", self.flush, "--replication", self.replication,
                "--config", str(cfg), "--name", self.name, "--host", "127.0.0.1", "--advertise-host", "127.0.0.1"]
        logf = open(self.log_path, "ab")  # handed to the child
        self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
        logf.close()
        _live.add(self.proc)
        _wait_healthy(self.proc, f"{self.url}/v1/health", timeout, self.log_path)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        _stop(self.proc, signal.SIGKILL)

    def stop(self) -> None:
        _stop(self.proc, signal.SIGTERM)

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        return http(method, f"{self.url}{path}", body, timeout)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
        with contextlib.suppress(OSError):
            status, _ = http("GET", url, timeout=1)
            if status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become healthy: {log_path.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes] | None, sig: int, timeout: float = 30) -> None:
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)  # a paused process must run to act on the signal
            os.kill(proc.pid, sig)
    proc.wait(timeout)
    _live.discard(proc)


def wait_until(predicate: Any, timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
