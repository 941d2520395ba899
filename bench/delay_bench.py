"""Delivery lateness of scheduled messages: 100 000 messages with delay level 1 (set to a few seconds
here, so the run takes about a minute) through a real ``ferrymq standalone`` child process, plus
20 000 ``deliverAtMs`` timer messages spread over a few seconds.

Lateness of a message = the store time of its delivered copy in the real topic minus its due time
(the store time of its held copy in SCHEDULE_TOPIC_XXXX plus the level's delay; for timer messages,
its deliverAtMs). Both copies are read back over HTTP afterwards and matched by key. Senders are 8
concurrent HTTP clients posting batches of 100.

Run: ``python -m bench.delay_bench [--messages 100000] [--delay 5s] [--dir DIR]``; prints one table and
writes bench/results/delay-<time>.json. The broker is stopped by PID and its temp dir removed.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import aiohttp

from bench.disk import measure
from bench.http_bench import Broker, call, cpu_seconds
from bench.report import Row, table, write_json
from ferrymq.common.durations import parse_duration_ms

TOPIC = "delaybench"
QUEUES = 8
BATCH = 100
SENDERS = 8
BODY = "d" * 128


async def send_all(url: str, batches: list[list[dict[str, Any]]]) -> float:
    queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)

    async def sender(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            batch = queue.get_nowait()
            async with session.post(f"{url}/v1/topics/{TOPIC}/messages", json={"messages": batch}) as r:
                if r.status != 200:
                    raise RuntimeError(f"send failed: {await r.text()}")

    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(sender(session) for _ in range(SENDERS)))
    return time.monotonic() - t0


def pull_queue(url: str, topic: str, qid: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    offset = 0
    t = urllib.parse.quote(topic, safe="")
    while True:
        body = call("GET", f"{url}/v1/topics/{t}/queues/{qid}/messages?offset={offset}&maxMessages=1024", timeout=60)
        out.extend(body["messages"])
        if body["nextOffset"] == offset:
            return out
        offset = body["nextOffset"]


def delivered_count(url: str) -> int:
    info = call("GET", f"{url}/v1/topics/{TOPIC}")
    return sum(q["maxOffset"] for q in info["queues"])


def run(base: Path, n: int, n_timer: int, delay: str) -> list[Row]:
    delay_ms = parse_duration_ms(delay)
    b = Broker(base / "data", "async", {"messageDelayLevel": f"{delay} 10m", "timerPrecisionMs": 100})
    try:
        call("PUT", f"{b.url}/v1/topics/{TOPIC}", {"readQueueNums": QUEUES, "writeQueueNums": QUEUES})
        cpu0 = cpu_seconds(b.proc.pid)
        msgs = [{"body": BODY, "keys": [f"d{i}"], "delayLevel": 1} for i in range(n)]
        send_s = asyncio.run(send_all(b.url, [msgs[i:i + BATCH] for i in range(0, n, BATCH)]))
        start = int(time.time() * 1000) + delay_ms
        timers = [{"body": BODY, "keys": [f"t{i}"], "deliverAtMs": start + i * 5000 // max(1, n_timer)}
                  for i in range(n_timer)]
        timer_send_s = asyncio.run(send_all(b.url, [timers[i:i + BATCH] for i in range(0, n_timer, BATCH)]))
        deadline = time.monotonic() + delay_ms / 1000 + 300
        while delivered_count(b.url) < n + n_timer:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {delivered_count(b.url)} of {n + n_timer} delivered")
            time.sleep(0.5)
        cpu = cpu_seconds(b.proc.pid) - cpu0
        held = {m["keys"][0]: m["storeTimestamp"] + delay_ms for m in pull_queue(b.url, "SCHEDULE_TOPIC_XXXX", 0)}
        due = {**held, **{t["keys"][0]: t["deliverAtMs"] for t in timers}}
        late_d: list[float] = []
        late_t: list[float] = []
        earliest = 0.0
        for q in range(QUEUES):
            for m in pull_queue(b.url, TOPIC, q):
                k = m["keys"][0]
                late = (m["storeTimestamp"] - due[k]) / 1000
                earliest = min(earliest, late)
                (late_d if k.startswith("d") else late_t).append(max(late, 0.0))
        # The due time is fixed when the send is routed, a moment before the held copy's store time:
        # deliveries may so look up to a few ms early against the held copy.
        note = f"sent in {send_s:.1f} s; earliest {-earliest * 1000:.0f} ms before the held copy's due time"
        return [Row(f"delay level 1 ({delay}) lateness", len(late_d), send_s, len(BODY), late_d, note=note,
                    cpu_s=cpu),
                Row("deliverAtMs (100 ms tick) lateness", len(late_t), timer_send_s, len(BODY), late_t,
                    note=f"sent in {timer_send_s:.1f} s, due over 5 s")]
    finally:
        b.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--timer-messages", type=int, default=20_000)
    p.add_argument("--delay", default="5s", help="duration of delay level 1")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ferrymq-delaybench-", dir=args.dir))
    try:
        disk = measure(base)
        rows = run(base, args.messages, args.timer_messages, args.delay)
        print(table("scheduled-message delivery lateness (msgs/s column = send rate; p50/p99 = lateness)",
                    rows, disk))
        print("written:", write_json("delay", rows, disk, {"messages": args.messages, "delay": args.delay,
                                                           "timerMessages": args.timer_messages}))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
