"""The three workloads, the same for every peer, and the child process that runs them.

Each round of one peer runs in its own process (``python -m bench.peers.workload``): the orchestrator
and the other peers' clients share none of its CPU time or memory, so on 2 cores the driver gets one
core and the server the other. The process prints one ``RESULT {json}`` line.

Workloads (stream/topic/queue names are fresh per round):
- produce: ``messages`` bodies of ``body_size`` bytes, batched or pipelined as the peer's client
  recommends (each driver says how in ``produce_mode``); timed until the last one is acknowledged.
- latency: ``latency_sends`` sends, one at a time, each awaited before the next; p50/p99 of those.
- consume: every message of the produce stream back, acknowledged or offset-committed as the peer
  does it (``consume_mode``), timed until the last acknowledgement is with the server. Afterwards the
  driver checks that it got each message exactly once (the first 10 bytes of a body are its number).
"""

from __future__ import annotations

import abc
import argparse
import asyncio
import contextlib
import importlib
import json
import os
import random
import string
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.peers.procs import cpu_seconds

SEQ_DIGITS = 10
WORKLOADS = ("produce", "latency", "consume")


@dataclass
class Spec:
    messages: int = 200_000
    latency_sends: int = 2_000
    body_size: int = 1024
    name: str = "bench-r1"  # stream / topic / queue of this round
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))


def make_bodies(n: int, size: int, first: int = 0) -> list[bytes]:
    """Printable ASCII (valid UTF-8, so an HTTP client can send it as text), each starting with its
    zero-padded number so a consumer can prove it saw every message exactly once."""
    if size < SEQ_DIGITS:
        raise ValueError(f"body size must be at least {SEQ_DIGITS} bytes")
    rnd = random.Random(size)
    filler = "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(size - SEQ_DIGITS)).encode()
    return [b"%010d" % i + filler for i in range(first, first + n)]


def check_sequence(seen: list[bytes], n: int) -> None:
    """Every number 0..n-1 exactly once (order may differ across queues/partitions)."""
    if len(seen) != n:
        raise RuntimeError(f"consumed {len(seen)} messages, expected {n}")
    nums = sorted(int(s) for s in seen)
    if nums != list(range(n)):
        missing = len(set(range(n)) - set(nums))
        raise RuntimeError(f"consumed messages are not 0..{n - 1} exactly once ({missing} missing)")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[k]


class Driver(abc.ABC):
    """One peer's client side. ``target`` comes from the peer's server object (addresses, options)."""

    produce_mode: str = ""
    consume_mode: str = ""

    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target

    @abc.abstractmethod
    async def connect(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def prepare(self, name: str) -> None:
        """Create an empty stream/topic/queue ``name`` (deleting what a previous run left)."""

    @abc.abstractmethod
    async def drop(self, name: str) -> None:
        """Delete ``name`` if it exists (after a round, so rounds do not pile data up)."""

    @abc.abstractmethod
    async def produce(self, name: str, bodies: list[bytes]) -> None:
        """Send all, return once every one is acknowledged by the server."""

    @abc.abstractmethod
    async def send_one(self, name: str, body: bytes) -> None:
        """One send, awaited until acknowledged."""

    @abc.abstractmethod
    async def consume(self, name: str, n: int, seen: list[bytes]) -> None:
        """Receive ``n`` messages (append each body's first SEQ_DIGITS bytes to ``seen``) and return
        once their acknowledgements / offset commits have reached the server."""

    @abc.abstractmethod
    async def after_consume(self, name: str, n: int) -> None:
        """Untimed check that the server holds the acknowledgements / committed offsets."""


class Meter:
    """Wall time plus CPU seconds of this process and of the server's processes."""

    def __init__(self, server_pids: list[int]) -> None:
        self.server_pids = server_pids

    def __enter__(self) -> Meter:
        self.t0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self.srv0 = cpu_seconds(self.server_pids)
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.client_cpu = time.process_time() - self.cpu0
        self.server_cpu = cpu_seconds(self.server_pids) - self.srv0

    def figures(self, msgs: int) -> dict[str, float]:
        return {"msgs": msgs, "seconds": round(self.seconds, 4), "msgs_per_s": round(msgs / self.seconds, 1),
                "client_cpu_us_per_msg": round(self.client_cpu / msgs * 1e6, 2),
                "server_cpu_us_per_msg": round(self.server_cpu / msgs * 1e6, 2)}


async def run_round(driver: Driver, spec: Spec) -> dict[str, Any]:
    server_pids = [int(p) for p in driver.target.get("server_pids", [])]
    out: dict[str, Any] = {"produce_mode": driver.produce_mode, "consume_mode": driver.consume_mode}
    await driver.connect()
    try:
        main, lat = spec.name, f"{spec.name}-lat"
        await driver.prepare(main)
        bodies = make_bodies(spec.messages, spec.body_size)
        if "produce" in spec.workloads or "consume" in spec.workloads:
            with Meter(server_pids) as m:
                await driver.produce(main, bodies)
            if "produce" in spec.workloads:
                out["produce"] = m.figures(spec.messages)
        del bodies
        if "latency" in spec.workloads:
            await driver.prepare(lat)
            one = make_bodies(1, spec.body_size)[0]
            for _ in range(min(50, spec.latency_sends)):  # warm the connection and the server's paths
                await driver.send_one(lat, one)
            samples = []
            with Meter(server_pids) as m:
                for _ in range(spec.latency_sends):
                    t = time.perf_counter()
                    await driver.send_one(lat, one)
                    samples.append(time.perf_counter() - t)
            samples.sort()
            out["latency"] = {**m.figures(spec.latency_sends),
                              "p50_ms": round(percentile(samples, 0.50) * 1000, 4),
                              "p99_ms": round(percentile(samples, 0.99) * 1000, 4),
                              "mean_ms": round(sum(samples) / len(samples) * 1000, 4)}
        if "consume" in spec.workloads:
            seen: list[bytes] = []
            with Meter(server_pids) as m:
                await driver.consume(main, spec.messages, seen)
            check_sequence(seen, spec.messages)
            await driver.after_consume(main, spec.messages)
            out["consume"] = m.figures(spec.messages)
        await driver.drop(main)
        if "latency" in spec.workloads:
            await driver.drop(lat)
    finally:
        await driver.close()
    return out


def load_driver(module: str, target: dict[str, Any]) -> Driver:
    mod = importlib.import_module(f"bench.peers.{module}")
    cls: type[Driver] = mod.DRIVERS[target["driver"]]
    return cls(target)


def main() -> None:
    ap = argparse.ArgumentParser(description="run one peer's workloads for one round (a child of bench.peers)")
    ap.add_argument("--module", required=True, help="bench.peers module holding the driver, e.g. redis_peer")
    ap.add_argument("--target", required=True, help="JSON: the server's address and options")
    ap.add_argument("--spec", required=True, help="JSON: the Spec of this round")
    args = ap.parse_args()
    target = json.loads(args.target)
    spec = Spec(**json.loads(args.spec))
    driver = load_driver(args.module, target)
    with contextlib.suppress(ImportError):
        import uvloop  # every driver gets the same event loop implementation

        uvloop.install()
    result = asyncio.run(run_round(driver, spec))
    result["spec"] = asdict(spec)
    result["pid"] = os.getpid()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
