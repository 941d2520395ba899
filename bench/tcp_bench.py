"""TCP benchmark through the Python client (ferrymq.client), beside the HTTP figures.

A real ``ferrymq standalone`` child process (SYNC_FLUSH unless told otherwise), loaded by a second child
process (this module with ``--load``) so broker and client each get about one of the 2 cores. 1 KiB
bodies, a topic of 8 queues:

* produce, single messages: 1 client (the light-load latency of one SYNC_FLUSH send) and 64 clients;
* produce, batches of 32 messages per frame: 1 and 64 clients;
* consume: a push consumer (8 queues, long polling, raw commit-log records decoded by the client)
  over everything the sends stored;
* the same batched produce and the pulls over HTTP (bench/http_load.py), for the ratio.

Every figure is also given as a ratio of the data directory's raw fdatasync'd sequential-write
bandwidth (bench/disk.py). Run: ``python -m bench.tcp_bench [--seconds 3] [--flush sync|async|both]
[--dir DIR]``; prints a table and writes bench/results/tcp-<time>.json. Processes are stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.disk import measure
from bench.http_bench import Broker, call, cpu_seconds
from bench.http_bench import load as http_load
from bench.report import Row, table, write_json

BODY_SIZE = 1024
TOPIC = "bench"
QUEUES = 8
BATCH = 32
TARGETS = {("send", 1, 1): "", ("send", 64, BATCH): ">= 25 % of raw"}


# ---- the load generator (child process) ------------------------------------------------------------------
async def _send_load(spec: dict[str, Any]) -> dict[str, Any]:
    from ferrymq.client import AsyncProducer, Message

    body = "".join(random.choices(string.ascii_letters, k=spec["body_size"])).encode()
    batch, clients, seconds = spec["batch"], spec["clients"], spec["seconds"]
    latencies: list[float] = []
    errors: list[str] = []
    sent = 0
    async with AsyncProducer(spec["url"], group="bench") as producer:
        msgs = [Message(topic=spec["topic"], body=body, tags="bench") for _ in range(batch)]
        await producer.send(msgs[0])  # routes and connection before the clock starts
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal sent
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    if batch == 1:
                        await producer.send(msgs[0])
                    else:
                        await producer.send_batch(msgs)
                except Exception as exc:
                    errors.append(repr(exc))
                    continue
                latencies.append(time.perf_counter() - t0)
                sent += batch

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - t0
    return {"msgs": sent, "seconds": elapsed, "latencies": latencies, "error_count": len(errors),
            "errors": errors[:5]}


async def _consume_load(spec: dict[str, Any]) -> dict[str, Any]:
    from ferrymq.client import AsyncPushConsumer, ConsumeResult, ReceivedMessage

    total, got = spec["total"], 0
    done = asyncio.Event()
    latencies: list[float] = []

    async def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
        nonlocal got
        got += len(msgs)
        if got >= total:
            done.set()
        return ConsumeResult.SUCCESS

    t0 = time.perf_counter()
    consumer = AsyncPushConsumer(spec["url"], f"bench-{os.getpid()}", spec["topic"], listener, consume_from="earliest",
                                 consume_batch_max_size=BATCH, pull_batch_size=256, pull_threshold_for_queue=4096)
    await consumer.start()
    try:
        await asyncio.wait_for(done.wait(), spec["seconds"] + 60)
    except TimeoutError:
        pass
    elapsed = time.perf_counter() - t0
    await consumer.shutdown()
    return {"msgs": got, "seconds": elapsed, "latencies": latencies, "error_count": 0 if got >= total else 1,
            "errors": [] if got >= total else [f"consumed {got} of {total}"]}


def _load_main(spec: dict[str, Any]) -> None:
    import uvloop

    fn = _send_load if spec["mode"] == "send" else _consume_load
    # a file, not stdout: the event loop may leave stdout non-blocking, and a large result then tears
    Path(spec["result_path"]).write_text(json.dumps(uvloop.run(fn(spec))))


def tcp_load(broker: Broker, **args: Any) -> tuple[dict[str, Any], float]:
    result_path = broker.data_dir.parent / "load-result.json"
    result_path.unlink(missing_ok=True)
    spec = {"url": broker.url, "topic": TOPIC, "body_size": BODY_SIZE, "result_path": str(result_path), **args}
    cpu0 = cpu_seconds(broker.proc.pid)
    proc = subprocess.Popen([sys.executable, "-m", "bench.tcp_bench", "--load", json.dumps(spec)],
                            cwd=Path(__file__).resolve().parent.parent)
    try:
        proc.wait(timeout=args["seconds"] + 180)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    cpu = cpu_seconds(broker.proc.pid) - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"TCP load generator failed ({proc.returncode})")
    result = json.loads(result_path.read_text())
    if result["error_count"]:
        raise RuntimeError(f"{result['error_count']} failures, e.g. {result['errors'][:3]}")
    return result, cpu


# ---- the driver -------------------------------------------------------------------------------------------
def run_flush(base: Path, flush: str, seconds: float) -> list[Row]:
    data = Path(tempfile.mkdtemp(prefix=f"tcp-{flush}-", dir=base)) / "data"
    broker = Broker(data, flush.lower())
    rows: list[Row] = []
    try:
        call("PUT", f"{broker.url}/v1/topics/{TOPIC}", {"readQueueNums": QUEUES, "writeQueueNums": QUEUES})
        for batch in (1, BATCH):
            for clients in (1, 64):
                res, cpu = tcp_load(broker, mode="send", clients=clients, batch=batch, seconds=seconds)
                kind = "single" if batch == 1 else f"batch {batch}"
                target = TARGETS.get(("send", clients, batch), "")
                rows.append(Row(f"tcp  {flush:<5} send {kind:<8} {clients:>2} client(s)", res["msgs"], res["seconds"],
                                BODY_SIZE, res["latencies"], target, note="latency per send call", cpu_s=cpu))
        res, cpu = http_load(broker, mode="send", clients=64, batch=BATCH, seconds=seconds)
        rows.append(Row(f"http {flush:<5} send batch {BATCH} 64 client(s)", res["msgs"], res["seconds"], BODY_SIZE,
                        res["latencies"], note="latency per request", cpu_s=cpu))
        desc = call("GET", f"{broker.url}/v1/topics/{TOPIC}")
        ends = [q["maxOffset"] for q in sorted(desc["queues"], key=lambda q: q["queueId"])][:QUEUES]
        total = sum(ends)
        res, cpu = tcp_load(broker, mode="consume", total=total, seconds=seconds)
        rows.append(Row(f"tcp  {flush:<5} push consumer, {QUEUES} queues", res["msgs"], res["seconds"], BODY_SIZE,
                        [], note=f"all {total} stored msgs, start-up included", cpu_s=cpu))
        res, cpu = http_load(broker, mode="pull", clients=QUEUES, batch=BATCH, seconds=seconds, end_offsets=ends)
        rows.append(Row(f"http {flush:<5} pull x {BATCH} {QUEUES:>2} client(s)", res["msgs"], res["seconds"], BODY_SIZE,
                        res["latencies"], note="latency per request", cpu_s=cpu))
    finally:
        broker.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--flush", choices=["sync", "async", "both"], default="sync")
    ap.add_argument("--dir", help="where the broker's data goes (default: a temporary directory)")
    ap.add_argument("--load", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load:
        _load_main(json.loads(args.load))
        return
    base = Path(tempfile.mkdtemp(prefix="ferrymq-tcp-bench-", dir=args.dir))
    try:
        disk = measure(base)
        rows: list[Row] = []
        for flush in (["SYNC", "ASYNC"] if args.flush == "both" else [args.flush.upper()]):
            rows += run_flush(base, flush, args.seconds)
        print(table("TCP (ferrymq.client) beside HTTP, 1 KiB bodies", rows, disk))
        for flush in {r.name.split()[1] for r in rows}:
            tcp = next((r for r in rows if r.name.startswith(f"tcp  {flush:<5} send batch") and "64" in r.name), None)
            http = next((r for r in rows if r.name.startswith(f"http {flush:<5} send batch")), None)
            single = next((r for r in rows if r.name.startswith(f"tcp  {flush:<5} send single") and " 1 " in r.name),
                          None)
            if tcp and http:
                print(f"{flush}: TCP batched / HTTP batched = {tcp.msgs_per_s / http.msgs_per_s:.2f}x (target >= 2x); "
                      f"TCP batched = {tcp.ratio(disk) * 100:.1f} % of raw disk (target >= 25 %, goal 50 %)")
            if single:
                print(f"{flush}: single send, 1 client: p50 {single.latency_ms(0.5):.2f} ms, "
                      f"p99 {single.latency_ms(0.99):.2f} ms (target p99 <= 5 ms)")
        path = write_json("tcp", rows, disk, {"seconds": args.seconds, "flush": args.flush})
        print(f"wrote {path}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
