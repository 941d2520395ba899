"""Redis Streams (Debian's redis-server) driven by redis-py's asyncio client with hiredis.

Server: AOF on (``appendonly yes``), RDB snapshots off, ``appendfsync always`` (the AOF is
fsync'd before replies go out: one fsync per event-loop turn, so a pipeline shares one) or
``appendfsync everysec`` (replies before the fsync; up to a second of acknowledged writes can be lost).
Produce: XADD in pipelines of 1 000 (redis-py's non-transactional pipeline, Redis' recommended way
to batch). Consume: XREADGROUP of 1 000 at a time, then one XACK naming all of them.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from bench.peers.procs import free_port, port_open, spawn, wait_until
from bench.peers.server import PeerServer, System
from bench.peers.workload import SEQ_DIGITS, Driver

PIPELINE = 1000
READ_COUNT = 1000
GROUP = "bench"
FIELD = b"d"


class RedisServer(PeerServer):
    name = "redis"

    def __init__(self, workdir: Path, appendfsync: str) -> None:
        super().__init__(workdir)
        if appendfsync not in ("always", "everysec"):
            raise ValueError(f"appendfsync {appendfsync!r}")
        self.appendfsync = appendfsync
        self.port = free_port()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "redis.conf"
        conf.write_text("\n".join([
            "bind 127.0.0.1", f"port {self.port}", f"dir {self.workdir}", "daemonize no", "protected-mode yes",
            'save ""', "appendonly yes", f"appendfsync {self.appendfsync}", "appendfilename bench.aof",
            "no-appendfsync-on-rewrite no", "auto-aof-rewrite-percentage 0",  # no rewrite mid-run
            "loglevel warning", "",
        ]))
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
        self.version = next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "?")
        self.proc = spawn(["redis-server", str(conf)], self.log_path)
        wait_until(lambda: port_open(self.port), self.proc, 30, "redis-server", self.log_path)

    def systems(self) -> list[System]:
        fsync = self.appendfsync == "always"
        return [System(
            key=f"redis-{self.appendfsync}", label=f"Redis {self.version} Streams, appendfsync {self.appendfsync}",
            durability=f"AOF {self.appendfsync}",
            fsync_before_ack=fsync, module="redis_peer",
            target={"driver": "redis", "port": self.port, "server_pids": self.server_pids()})]


class RedisDriver(Driver):
    produce_mode = f"XADD, pipelines of {PIPELINE}"
    consume_mode = f"XREADGROUP COUNT {READ_COUNT} + XACK per batch"

    def __init__(self, target: dict[str, Any]) -> None:
        super().__init__(target)
        import redis.asyncio as aredis

        self.r = aredis.Redis(host="127.0.0.1", port=int(target["port"]), decode_responses=False)

    async def connect(self) -> None:
        await self.r.ping()

    async def close(self) -> None:
        await self.r.aclose()

    async def prepare(self, name: str) -> None:
        await self.drop(name)

    async def drop(self, name: str) -> None:
        await self.r.delete(name)

    async def produce(self, name: str, bodies: list[bytes]) -> None:
        for i in range(0, len(bodies), PIPELINE):
            pipe = self.r.pipeline(transaction=False)
            for body in bodies[i:i + PIPELINE]:
                pipe.xadd(name, {FIELD: body})
            await pipe.execute()

    async def send_one(self, name: str, body: bytes) -> None:
        await self.r.xadd(name, {FIELD: body})

    async def consume(self, name: str, n: int, seen: list[bytes]) -> None:
        await self.r.xgroup_create(name, GROUP, id="0")
        while len(seen) < n:
            resp = await self.r.xreadgroup(GROUP, "c1", {name: ">"}, count=READ_COUNT, block=5000)
            if not resp:
                raise RuntimeError(f"XREADGROUP returned nothing after {len(seen)} of {n} messages")
            entries = resp[0][1]
            for _id, fields in entries:
                seen.append(fields[FIELD][:SEQ_DIGITS])
            await self.r.xack(name, GROUP, *(e[0] for e in entries))

    async def after_consume(self, name: str, n: int) -> None:
        pending = await self.r.xpending(name, GROUP)
        if pending["pending"]:
            raise RuntimeError(f"{pending['pending']} messages still unacknowledged")


DRIVERS = {"redis": RedisDriver}
