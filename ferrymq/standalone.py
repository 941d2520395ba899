"""``ferrymq standalone``: a controller and a one-replica broker group named ``standalone``, one port."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web

from ferrymq.broker.server import Broker
from ferrymq.common.config import BrokerConfig, FlushDiskType
from ferrymq.controller.api import route_routes
from ferrymq.controller.routes import ReplicaAddress, RouteTable

log = logging.getLogger("ferrymq.standalone")
GROUP = "standalone"


class Standalone:
    """Broker + route table in one process; ``start``/``stop`` for tests, ``run`` for the command."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.broker = Broker(config)
        self.routes = RouteTable()
        self._runner: web.AppRunner | None = None
        self.http_port = config.http_port

    def _register(self) -> None:
        host = self.config.broker_ip
        self.routes.register(
            GROUP,
            ReplicaAddress(0, f"{host}:{self.http_port}", f"{host}:{self.broker.tcp_port}", "master", GROUP),
            self.broker.topic_routes(),
        )

    async def start(self) -> None:
        await self.broker.start()
        app = self.broker.build_app()
        app.add_routes(route_routes(self.routes))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.listen_host, self.config.http_port,
                           reuse_address=True, backlog=1024)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        if sockets:
            self.http_port = sockets[0].getsockname()[1]
        self.broker.topic_listeners.append(self._register)
        self._register()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.broker.stop()


def build_config(data_dir: str, host: str, http_port: int, tcp_port: int, flush: str,
                 config_file: str | None = None) -> BrokerConfig:
    overrides = {
        "broker_name": GROUP,
        "store_path_root_dir": str(Path(data_dir)),
        "listen_host": host,
        "broker_ip": "127.0.0.1" if host in ("0.0.0.0", "") else host,
        "http_port": http_port,
        "tcp_port": tcp_port,
        "flush_disk_type": FlushDiskType.SYNC_FLUSH if flush == "sync" else FlushDiskType.ASYNC_FLUSH,
    }
    if config_file:
        return BrokerConfig.from_file(config_file, **overrides)
    return BrokerConfig(**overrides)


async def run(config: BrokerConfig) -> None:
    node = Standalone(config)
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ferrymq standalone ready: http://{config.broker_ip}:{node.http_port} "
          f"tcp://{config.broker_ip}:{node.broker.tcp_port} "
          f"(data {config.store_path_root_dir}, {config.flush_disk_type.value})", flush=True)
    await stop.wait()
    log.info("shutting down")
    await node.stop()
