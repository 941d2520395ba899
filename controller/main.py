"""``ferrymq controller``: the HTTP API, the decisions loop and the state store in one process."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

from aiohttp import web

from ferrymq.common.http import error_middleware
from ferrymq.controller.api import controller_routes
from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.metrics import metrics_route
from ferrymq.controller.service import ControllerService
from ferrymq.controller.stores import store_from_url

log = logging.getLogger("ferrymq.controller")


class ControllerServer:
    """One controller; ``start``/``stop`` for tests, ``run`` for the command."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        # the identity (advertised URL) is known only once the port is bound; set before the store opens
        self.store = store_from_url(config.store, "", lease_seconds=config.leader_lease_seconds)
        self.service = ControllerService(config, self.store)
        self._runner: web.AppRunner | None = None
        self.port = config.listen_port

    @property
    def url(self) -> str:
        return self.store.identity

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[error_middleware], client_max_size=4 * 1024 * 1024)
        app.add_routes(controller_routes(self.service))
        app.add_routes([metrics_route(self.service)])
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.build_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.listen_host, self.config.listen_port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        if sockets:
            self.port = sockets[0].getsockname()[1]
        host = self.config.listen_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        self.store.identity = (self.config.advertise_address or f"http://{host}:{self.port}").rstrip("/")
        try:
            await self.service.start()
        except BaseException:
            await self._runner.cleanup()
            raise

    async def stop(self) -> None:
        await self.service.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def run(config: ControllerConfig) -> None:
    server = ControllerServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ferrymq controller ready: {server.url} (store {config.store}, heartbeat timeout "
          f"{config.controller_broker_heartbeat_timeout} ms, unclean election "
          f"{'on' if config.enable_elect_unclean_master else 'off'})", flush=True)
    await stop.wait()
    log.info("shutting down")
    await server.stop()
