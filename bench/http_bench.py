"""HTTP-level benchmark: a real ``ferrymq standalone`` child process, loaded by bench/http_load.py in a
second child process (so broker and load generator each have their own CPU accounting and, on a
2-core machine, roughly one core each).

For SYNC_FLUSH and ASYNC_FLUSH, against a topic of 8 queues with 1 KiB text bodies:
single-message sends with 1 and 64 concurrent clients, batched sends of 32 messages per request with
1 and 64 clients, then pulls of 32 messages per request by 8 clients (one per queue) over everything
the sends stored. Latency is per request, measured by the client. "cpu us/msg" is the broker
process's CPU time per message.

Run: ``python -m bench.http_bench [--seconds 3] [--dir DIR]``; prints one table and writes
bench/results/http-<time>.json. Every process it starts is stopped by PID, its temp dir removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.disk import measure
from bench.report import Row, table, write_json

BODY_SIZE = 1024
TOPIC = "bench"
QUEUES = 8
BATCH = 32
TARGETS = {("send", 64, BATCH): ">= 30000 msgs/s"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(method: str, url: str, body: Any = None, timeout: float = 10) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (fields 14 and 15 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Broker:
    """``ferrymq standalone`` on free ports; stopped by PID (SIGTERM, then SIGKILL)."""

    def __init__(self, data_dir: Path, flush: str, config: dict[str, Any] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"{data_dir.name}.log"
        args = [sys.executable, "-m", "ferrymq", "standalone", "--data-dir", str(data_dir),
                "--http-port", str(self.port), "--tcp-port", str(free_port()), "--flush", flush]
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        if config:
            cfg = data_dir.parent / f"{data_dir.name}-config.json"
            cfg.write_text(json.dumps(config))
            args += ["--config", str(cfg)]
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if call("GET", f"{self.url}/v1/health", timeout=1)["status"] == "ok":
                    break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"broker did not become healthy: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)  # a clean shutdown flushes everything
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def load(broker: Broker, **args: Any) -> tuple[dict[str, Any], float]:
    """Run one load-generator process to completion; returns its result and the broker's CPU seconds."""
    spec = {"url": broker.url, "topic": TOPIC, "body_size": BODY_SIZE, **args}
    cpu0 = cpu_seconds(broker.proc.pid)
    proc = subprocess.Popen([sys.executable, "-m", "bench.http_load", json.dumps(spec)], stdout=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parent.parent)
    try:
        out, _ = proc.communicate(timeout=args["seconds"] + 120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    cpu = cpu_seconds(broker.proc.pid) - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode})")
    result = json.loads(out)
    if result["error_count"]:
        raise RuntimeError(f"{result['error_count']} failed requests, e.g. {result['errors'][:3]}")
    return result, cpu


def run_flush(base: Path, flush: str, seconds: float) -> list[Row]:
    data = Path(tempfile.mkdtemp(prefix=f"http-{flush}-", dir=base)) / "data"
    broker = Broker(data, flush.lower())
    rows: list[Row] = []
    try:
        call("PUT", f"{broker.url}/v1/topics/{TOPIC}", {"readQueueNums": QUEUES, "writeQueueNums": QUEUES})
        for batch in (1, BATCH):
            for clients in (1, 64):
                res, cpu = load(broker, mode="send", clients=clients, batch=batch, seconds=seconds)
                kind = "single" if batch == 1 else f"batch {batch}"
                rows.append(Row(f"http {flush:<5} send {kind:<8} {clients:>2} client(s)", res["msgs"], res["seconds"],
                                BODY_SIZE, res["latencies"], TARGETS.get(("send", clients, batch), ""),
                                note="latency per request", cpu_s=cpu))
        desc = call("GET", f"{broker.url}/v1/topics/{TOPIC}")
        ends = [q["maxOffset"] for q in sorted(desc["queues"], key=lambda q: q["queueId"])][:QUEUES]
        res, cpu = load(broker, mode="pull", clients=QUEUES, batch=BATCH, seconds=seconds, end_offsets=ends)
        rows.append(Row(f"http {flush:<5} pull x {BATCH} {QUEUES:>2} client(s)", res["msgs"], res["seconds"], BODY_SIZE,
                        res["latencies"], note="latency per request", cpu_s=cpu))
    finally:
        broker.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description="HTTP-level produce/consume benchmark against a real broker")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each load run")
    ap.add_argument("--dir", help="parent of the data directories (default: the system temp dir)")
    ap.add_argument("--only", help="run only this flush mode: SYNC or ASYNC")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ferrymq-bench-", dir=args.dir))
    try:
        disk = measure(base)
        rows: list[Row] = []
        for flush in ("ASYNC", "SYNC"):
            if args.only and args.only.upper() != flush:
                continue
            rows += run_flush(base, flush, args.seconds)
        print(table("FerryMQ HTTP benchmark (ferrymq standalone + aiohttp load generator, 1 KiB bodies, 8 queues)",
                    rows, disk))
        path = write_json("http", rows, disk, {"seconds": args.seconds, "body_size": BODY_SIZE, "queues": QUEUES,
                                               "batch": BATCH})
        print(f"written to {path}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
