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
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp

from bench.disk import measure
from bench.http_bench import Broker, call, cpu_seconds
from bench.report import Row, table, write_json

BODY = "x" * 1024
TOPIC = "txbench"
QUEUES = 8


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
        b = Broker(base / f"{flush}-{clients}" / "data", flush)
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
