"""The HTTP load generator: one process, N concurrent aiohttp clients on a uvloop loop.

bench/http_bench.py runs it as a child process so that the broker's CPU accounting stays its own
(the machine has 2 cores: one for the broker, one for this). Arguments come as one JSON object on the
command line; the result is one JSON object on stdout: {"msgs", "seconds", "latencies", "errors"}.

Modes:
* ``send``: every client posts the same pre-encoded body (one message, or ``{"messages": [...]}`` of
  ``batch`` messages; 1 KiB UTF-8 bodies, queue chosen by the broker) back to back.
* ``pull``: client i reads queue i from offset 0 with maxMessages ``batch`` until it reaches
  ``end_offsets[i]`` or time runs out.
"""

from __future__ import annotations

import asyncio
import json
import random
import string
import sys
import time
from typing import Any

import aiohttp
import uvloop


def message_body(body_size: int) -> dict[str, Any]:
    return {"body": "".join(random.choices(string.ascii_letters, k=body_size)), "tags": "bench"}


async def send_client(session: aiohttp.ClientSession, url: str, payload: bytes, per_request: int,
                      deadline: float, lat: list[float], errors: list[str]) -> int:
    sent = 0
    headers = {"Content-Type": "application/json"}
    clock = time.perf_counter
    while clock() < deadline:
        t0 = clock()
        async with session.post(url, data=payload, headers=headers) as resp:
            body = await resp.read()
            if resp.status != 200:
                errors.append(f"{resp.status} {body[:200]!r}")
                continue
        lat.append(clock() - t0)
        sent += per_request
    return sent


async def pull_client(session: aiohttp.ClientSession, url: str, end: int, batch: int, deadline: float,
                      lat: list[float], errors: list[str]) -> int:
    got = 0
    offset = 0
    clock = time.perf_counter
    while offset < end and clock() < deadline:
        t0 = clock()
        async with session.get(url, params={"offset": str(offset), "maxMessages": str(batch)}) as resp:
            doc = await resp.json()
            if resp.status != 200:
                errors.append(f"{resp.status} {doc}")
                break
        lat.append(clock() - t0)
        got += len(doc["messages"])
        offset = doc["nextOffset"]
    return got


async def run(args: dict[str, Any]) -> dict[str, Any]:
    base, topic, clients, batch = args["url"], args["topic"], args["clients"], args["batch"]
    lat: list[float] = []
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        deadline = t0 + args["seconds"]
        if args["mode"] == "send":
            msg = message_body(args["body_size"])
            doc = {"messages": [msg] * batch} if batch > 1 else msg
            payload = json.dumps(doc).encode()
            url = f"{base}/v1/topics/{topic}/messages"
            tasks = [send_client(session, url, payload, batch, deadline, lat, errors) for _ in range(clients)]
        else:
            ends = args["end_offsets"]
            tasks = [pull_client(session, f"{base}/v1/topics/{topic}/queues/{q}/messages", ends[q], batch,
                                 deadline, lat, errors) for q in range(clients)]
        counts = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
    return {"msgs": sum(counts), "seconds": elapsed, "latencies": lat, "errors": errors[:20],
            "error_count": len(errors)}


def main() -> None:
    args = json.loads(sys.argv[1])
    result = uvloop.run(run(args))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
