"""Controller-mode benchmark: failover time over repeated master kills, and SYNC-replicated produce
throughput as a ratio of a single broker's SYNC_FLUSH figure, measured in the same run.

    python -m bench.ha_bench [--kills 10] [--heartbeat-timeout-ms 2000] [--seconds 8]

Failover time = from the master's kill -9 to the first acknowledged send on the new master (a client
that re-resolves the master through the controller after each error). The controller detects a dead
master after controllerBrokerHeartbeatTimeout (RocketMQ's default is 10 s; the default here, 2 s, is what
the tests use), so the figure is that timeout plus election and client re-routing.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import BrokerProcess, kill_all, wait_until  # noqa: E402
from test_failover import TOPIC, Cluster, Sender  # noqa: E402

from bench.report import RESULTS_DIR  # noqa: E402

BODY = base64.b64encode(b"x" * 1024).decode()


async def _load(url: str, seconds: float, clients: int, batch: int) -> tuple[int, float, list[float]]:
    payload = json.dumps({"messages": [{"bodyBase64": BODY} for _ in range(batch)]})
    lat: list[float] = []
    sent = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        async def client() -> None:
            nonlocal sent
            while time.perf_counter() < deadline:
                s = time.perf_counter()
                async with session.post(f"{url}/v1/topics/{TOPIC}/messages", data=payload,
                                        headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"send failed: {resp.status}")
                lat.append(time.perf_counter() - s)
                sent += batch

        await asyncio.gather(*(client() for _ in range(clients)))
    return sent, time.perf_counter() - t0, lat


def throughput(url: str, seconds: float, clients: int = 16, batch: int = 32) -> dict[str, float]:
    sent, dt, lat = asyncio.run(_load(url, seconds, clients, batch))
    lat.sort()
    return {"msgs_per_s": sent / dt, "p50_ms": lat[len(lat) // 2] * 1000, "p99_ms": lat[int(len(lat) * 0.99)] * 1000}


def bench_throughput(root: Path, seconds: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    single = BrokerProcess(root / "single").start()
    single.call("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": 4, "writeQueueNums": 4})
    out["single broker, SYNC_FLUSH"] = throughput(single.url, seconds)
    single.terminate()
    for mode in ("sync", "async"):
        cluster = Cluster(root / f"group-{mode}", replication=mode)
        master = cluster.wait_master()
        master.call("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": 4, "writeQueueNums": 4})
        cluster.wait_in_sync(3)
        out[f"3 replicas, SYNC_FLUSH, {mode.upper()} replication"] = throughput(master.url, seconds)
        for r in cluster.replicas:
            r.stop()
        cluster.controller.stop()
    return out


def bench_failover(root: Path, kills: int) -> list[float]:
    cluster = Cluster(root / "failover")
    master = cluster.wait_master()
    master.call("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": 4, "writeQueueNums": 4})
    cluster.wait_in_sync(3)
    sender = Sender(cluster, 0)
    sender.start()
    times = []
    try:
        for _ in range(kills):
            time.sleep(1.0)
            victim = cluster.wait_master()
            killed_at = time.monotonic()
            victim.kill9()
            first = wait_until(lambda v=victim, k=killed_at: next((a[4] for a in list(sender.acked)
                                                                 if a[4] > k and a[3] != v.name), None),
                               60, 0.01, "a send acknowledged by the new master")
            times.append(first - killed_at)
            victim.start()
            cluster.wait_in_sync(3)
    finally:
        sender.stop_flag.set()
        sender.join(20)
        for r in cluster.replicas:
            if r.alive():
                r.stop()
        cluster.controller.stop()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrymq-ha-bench-") as d:
        try:
            tp = bench_throughput(Path(d), args.seconds)
            fo = bench_failover(Path(d), args.kills)
        finally:
            kill_all()
    base = tp["single broker, SYNC_FLUSH"]["msgs_per_s"]
    print("\nHTTP produce, 1 KiB messages, 16 clients x 32-message batches")
    print(f"{'setup':48} {'msgs/s':>10} {'ratio':>7} {'p50 ms':>8} {'p99 ms':>8}")
    for name, r in tp.items():
        print(f"{name:48} {r['msgs_per_s']:10.0f} {r['msgs_per_s'] / base:7.2f} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f}")
    print(f"\nfailover over {len(fo)} kills (controller heartbeat timeout 2 s): median "
          f"{statistics.median(fo):.2f} s, max {max(fo):.2f} s; each: {', '.join(f'{t:.2f}' for t in fo)}")
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "ha_bench.json").write_text(json.dumps({"throughput": tp, "failover_s": fo}, indent=1))


if __name__ == "__main__":
    main()
