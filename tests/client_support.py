"""Support for the client and consumer-group tests: consumer worker processes (so one can be
kill -9ed) that log every message they consume as a JSON line, and helpers to read those logs.

Run as a script, this file *is* the worker:
    python client_support.py URL GROUP TOPIC OUT [--orderly] [--from earliest] [--sleep-ms N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class Worker:
    """A consumer process; stopped by PID (SIGTERM, then SIGKILL) in ``stop``."""

    def __init__(self, url: str, group: str, topic: str, out: Path, *, orderly: bool = False,
                 sleep_ms: int = 0, consume_from: str = "earliest") -> None:
        self.out = out
        args = [sys.executable, str(HERE / "client_support.py"), url, group, topic, str(out), "--from", consume_from,
                "--sleep-ms", str(sleep_ms)]
        if orderly:
            args.append("--orderly")
        self.log = open(out.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        return self.out.exists() and "started" in self.out.read_text()

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.out)

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if "o" in rec:
                out.append(rec)
    return out


def wait_for(pred: Any, timeout: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("out")
    p.add_argument("--orderly", action="store_true")
    p.add_argument("--from", dest="from_", default="earliest")
    p.add_argument("--sleep-ms", type=int, default=0)
    a = p.parse_args()

    from ferrymq.client import ConsumeResult, PushConsumer, ReceivedMessage

    out = open(a.out, "a", buffering=1)
    lock = threading.Lock()
    stop = threading.Event()
    cid: list[str] = []

    def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
        for m in msgs:
            with lock:
                out.write(json.dumps({"cid": cid[0] if cid else "?", "q": m.queue_id, "o": m.queue_offset,
                                      "body": m.body.decode(), "t": time.time()}) + "\n")
            if a.sleep_ms:
                time.sleep(a.sleep_ms / 1000)
        return ConsumeResult.SUCCESS

    consumer = PushConsumer(a.url, group=a.group, topic=a.topic, listener=listener, orderly=a.orderly,
                            consume_from=a.from_, rebalance_interval=2.0, auto_commit_interval=0.5,
                            lock_interval=1.0, consume_thread_count=4)
    cid.append(consumer.client_id)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.start()
    with lock:
        out.write(json.dumps({"started": consumer.client_id}) + "\n")
    stop.wait()
    consumer.shutdown()
    out.close()


if __name__ == "__main__":
    _main()
