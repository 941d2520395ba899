"""Store-level benchmark: MessageStore driven directly in one process on a uvloop event loop.

Produce: 1 and 64 concurrent producers, each putting batches of 1 or 32 messages of 1 KiB (8 queues,
producer i writes queue i % 8), under SYNC_FLUSH and ASYNC_FLUSH; a put's latency runs from the call
to ``put`` until it returns (under SYNC_FLUSH: until the fdatasync that covers it). Every producer
builds new Message objects for every put, as a protocol handler would.
Consume: everything one produce run wrote is read back through ``get_messages`` (32 per call), queue
by queue, on one thread, from the page cache.

Run: ``python -m bench.store_bench [--seconds 3] [--dir DIR]``; prints one table and writes
bench/results/store-<time>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import uvloop

from bench.disk import measure
from bench.report import Row, table, write_json
from ferrymq.broker.store.message_store import FOUND, MessageStore
from ferrymq.common.config import FlushDiskType, StoreConfig
from ferrymq.common.message import PROPERTY_TAGS, Message

BODY_SIZE = 1024
TOPIC = "bench"
QUEUES = 8
PULL_BATCH = 32
TARGETS = {
    # the store targets, for producers putting batches of 32 (see bench/README.md)
    ("ASYNC", 1, 32): ">= 60 % of raw",
    ("ASYNC", 64, 32): ">= 60 % of raw",
    ("SYNC", 64, 32): ">= 35 % of raw",
}


def new_store(root: Path, flush: str) -> MessageStore:
    cfg = StoreConfig(store_path_root_dir=str(root),
                      flush_disk_type=FlushDiskType.SYNC_FLUSH if flush == "SYNC" else FlushDiskType.ASYNC_FLUSH)
    store = MessageStore(cfg)
    store.load()
    return store


async def producer(store: MessageStore, queue_id: int, batch: int, deadline: float, lat: list[float]) -> int:
    body = os.urandom(BODY_SIZE)
    props = {PROPERTY_TAGS: "bench"}
    sent = 0
    clock = time.perf_counter
    while clock() < deadline:
        msgs = [Message(TOPIC, body, queue_id=queue_id, properties=dict(props)) for _ in range(batch)]
        t0 = clock()
        await store.put(msgs)
        lat.append(clock() - t0)
        sent += batch
        if not store.sync_flush:
            # An ASYNC_FLUSH put never suspends; yield so that producers (and flush callbacks) take
            # turns, as request handlers would.
            await asyncio.sleep(0)
    return sent


async def produce(store: MessageStore, producers: int, batch: int,
                  seconds: float) -> tuple[int, float, list[float], float]:
    store.start(asyncio.get_running_loop())
    lat: list[float] = []
    c0, t0 = time.process_time(), time.perf_counter()
    counts = await asyncio.gather(*(producer(store, i % QUEUES, batch, t0 + seconds, lat) for i in range(producers)))
    return sum(counts), time.perf_counter() - t0, lat, time.process_time() - c0


def consume(store: MessageStore) -> tuple[int, float, list[float], float]:
    lat: list[float] = []
    got = 0
    c0, t0 = time.process_time(), time.perf_counter()
    for qid in range(QUEUES):
        offset = store.min_offset(TOPIC, qid)
        end = store.max_offset(TOPIC, qid)
        while offset < end:
            r0 = time.perf_counter()
            res = store.get_messages(TOPIC, qid, offset, PULL_BATCH)
            lat.append(time.perf_counter() - r0)
            if res.status != FOUND:
                raise RuntimeError(f"get_messages {TOPIC}/{qid}@{offset}: {res.status}")
            got += len(res.records)
            offset = res.next_offset
    return got, time.perf_counter() - t0, lat, time.process_time() - c0


def run_case(base: Path, flush: str, producers: int, batch: int, seconds: float, read_back: bool) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix=f"store-{flush}-{producers}-{batch}-", dir=base))
    store = new_store(root, flush)
    rows = []
    try:
        msgs, elapsed, lat, cpu = uvloop.run(produce(store, producers, batch, seconds))
        name = f"store {flush:<5} produce {producers:>2} producer(s) x batch {batch:<2}"
        rows.append(Row(name, msgs, elapsed, BODY_SIZE, lat, TARGETS.get((flush, producers, batch), ""),
                        note="latency per put", cpu_s=cpu))
        store.shutdown()  # makes everything visible, so the read-back sees all of it
        if read_back:
            store = new_store(root, flush)
            got, elapsed, lat, cpu = consume(store)
            if got != msgs:
                raise RuntimeError(f"read back {got} messages of {msgs}")
            rows.append(Row(f"store {flush:<5} consume get_messages x {PULL_BATCH}", got, elapsed, BODY_SIZE, lat,
                            note="latency per call", cpu_s=cpu))
    finally:
        store.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description="store-level produce/consume benchmark")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each produce run")
    ap.add_argument("--dir", help="parent of the data directories (default: the system temp dir)")
    ap.add_argument("--only", help="run only scenarios whose name contains this, e.g. 'SYNC'")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ferrymq-bench-", dir=args.dir))
    try:
        disk = measure(base)
        rows: list[Row] = []
        for flush in ("ASYNC", "SYNC"):
            if args.only and args.only not in flush:
                continue
            for producers in (1, 64):
                for batch in (1, 32):
                    rows += run_case(base, flush, producers, batch, args.seconds,
                                     read_back=(producers, batch) == (64, 32))
        print(table("FerryMQ store benchmark (MessageStore in-process, uvloop, 1 KiB bodies, 8 queues)", rows, disk))
        path = write_json("store", rows, disk, {"seconds": args.seconds, "body_size": BODY_SIZE,
                                                "queues": QUEUES, "pull_batch": PULL_BATCH})
        print(f"written to {path}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
