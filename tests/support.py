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
        self.config = config
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
