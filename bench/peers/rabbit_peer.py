"""RabbitMQ (Debian's rabbitmq-server) with a quorum queue, driven by aio-pika.

Server: one node of our own, never the system service: its own node name, AMQP and distribution
ports, Mnesia/log directories, config and Erlang cookie (HOME) in a temporary directory, and its own
epmd on a free port (started first, as our child, so the node does not spawn a daemonised one that
would outlive it). Readiness: the AMQP port answers and ``rabbitmqctl await_startup`` returns.
Durability: a quorum queue (Raft log fsync'd before the leader confirms) with publisher confirms
and persistent messages.
Produce: ``default_exchange.publish`` on a channel in confirm mode, up to 1 000 unconfirmed in flight
(aio-pika's recommended way to pipeline; each publish awaits its own confirm). Consume: basic.consume
with prefetch 1 000, acknowledging with ``multiple=True`` every 250 deliveries.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
from collections import deque
from pathlib import Path
from typing import Any

from bench.peers.procs import free_port, port_open, spawn, stop_tree, wait_until
from bench.peers.server import PeerServer, System
from bench.peers.workload import SEQ_DIGITS, Driver

WINDOW = 1000
PREFETCH = 1000
ACK_EVERY = 250
RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")  # the scripts themselves: /usr/sbin's wrappers switch user


def rabbit_tool(name: str) -> str:
    path = RABBIT_BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def find_epmd() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    candidates = sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd"))
    if not candidates:
        raise RuntimeError("epmd not found (is erlang-base installed?)")
    return str(candidates[-1])


class RabbitServer(PeerServer):
    name = "rabbitmq"

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir)
        self.port, self.dist_port, self.epmd_port = free_port(), free_port(), free_port()
        self.node = f"ferrybench{self.port}@localhost"
        self.epmd: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        d = self.workdir
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TERM")}
        return {
            **keep, "HOME": str(d), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
            "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODENAME": self.node, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"), "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"), "RABBITMQ_PID_FILE": str(d / "rabbit.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def start(self) -> None:
        d = self.workdir
        (d / "log").mkdir(parents=True, exist_ok=True)
        (d / "rabbitmq-env.conf").write_text("# bench/peers: everything comes from the environment\n")
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text("\n".join([
            f"listeners.tcp.default = 127.0.0.1:{self.port}", "loopback_users.guest = true",
            "log.console = false", "log.file.level = warning", "disk_free_limit.absolute = 100MB", "",
        ]))
        env = self.env()
        self.epmd = spawn([find_epmd(), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                          self.workdir.parent / f"{self.workdir.name}-epmd.log", env=env)
        self.extra_pids = [self.epmd.pid]
        wait_until(lambda: port_open(self.epmd_port), self.epmd, 15, "epmd")
        self.proc = spawn([rabbit_tool("rabbitmq-server")], self.log_path, env=env, cwd=d)
        wait_until(lambda: port_open(self.port), self.proc, 180, "rabbitmq-server", self.log_path)
        subprocess.run([rabbit_tool("rabbitmqctl"), "-n", self.node, "await_startup", "--timeout", "120"],
                       env=env, check=True, capture_output=True, timeout=150)
        out = subprocess.run([rabbit_tool("rabbitmqctl"), "-n", self.node, "version"], env=env,
                             capture_output=True, text=True, check=False, timeout=60).stdout
        m = re.search(r"\d+\.\d+\.\d+", out)
        self.version = m.group(0) if m else "?"

    def stop(self) -> None:
        super().stop()
        if self.epmd is not None:  # after the node: epmd must outlive it
            stop_tree(self.epmd, grace=5)
            self.epmd = None

    def systems(self) -> list[System]:
        return [System(key="rabbitmq-quorum", label=f"RabbitMQ {self.version} quorum queue",
                       durability="quorum queue + confirms",
                       fsync_before_ack=True, module="rabbit_peer",
                       target={"driver": "rabbitmq", "port": self.port, "server_pids": self.server_pids()})]


class RabbitDriver(Driver):
    produce_mode = f"publish with confirms, {WINDOW} unconfirmed in flight"
    consume_mode = f"basic.consume prefetch {PREFETCH}, ack multiple every {ACK_EVERY}"

    def __init__(self, target: dict[str, Any]) -> None:
        super().__init__(target)
        self.conn: Any = None

    async def connect(self) -> None:
        import aio_pika

        self.conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{self.target['port']}/")
        self.channel = await self.conn.channel(publisher_confirms=True)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def drop(self, name: str) -> None:
        await self.channel.queue_delete(name)

    async def prepare(self, name: str) -> None:
        await self.drop(name)
        await self.channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})

    def _message(self, body: bytes) -> Any:
        import aio_pika

        return aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    async def produce(self, name: str, bodies: list[bytes]) -> None:
        exchange = self.channel.default_exchange
        pending: deque[asyncio.Future[Any]] = deque()
        for body in bodies:
            if len(pending) >= WINDOW:
                await pending.popleft()
            pending.append(asyncio.ensure_future(exchange.publish(self._message(body), routing_key=name)))
        await asyncio.gather(*pending)

    async def send_one(self, name: str, body: bytes) -> None:
        await self.channel.default_exchange.publish(self._message(body), routing_key=name)

    async def consume(self, name: str, n: int, seen: list[bytes]) -> None:
        channel = await self.conn.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        async with queue.iterator() as it:
            async for msg in it:
                seen.append(msg.body[:SEQ_DIGITS])
                if len(seen) % ACK_EVERY == 0 or len(seen) == n:
                    await msg.ack(multiple=True)
                if len(seen) == n:
                    break
        await channel.close()  # closes only after the acks went out on the socket

    async def after_consume(self, name: str, n: int) -> None:
        channel = await self.conn.channel()
        for _ in range(100):
            queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"},
                                                passive=True)
            if queue.declaration_result.message_count == 0:
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"{queue.declaration_result.message_count} messages left unacknowledged")
        await channel.close()


DRIVERS = {"rabbitmq": RabbitDriver}
