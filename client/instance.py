"""One client's connection to the cluster: routes, broker connections, heartbeats, and typed calls
for every request code (RocketMQ's MQClientInstance + MQClientAPIImpl).

Producers and consumers each own an instance. Heartbeats go to the master of every broker group that
holds a topic the client uses, at start, every ``heartbeat_interval`` and whenever a connection is
(re)opened, so a broker that dropped the client (idle close, restart) learns of it again at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgpack

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import Command
from ferrymq.client.errors import ClientError
from ferrymq.client.message import MessageQueue, PullResult, decode_records
from ferrymq.client.routes import ROUTE_REFRESH_S, HttpApi, RouteCache, TopicRoute
from ferrymq.client.transport import Connection, RemotingClient

log = logging.getLogger(__name__)
_packb = msgpack.Packer(use_bin_type=True).pack
_ids = itertools.count(1)
HEARTBEAT_INTERVAL_S = 30.0


def _unpack(body: bytes) -> Any:
    return msgpack.unpackb(body, raw=False, strict_map_key=False)


def new_client_id(instance_name: str | None = None) -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    name = instance_name or f"{os.getpid()}#{next(_ids)}"
    return f"{ip}@{name}@{uuid.uuid4().hex[:8]}"


class Member(Protocol):
    """A consumer registered with an instance."""

    group: str

    def consumer_data(self) -> dict[str, Any]: ...

    def on_consumer_ids_changed(self) -> None: ...


class ClientInstance:
    def __init__(self, url: str, *, instance_name: str | None = None,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL_S) -> None:
        self.http = HttpApi(url)
        self.routes = RouteCache(self.http)
        self.remoting = RemotingClient(on_request=self._on_request, on_connect=self._on_connect)
        self.client_id = new_client_id(instance_name)
        self.heartbeat_interval = heartbeat_interval
        self.producer_groups: set[str] = set()
        # producer group -> handler of the broker's CHECK_TRANSACTION_STATE (a transaction producer)
        self.transaction_checkers: dict[str, Callable[[Connection, Command], None]] = {}
        self.members: dict[str, Member] = {}
        self.topics: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.started = False

    # ---- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.started:
            return
        self.started = True
        self._tasks.append(asyncio.create_task(self._every(self.heartbeat_interval, self.heartbeat_all)))
        self._tasks.append(asyncio.create_task(self._every(ROUTE_REFRESH_S, self._refresh_routes)))

    async def shutdown(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        # Closing the connection drops the registrations too; unregistering first tells the group's
        # other members at once, whatever order the sockets close in.
        for addr in self.broker_addresses():
            for cg in list(self.members):
                with contextlib.suppress(ClientError, OSError):
                    await self.remoting.invoke(addr, RequestCode.UNREGISTER_CLIENT,
                                               {"clientId": self.client_id, "consumerGroup": cg}, timeout_s=1.0)
        self.remoting.close()
        await self.http.close()
        self.started = False

    async def _every(self, interval: float, fn: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await fn()
            except Exception:  # background upkeep: log and try again next round
                log.warning("%s failed", getattr(fn, "__name__", fn), exc_info=True)

    async def _refresh_routes(self) -> None:
        for topic in list(self.topics):
            with contextlib.suppress(ClientError):
                await self.routes.get(topic, refresh=True)

    # ---- routes -----------------------------------------------------------------------------------------
    async def route(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        self.topics.add(topic)
        return await self.routes.get(topic, refresh=refresh)

    def fresh_route(self, topic: str) -> TopicRoute | None:
        """What ``route(topic)`` returns without awaiting anything (the cached route while fresh), else None."""
        self.topics.add(topic)
        return self.routes.fresh(topic)

    def broker_addresses(self) -> set[str]:
        out = set()
        for topic in self.topics:
            route = self.routes.cached(topic)
            if route is not None:
                out.update(g.master_tcp for g in route.groups if g.master_tcp)
        return out

    async def address(self, mq: MessageQueue, *, read: bool = False) -> str:
        """The master of ``mq``'s group; for ``read``s, a slave while there is none or it just failed."""
        self.topics.add(mq.topic)
        return await self.routes.address(mq, read=read, health=self.remoting.health)

    # ---- heartbeats and broker requests ---------------------------------------------------------------
    def heartbeat_data(self) -> bytes:
        return _packb({"clientId": self.client_id, "producerGroups": sorted(self.producer_groups),
                       "consumerGroups": [m.consumer_data() for m in self.members.values()]})

    async def heartbeat(self, address: str) -> None:
        await self.remoting.invoke(address, RequestCode.HEART_BEAT, None, self.heartbeat_data())

    async def heartbeat_all(self) -> None:
        await asyncio.gather(*(self._quiet_heartbeat(a) for a in self.broker_addresses()))

    async def _quiet_heartbeat(self, address: str) -> None:
        try:
            await self.heartbeat(address)
        except (ClientError, OSError) as exc:
            log.debug("heartbeat to %s failed: %s", address, exc)

    async def _on_connect(self, address: str) -> None:
        if self.producer_groups or self.members:
            await self._quiet_heartbeat(address)

    def _on_request(self, conn: Connection, cmd: Command) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            member = self.members.get(str(cmd.ext.get("consumerGroup")))
            if member is not None:
                member.on_consumer_ids_changed()
        elif cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            checker = self.transaction_checkers.get(str(cmd.ext.get("producerGroup")))
            if checker is not None:
                checker(conn, cmd)
            else:
                log.info("transaction check for unknown producer group %s from %s", cmd.ext.get("producerGroup"),
                         conn.address)

    # ---- typed calls ------------------------------------------------------------------------------------
    async def pull(self, mq: MessageQueue, offset: int, max_msgs: int, *, tags: str | None = None,
                   wait_ms: int = 0, group: str | None = None, commit_offset: int | None = None,
                   timeout_s: float | None = None) -> PullResult:
        addr = await self.address(mq, read=True)
        ext: dict[str, Any] = {"topic": mq.topic, "queueId": mq.queue_id, "offset": offset, "maxMsgs": max_msgs,
                               "waitMs": wait_ms}
        if tags and tags.strip() not in ("", "*"):
            ext["tags"] = tags
        # commits go to masters only: a slave's offsets are overwritten by its master's
        if group is not None and commit_offset is not None and commit_offset >= 0 and self.routes.is_master(mq, addr):
            ext["group"], ext["commitOffset"] = group, commit_offset
        resp = await self.remoting.invoke(addr, RequestCode.PULL_MESSAGE, ext,
                                          timeout_s=timeout_s or wait_ms / 1000 + 5.0)
        e = resp.ext
        return PullResult(e["status"], e["nextOffset"], e["minOffset"], e["maxOffset"],
                          decode_records(resp.body, mq.broker_group) if resp.body else [])

    async def _queue_call(self, code: int, mq: MessageQueue, *, read: bool = True, **extra: Any) -> dict[str, Any]:
        resp = await self.remoting.invoke(await self.address(mq, read=read), code,
                                          {"topic": mq.topic, "queueId": mq.queue_id, **extra})
        return resp.ext

    async def max_offset(self, mq: MessageQueue) -> int:
        return int((await self._queue_call(RequestCode.GET_MAX_OFFSET, mq))["offset"])

    async def min_offset(self, mq: MessageQueue) -> int:
        return int((await self._queue_call(RequestCode.GET_MIN_OFFSET, mq))["offset"])

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return int((await self._queue_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, mq,
                                           timestamp=int(timestamp_ms)))["offset"])

    async def query_offset(self, group: str, mq: MessageQueue) -> int:
        return int((await self._queue_call(RequestCode.QUERY_CONSUMER_OFFSET, mq, group=group))["offset"])

    async def update_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        await self._queue_call(RequestCode.UPDATE_CONSUMER_OFFSET, mq, read=False, group=group, offset=int(offset))

    async def consumer_ids(self, group: str, address: str) -> list[str]:
        resp = await self.remoting.invoke(address, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"group": group})
        return [str(c) for c in _unpack(resp.body)]

    async def lock_batch(self, group: str, address: str, mqs: list[MessageQueue]) -> set[MessageQueue]:
        if not mqs:
            return set()
        resp = await self.remoting.invoke(address, RequestCode.LOCK_BATCH_MQ,
                                          {"group": group, "clientId": self.client_id},
                                          _packb([[mq.topic, mq.queue_id] for mq in mqs]))
        held = {(t, q) for t, q in _unpack(resp.body)}
        return {mq for mq in mqs if (mq.topic, mq.queue_id) in held}

    async def unlock_batch(self, group: str, address: str, mqs: list[MessageQueue]) -> None:
        if mqs:
            await self.remoting.invoke(address, RequestCode.UNLOCK_BATCH_MQ,
                                       {"group": group, "clientId": self.client_id},
                                       _packb([[mq.topic, mq.queue_id] for mq in mqs]))

    async def call(self, address: str, code: int, ext: dict[str, Any] | None = None, body: bytes = b"",
                   timeout_s: float = 5.0) -> Any:
        """A request whose answer body is msgpack (admin calls); returns the decoded body or the ext."""
        resp = await self.remoting.invoke(address, code, ext, body, timeout_s=timeout_s)
        return _unpack(resp.body) if resp.body else resp.ext


def elapsed_ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000

