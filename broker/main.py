"""``ferrymq broker``: one replica of a broker group in controller mode."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket

from aiohttp import web

from ferrymq.broker.ha.controller_client import ControllerClient
from ferrymq.broker.ha.replica import ReplicaManager
from ferrymq.broker.server import Broker
from ferrymq.common.config import BrokerConfig, FlushDiskType, ReplicationMode

log = logging.getLogger("ferrymq.broker")


def config_from_args(args: argparse.Namespace) -> BrokerConfig:
    name = args.name or os.environ.get("FERRYMQ_NAME") or socket.gethostname()
    listen = args.host or os.environ.get("FERRYMQ_LISTEN_HOST") or "0.0.0.0"
    advertise = args.advertise_host or os.environ.get("FERRYMQ_ADVERTISE_HOST") or \
        ("127.0.0.1" if listen in ("0.0.0.0", "") else listen)
    overrides = {
        "broker_name": args.group,
        "store_path_root_dir": args.data_dir,
        "http_port": args.http_port,
        "tcp_port": args.tcp_port,
        "ha_port": args.ha_port,
        "controller_addr": args.controller,
        "listen_host": listen,
        "advertise_host": advertise,
        "broker_ip": _ip_of(advertise),
        "broker_replica_name": name,
    }
    if args.flush is not None:
        overrides["flush_disk_type"] = FlushDiskType.SYNC_FLUSH if args.flush == "sync" else FlushDiskType.ASYNC_FLUSH
    if args.replication is not None:
        overrides["replication_mode"] = ReplicationMode(args.replication.upper())
    if args.in_sync_replicas is not None:
        overrides["in_sync_replicas"] = args.in_sync_replicas
    if args.min_in_sync_replicas is not None:
        overrides["min_in_sync_replicas"] = args.min_in_sync_replicas
    if args.config:
        return BrokerConfig.from_file(args.config, **overrides)
    return BrokerConfig(**overrides)


def _ip_of(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        return "0.0.0.0"


class BrokerNode:
    """Broker + its HTTP server + replication + the controller link; start/stop for tests too."""

    def __init__(self, config: BrokerConfig) -> None:
        if not config.controller_addr:
            raise ValueError("a broker in controller mode needs --controller")
        self.config = config
        self.broker = Broker(config)
        adv = config.advertise_host or config.broker_ip
        self.replica = ReplicaManager(
            self.broker, ControllerClient(config.controller_addr),
            http_address=f"{adv}:{config.http_port}", tcp_address=f"{adv}:{config.tcp_port}",
            ha_host=config.listen_host, ha_port=config.ha_port, ha_advertise=adv,
        )
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        await self.broker.start()
        self._runner = web.AppRunner(self.broker.build_app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.config.listen_host, self.config.http_port, reuse_address=True,
                          backlog=1024).start()
        await self.replica.start()

    async def stop(self) -> None:
        await self.replica.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        await self.broker.stop()


async def run(config: BrokerConfig) -> None:
    node = BrokerNode(config)
    await node.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ferrymq broker ready: group {config.broker_name}, broker {node.replica.broker_id}, "
          f"http {config.listen_host}:{config.http_port}, ha {node.replica.ha_address}", flush=True)
    await stop.wait()
    await node.stop()
