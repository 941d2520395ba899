"""Transactional send throughput over HTTP: prepare (POST /v1/topics/T/transactions) then commit
(POST /v1/transactions/ID/commit), against a real ``ferrymq standalone`` child process.

For SYNC_FLUSH and ASYNC_FLUSH, with 1 and 32 concurrent producers, each looping prepare + commit of a
1 KiB message for ``--seconds``. A transaction's latency runs from the prepare request until the
commit's answer. At the end the committed messages are counted in the topic (each exactly once).

Run: ``python -m bench.tx_bench [--seconds 5] [--dir DIR]``; prints one table and writes
bench/results/tx-<time>.json. The broker is stopped by PID and its temp dir removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.disk import measure
from bench.http_bench import call, cpu_seconds, free_port
from bench.report import Row, table, write_json

BODY = "x" * 1024
TOPIC = "txbench"
QUEUES = 8


class ConfiguredBroker:
    """``ferrymq standalone`` with a --config file, on free ports; stopped by PID."""

    def __init__(self, data_dir: Path, flush: str, config: dict[str, Any]) -> None:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        cfg = data_dir.parent / f"{data_dir.name}-config.json"
        cfg.write_text(json.dumps(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"{data_dir.name}.log"
        args = [sys.executable, "-m", "ferrymq", "standalone", "--data-dir", str(data_dir), "--http-port",
                str(self.port), "--tcp-port", str(free_port()), "--flush", flush, "--config", str(cfg)]
        with open(self.log, "wb") as logf:
            self.proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.log.read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                if call("GET", f"{self.url}/v1/health", timeout=1)["status"] == "ok":
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"broker did not become healthy: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


async def producer(session: aiohttp.ClientSession, url: str, deadline: float, latencies: list[float]) -> int:
    done = 0
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        async with session.post(f"{url}/v1/topics/{TOPIC}/transactions",
                                json={"body": BODY, "producerGroup": "bench-pg"}) as r:
            half = await r.json()
            if r.status != 200:
                raise RuntimeError(f"prepare failed: {half}")
        async with session.post(f"{url}/v1/transactions/{half['transactionId']}/commit",
                                json={"producerGroup": "bench-pg"}) as r:
            if r.status != 200:
                raise RuntimeError(f"commit failed: {await r.text()}")
        latencies.append(time.perf_counter() - t0)
        done += 1
    return done


async def drive(url: str, clients: int, seconds: float) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    conn = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.monotonic()
        counts = await asyncio.gather(*(producer(session, url, t0 + seconds, latencies) for _ in range(clients)))
        return sum(counts), time.monotonic() - t0, latencies


def visible(url: str) -> int:
    info = call("GET", f"{url}/v1/topics/{TOPIC}")
    return sum(q["maxOffset"] - q["minOffset"] for q in info["queues"])


def run_flush(base: Path, flush: str, seconds: float) -> list[Row]:
    rows = []
    for clients in (1, 32):
        b = ConfiguredBroker(base / f"{flush}-{clients}", flush, {})
        try:
            call("PUT", f"{b.url}/v1/topics/{TOPIC}", {"readQueueNums": QUEUES, "writeQueueNums": QUEUES})
            cpu0 = cpu_seconds(b.proc.pid)
            n, took, lat = asyncio.run(drive(b.url, clients, seconds))
            cpu = cpu_seconds(b.proc.pid) - cpu0
            seen = visible(b.url)
            note = "committed messages visible: " + ("all, once each" if seen == n else f"{seen} of {n}")
            rows.append(Row(f"tx prepare+commit {flush.upper()} x{clients}", n, took, len(BODY), lat, note=note,
                            cpu_s=cpu))
        finally:
            b.stop()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--dir", default=None, help="where the brokers' data goes (default: a temp dir)")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ferrymq-txbench-", dir=args.dir))
    try:
        disk = measure(base)
        rows = run_flush(base, "sync", args.seconds) + run_flush(base, "async", args.seconds)
        print(table("transactional sends (HTTP, prepare + commit, 1 KiB)", rows, disk))
        print("written:", write_json("tx", rows, disk, {"seconds": args.seconds, "bodySize": len(BODY)}))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
