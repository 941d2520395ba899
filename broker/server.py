"""A broker replica: wiring only. Builds the store and services, serves HTTP, shuts down cleanly."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from ferrymq.broker.metrics import BrokerMetrics
from ferrymq.broker.protocol.http_api import routes as http_routes
from ferrymq.broker.protocol.http_ext import routes as message_type_routes
from ferrymq.broker.protocol.tcp_handlers import build_handlers, message_type_handlers
from ferrymq.broker.protocol.tcp_server import TcpServer
from ferrymq.broker.services.consumer_groups import ConsumerGroupService
from ferrymq.broker.services.message_types import MessageTypes
from ferrymq.broker.services.messaging import MessagingService
from ferrymq.broker.services.offsets import OffsetManager
from ferrymq.broker.services.pull_hold import PullHoldService
from ferrymq.broker.services.topics import TopicConfig, TopicManager
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common.config import BrokerConfig
from ferrymq.common.errors import FerryError
from ferrymq.common.http import error_middleware
from ferrymq.common.record import host_bytes

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = Path(config.store_path_root_dir)
        self.metrics = BrokerMetrics()
        self.store = MessageStore(config.store_config(), host_bytes(config.broker_ip, config.tcp_port),
                                  on_flush_latency=self.metrics.flush_latency.observe)
        self.topics = TopicManager(self.data_dir / "config" / "topics.json")
        self.offsets = OffsetManager(self.data_dir / "config" / "consumerOffset.json")
        self.hold = PullHoldService()
        self.messaging = MessagingService(
            self.store, self.topics, self.offsets, self.hold, self.metrics,
            max_message_size=config.max_message_size, max_pull_messages=config.max_pull_messages,
            long_polling_max_ms=config.long_polling_max_ms, auto_create_topic=config.auto_create_topic_enable,
            default_queue_nums=config.default_topic_queue_nums,
        )
        # Role as the controller decides it; standalone is its own master at epoch 1.
        self.role = "master"
        self.broker_id = 0
        self.epoch = 1
        self.topic_listeners: list[Callable[[], None]] = []
        self.groups = ConsumerGroupService(channel_expired_timeout_ms=config.channel_expired_timeout,
                                           lock_max_live_time_ms=config.rebalance_lock_max_live_time)
        self.tcp: TcpServer | None = None
        self.message_types = MessageTypes(self)
        self._lock_fd: int | None = None
        self.metrics.on_collect(self._collect)

    # ---- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        self.topics.load()
        self.offsets.load()
        await asyncio.to_thread(self.store.load)
        self.store.start(asyncio.get_running_loop())
        self.offsets.start()
        await self.message_types.start()
        await self.start_tcp()
        log.info("broker %s started on %s (log %d..%d, %s)", self.config.broker_name, self.data_dir,
                 self.store.commitlog.min_offset, self.store.commitlog.max_offset,
                 "clean start" if self.store.clean_start else f"recovered: {self.store.recovery}")

    def _lock_data_dir(self) -> None:
        fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise RuntimeError(f"{self.data_dir} is in use by another broker") from exc
        self._lock_fd = fd

    async def start_tcp(self) -> None:
        c = self.config
        handlers = build_handlers(self, self.groups) | message_type_handlers(self)
        self.tcp = TcpServer(handlers, self.groups, host=c.listen_host, port=c.tcp_port,
                             max_inflight=c.server_max_inflight_requests_per_channel,
                             max_frame=c.frame_max_length, idle_timeout_s=c.server_channel_max_idle_time_seconds)
        await self.tcp.start()

    @property
    def tcp_port(self) -> int:
        """The bound TCP port (differs from the configured one when that was 0)."""
        return self.tcp.port if self.tcp is not None else self.config.tcp_port

    async def stop(self) -> None:
        if self.tcp is not None:
            await self.tcp.stop()
        await self.message_types.stop()
        self.messaging.shutdown()
        await asyncio.to_thread(self.store.shutdown)
        await asyncio.to_thread(self.message_types.write_final)
        self.offsets.stop()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        log.info("broker %s stopped cleanly", self.config.broker_name)

    def build_app(self) -> web.Application:
        app = web.Application(middlewares=[error_middleware], client_max_size=self.config.max_http_body_size)
        app.add_routes(http_routes(self))
        app.add_routes(message_type_routes(self))
        return app

    # ---- views ------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"status": "ok", "group": self.config.broker_name, "role": self.role, "brokerId": self.broker_id,
                "epoch": self.epoch, "diskFull": self.store.disk_full,
                "commitLogMaxOffset": self.store.commitlog.max_offset}

    def describe_topic(self, cfg: TopicConfig) -> dict[str, Any]:
        out = cfg.to_api()
        n = max(cfg.readQueueNums, cfg.writeQueueNums)
        out["queues"] = [{"queueId": q, "minOffset": self.store.min_offset(cfg.topicName, q),
                          "maxOffset": self.store.max_offset(cfg.topicName, q)} for q in range(n)]
        return out

    def topic_routes(self) -> dict[str, dict[str, Any]]:
        return {n: c.to_api() for n, c in self.topics.topics.items() if not c.system}

    # ---- admin ------------------------------------------------------------------------------------
    def check_admin_writable(self) -> None:
        if self.role != "master":
            raise FerryError("SERVICE_NOT_AVAILABLE", "this replica is a slave; send admin requests to the master")

    def on_topics_changed(self) -> None:
        for fn in self.topic_listeners:
            fn()

    def delete_topic(self, topic: str) -> None:
        self.topics.delete(topic)
        self.store.delete_topic(topic)
        self.offsets.forget_topic(topic)
        self.on_topics_changed()

    def _collect(self) -> None:
        m, cl = self.metrics, self.store.commitlog
        m.commitlog_size.set(cl.max_offset - cl.min_offset)
        m.commitlog_max_offset.set(cl.max_offset)
        m.commitlog_flushed_offset.set(cl.files.flushed_offset)
        m.corrupt_records.set(self.store.stats.corrupt_records_skipped)
        m.disk_used_ratio.set(self.store.last_disk_ratio)
        for role in ("master", "slave"):
            m.role.labels(role).set(1 if self.role == role else 0)
