"""Client registry, consumer-group membership and queue locks, as RocketMQ's ConsumerManager,
ProducerManager, ClientHousekeepingService and RebalanceLockManager.

Clients announce themselves with heartbeats (client id, producer groups, consumer groups with their
subscriptions) over a TCP connection ("channel"). A consumer is a member of its group while its
channel is open and its last heartbeat is younger than ``channelExpiredTimeout``; when a group's
member set changes, every remaining member is told (NOTIFY_CONSUMER_IDS_CHANGED) so that it
rebalances at once instead of at its next periodic rebalance.

Queue locks serve orderly consumption: a member locks a queue before consuming it in order. A lock
lapses ``rebalanceLockMaxLiveTime`` after its last renewal, and is dropped at once when its holder's
channel closes or its heartbeat expires. No I/O here: channels are objects the TCP server hands in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)


class ClientChannel(Protocol):
    """What the registry needs of a connection."""

    remote: str

    def notify_consumer_ids_changed(self, group: str) -> None: ...

    def close(self) -> None: ...


# ---- heartbeat payload (msgpack body of HEART_BEAT) ----------------------------------------------------
class MessageModel(StrEnum):
    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class SubscriptionData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    topic: str = Field(min_length=1, max_length=255)
    expression: str = Field("*", max_length=4096)


class ConsumerData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    group: str = Field(min_length=1, max_length=255)
    consumeType: str = "PUSH"
    messageModel: MessageModel = MessageModel.CLUSTERING
    consumeFromWhere: str = "CONSUME_FROM_LAST_OFFSET"
    orderly: bool = False
    subscriptions: list[SubscriptionData] = Field(default_factory=list, max_length=1024)


class HeartbeatData(BaseModel):
    model_config = ConfigDict(extra="ignore")

    clientId: str = Field(min_length=1, max_length=255)
    producerGroups: list[str] = Field(default_factory=list, max_length=1024)
    consumerGroups: list[ConsumerData] = Field(default_factory=list, max_length=1024)


# ---- registry -------------------------------------------------------------------------------------------
@dataclass
class ClientInfo:
    client_id: str
    channel: ClientChannel
    last_update: float


@dataclass
class ConsumerGroupInfo:
    group: str
    clients: dict[str, ClientInfo] = field(default_factory=dict)
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> expression
    message_model: MessageModel = MessageModel.CLUSTERING
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    orderly: bool = False


@dataclass
class LockEntry:
    client_id: str
    last_update: float


class ConsumerGroupService:
    def __init__(self, *, channel_expired_timeout_ms: int = 120_000, lock_max_live_time_ms: int = 60_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.channel_expired_timeout = channel_expired_timeout_ms / 1000
        self.lock_max_live_time = lock_max_live_time_ms / 1000
        self.clock = clock
        self.consumers: dict[str, ConsumerGroupInfo] = {}
        self.producers: dict[str, dict[str, ClientInfo]] = {}
        # group -> (topic, queueId) -> holder
        self.locks: dict[str, dict[tuple[str, int], LockEntry]] = {}

    # ---- membership -----------------------------------------------------------------------------------
    def heartbeat(self, channel: ClientChannel, hb: HeartbeatData) -> None:
        now = self.clock()
        cid = hb.clientId
        for pg in hb.producerGroups:
            self.producers.setdefault(pg, {})[cid] = ClientInfo(cid, channel, now)
        for cd in hb.consumerGroups:
            info = self.consumers.get(cd.group)
            if info is None:
                info = self.consumers[cd.group] = ConsumerGroupInfo(cd.group)
            info.message_model = cd.messageModel
            info.consume_from_where = cd.consumeFromWhere
            info.orderly = cd.orderly
            for sub in cd.subscriptions:
                info.subscriptions[sub.topic] = sub.expression
            old = info.clients.get(cid)
            info.clients[cid] = ClientInfo(cid, channel, now)
            if old is None:
                log.info("consumer %s joined group %s from %s", cid, cd.group, channel.remote)
                self._notify(info, skip=None)

    def unregister(self, client_id: str, producer_group: str | None, consumer_group: str | None) -> None:
        if producer_group:
            self.producers.get(producer_group, {}).pop(client_id, None)
        if consumer_group:
            info = self.consumers.get(consumer_group)
            if info is not None and info.clients.pop(client_id, None) is not None:
                log.info("consumer %s left group %s", client_id, consumer_group)
                self._drop_locks(client_id, [consumer_group])
                self._notify(info, skip=None)

    def channel_closed(self, channel: ClientChannel) -> None:
        """The connection is gone: every registration that came over it goes with it."""
        self._remove(lambda c: c.channel is channel, "its connection closed")

    def scan_expired(self) -> list[ClientChannel]:
        """Drop clients whose last heartbeat is older than channelExpiredTimeout; returns their channels
        so the caller can close them (as RocketMQ's ClientHousekeepingService)."""
        deadline = self.clock() - self.channel_expired_timeout
        return self._remove(lambda c: c.last_update < deadline, "its heartbeat expired")

    def _remove(self, dead: Callable[[ClientInfo], bool], why: str) -> list[ClientChannel]:
        channels: list[ClientChannel] = []
        for clients in self.producers.values():
            for cid in [cid for cid, c in clients.items() if dead(c)]:
                channels.append(clients.pop(cid).channel)
        for info in list(self.consumers.values()):
            gone = [cid for cid, c in info.clients.items() if dead(c)]
            for cid in gone:
                channels.append(info.clients.pop(cid).channel)
                log.info("consumer %s left group %s: %s", cid, info.group, why)
                self._drop_locks(cid, [info.group])
            if gone:
                self._notify(info, skip=None)
        self.producers = {g: c for g, c in self.producers.items() if c}
        return list({id(ch): ch for ch in channels}.values())

    def _notify(self, info: ConsumerGroupInfo, skip: ClientChannel | None) -> None:
        for c in list(info.clients.values()):
            if c.channel is skip:
                continue
            try:
                c.channel.notify_consumer_ids_changed(info.group)
            except Exception:  # a dying channel must not stop the others from hearing
                log.debug("notify %s of group %s failed", c.client_id, info.group, exc_info=True)

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        return sorted(info.clients) if info is not None else []

    def group_info(self, group: str) -> ConsumerGroupInfo | None:
        return self.consumers.get(group)

    def producer_channels(self, group: str) -> list[ClientChannel]:
        return [c.channel for c in self.producers.get(group, {}).values()]

    # ---- queue locks ----------------------------------------------------------------------------------
    def _expired(self, e: LockEntry, now: float) -> bool:
        return now - e.last_update > self.lock_max_live_time

    def lock_batch(self, group: str, client_id: str, mqs: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        """Lock (or renew) what is free, expired or already ours; return the queues now held."""
        now = self.clock()
        table = self.locks.setdefault(group, {})
        held: list[tuple[str, int]] = []
        for mq in mqs:
            e = table.get(mq)
            if e is None or e.client_id == client_id or self._expired(e, now):
                if e is not None and e.client_id != client_id:
                    log.info("queue lock %s/%s of group %s lapsed (holder %s); given to %s",
                             mq[0], mq[1], group, e.client_id, client_id)
                table[mq] = LockEntry(client_id, now)
                held.append(mq)
        return held

    def unlock_batch(self, group: str, client_id: str, mqs: Iterable[tuple[str, int]]) -> None:
        table = self.locks.get(group)
        if not table:
            return
        for mq in mqs:
            e = table.get(mq)
            if e is not None and e.client_id == client_id:
                del table[mq]

    def lock_holder(self, group: str, mq: tuple[str, int]) -> str | None:
        e = self.locks.get(group, {}).get(mq)
        if e is None or self._expired(e, self.clock()):
            return None
        return e.client_id

    def _drop_locks(self, client_id: str, groups: Iterable[str]) -> None:
        for g in groups:
            table = self.locks.get(g)
            if table:
                for mq in [mq for mq, e in table.items() if e.client_id == client_id]:
                    del table[mq]
