"""NATS JetStream (Debian's nats-server) driven by nats-py.

Server: JetStream with file storage, one replica. With ``sync_interval: always`` (nats-server 2.10+)
every write is fsync'd before the ack; older servers (Debian 12 ships 2.9) have no such setting and
acknowledge before the fsync (the file store is fsync'd in the background, every couple of minutes),
so the benchmark detects the setting with ``nats-server -t`` and labels the result accordingly.
Produce: ``js.publish_async`` (nats-py's pipelined publish, up to 4 000 unacknowledged), then
``publish_async_completed``. Consume: a durable pull consumer, ``fetch`` of 1 000, an explicit ack
per message (AckExplicit, JetStream's default), then a flush so every ack has reached the server.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

from bench.peers.procs import free_port, port_open, spawn, wait_until
from bench.peers.server import PeerServer, System
from bench.peers.workload import SEQ_DIGITS, Driver

FETCH = 1000
MAX_PENDING = 4000
CONSUMER = "bench"


def config_text(port: int, store_dir: Path, sync_always: bool) -> str:
    sync = "  sync_interval: always\n" if sync_always else ""
    return (f"listen: 127.0.0.1:{port}\nmax_payload: 1MB\n"
            f"jetstream {{\n  store_dir: \"{store_dir}\"\n  max_memory_store: 256MB\n{sync}}}\n")


def accepts_sync_always(workdir: Path) -> bool:
    """Whether this nats-server knows ``sync_interval`` (2.10+): test a config with it."""
    workdir.mkdir(parents=True, exist_ok=True)
    probe = workdir / "probe.conf"
    probe.write_text(config_text(free_port(), workdir / "probe-store", True))
    try:
        return subprocess.run(["nats-server", "-c", str(probe), "-t"], capture_output=True,
                              check=False, timeout=30).returncode == 0
    finally:
        probe.unlink(missing_ok=True)


class NatsServer(PeerServer):
    name = "nats"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port = free_port()
        self.sync_always = False

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"v?(\d+\.\d+\.\d+)", out)
        self.version = m.group(1) if m else "?"
        self.sync_always = accepts_sync_always(self.workdir)
        conf = self.workdir / "nats.conf"
        conf.write_text(config_text(self.port, self.workdir / "store", self.sync_always))
        self.proc = spawn(["nats-server", "-c", str(conf)], self.log_path)
        wait_until(lambda: port_open(self.port), self.proc, 30, "nats-server", self.log_path)

    def systems(self) -> list[System]:
        durability = "file, sync always" if self.sync_always else "file, acks before fsync"
        return [System(key="nats-file", label=f"NATS {self.version} JetStream, file storage",
                       durability=durability, fsync_before_ack=self.sync_always, module="nats_peer",
                       target={"driver": "nats", "port": self.port, "server_pids": self.server_pids()})]


class NatsDriver(Driver):
    produce_mode = f"js.publish_async, up to {MAX_PENDING} unacknowledged"
    consume_mode = f"durable pull consumer, fetch {FETCH}, ack per message"

    def __init__(self, target: dict[str, Any]) -> None:
        super().__init__(target)
        self.nc: Any = None
        self.js: Any = None

    async def connect(self) -> None:
        import nats

        self.nc = await nats.connect(f"nats://127.0.0.1:{self.target['port']}", max_reconnect_attempts=0)
        self.js = self.nc.jetstream(publish_async_max_pending=MAX_PENDING, timeout=30)

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def drop(self, name: str) -> None:
        from nats.js.errors import NotFoundError

        try:
            await self.js.delete_stream(name)
        except NotFoundError:
            pass

    async def prepare(self, name: str) -> None:
        from nats.js.api import StorageType, StreamConfig

        await self.drop(name)
        await self.js.add_stream(StreamConfig(name=name, subjects=[name], storage=StorageType.FILE, num_replicas=1))

    async def produce(self, name: str, bodies: list[bytes]) -> None:
        futures = [await self.js.publish_async(name, body) for body in bodies]
        await self.js.publish_async_completed()
        acks = await asyncio.gather(*futures)
        if len(acks) != len(bodies) or any(a.stream != name for a in acks):
            raise RuntimeError("not every publish was acknowledged by the stream")

    async def send_one(self, name: str, body: bytes) -> None:
        await self.js.publish(name, body)

    async def consume(self, name: str, n: int, seen: list[bytes]) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        cfg = ConsumerConfig(durable_name=CONSUMER, ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                             max_ack_pending=-1, ack_wait=120)
        sub = await self.js.pull_subscribe(name, durable=CONSUMER, config=cfg)
        while len(seen) < n:
            msgs = await sub.fetch(min(FETCH, n - len(seen)), timeout=10)
            for msg in msgs:
                seen.append(msg.data[:SEQ_DIGITS])
                await msg.ack()
        await self.nc.flush()

    async def after_consume(self, name: str, n: int) -> None:
        for _ in range(100):
            info = await self.js.consumer_info(name, CONSUMER)
            if info.num_ack_pending == 0 and info.ack_floor.stream_seq >= n:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"acks not all recorded: {info.num_ack_pending} pending")


DRIVERS = {"nats": NatsDriver}
