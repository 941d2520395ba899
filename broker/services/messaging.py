"""Send and pull, independent of the wire: both the HTTP and the TCP protocol call these.

Send: validate, choose the queue, append, wait for durability (flush, then replication), answer.
Pull: check the queue, read (in a thread), long-poll when nothing is there yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ferrymq.broker.metrics import BrokerMetrics
from ferrymq.broker.services.offsets import OffsetManager
from ferrymq.broker.services.pull_hold import PullHoldService
from ferrymq.broker.services.topics import TopicConfig, TopicManager
from ferrymq.broker.store.commitlog import Batch
from ferrymq.broker.store.message_store import GetResult, MessageStore
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import SYSTEM_TOPICS
from ferrymq.common.message import Message


@dataclass(slots=True)
class SendResult:
    msg_id: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    status: str = "SEND_OK"

    def to_api(self) -> dict[str, object]:
        return {"msgId": self.msg_id, "queueId": self.queue_id, "queueOffset": self.queue_offset,
                "status": self.status}

    def to_json(self) -> str:
        """``to_api`` as JSON text, formatted directly: a batch answer is mostly these, and every value
        is a hex id, an integer or a status constant, so nothing needs escaping."""
        return (f'{{"msgId":"{self.msg_id}","queueId":{self.queue_id},"queueOffset":{self.queue_offset},'
                f'"status":"{self.status}"}}')


class MessagingService:
    def __init__(self, store: MessageStore, topics: TopicManager, offsets: OffsetManager,
                 hold: PullHoldService, metrics: BrokerMetrics, *, max_message_size: int,
                 max_pull_messages: int, long_polling_max_ms: int, auto_create_topic: bool = False,
                 default_queue_nums: int = 4) -> None:
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.hold = hold
        self.metrics = metrics
        self.max_message_size = max_message_size
        self.max_pull_messages = max_pull_messages
        self.long_polling_max_ms = long_polling_max_ms
        self.auto_create_topic = auto_create_topic
        self.default_queue_nums = default_queue_nums
        self.readers = ThreadPoolExecutor(4, thread_name_prefix="store-read")
        # Set by the role logic: raises when this replica may not take writes (a slave, fenced).
        self.write_guard: Callable[[], None] | None = None
        # Set by replication: waits until enough in-sync replicas have the bytes up to an offset.
        self.replication_wait: Callable[[int], Awaitable[None]] | None = None
        # Set by the broker (issue #4): parks delay, timer and transactional sends in their system topics.
        self.send_router: Callable[[list[Message]], Awaitable[list[SendResult]]] | None = None
        store.add_arrival_listener(hold.notify)

    # ---- send -------------------------------------------------------------------------------------
    def writable_topic(self, topic: str) -> TopicConfig:
        cfg = self.topics.get(topic)
        if cfg is None and self.auto_create_topic and topic not in SYSTEM_TOPICS:
            from ferrymq.broker.services.topics import TopicConfigIn

            n = self.default_queue_nums
            cfg, _ = self.topics.upsert(topic, TopicConfigIn(readQueueNums=n, writeQueueNums=n))
        if cfg is None:
            cfg = self.topics.require(topic)
        if not cfg.writable:
            raise FerryError("NO_PERMISSION", f"topic {topic!r} is not writable (perm {cfg.to_api()['perm']})")
        return cfg

    def check_message(self, msg: Message, cfg: TopicConfig) -> None:
        if len(msg.body) > self.max_message_size:
            raise FerryError("MESSAGE_ILLEGAL",
                             f"message body is {len(msg.body)} bytes; maxMessageSize is {self.max_message_size}")
        if len(msg.body) == 0:
            raise FerryError("MESSAGE_ILLEGAL", "message body is empty")
        if msg.queue_id < 0:
            msg.queue_id = -1
        elif msg.queue_id >= cfg.writeQueueNums:
            raise FerryError("MESSAGE_ILLEGAL",
                             f"queueId {msg.queue_id} is not below writeQueueNums {cfg.writeQueueNums} "
                             f"of topic {cfg.topicName!r}")

    async def send(self, topic: str, msgs: list[Message]) -> list[SendResult]:
        """Send a batch to one topic. Messages without a queue id share one queue chosen round-robin,
        so a batch stays in order, as RocketMQ's batch send."""
        if not msgs:
            raise FerryError("MESSAGE_ILLEGAL", "no messages to send")
        if self.write_guard is not None:
            self.write_guard()
        cfg = self.writable_topic(topic)
        chosen = -1
        for m in msgs:
            m.topic = topic
            self.check_message(m, cfg)
            if m.queue_id < 0:
                if chosen < 0:
                    chosen = self.topics.next_queue(cfg)
                m.queue_id = chosen
        if self.send_router is not None:
            return await self.send_router(msgs)
        return await self.put(msgs)

    async def put(self, msgs: list[Message], tags_codes: list[int] | None = None) -> list[SendResult]:
        """Append already-validated messages and wait until they are as durable as promised."""
        t0 = time.perf_counter()
        recs = self.store.append(msgs, tags_codes)
        end = recs[-1].end
        await self.store.wait_durable(end)
        if self.replication_wait is not None:
            await self.replication_wait(end)
        self.metrics.observe_put(recs, time.perf_counter() - t0)
        # offset_msg_id, with the store host's half computed once per batch
        host = self.store.commitlog.store_host.hex().upper()
        return [SendResult(f"{host}{a.physical_offset:016X}", a.queue_id, a.queue_offset, a.physical_offset)
                for a in recs]

    async def send_plain(self, topic: str, queue_id: int, bodies: list[bytes],
                         props: list[dict[str, str] | None] | None = None, *, born_timestamp: int = 0,
                         flag: int = 0) -> Batch:
        """``send`` for bodies bound for one queue that the send router would pass straight to ``put``
        (no delay, timer or transaction property: the caller checks): validated, appended and awaited
        like ``send`` + ``put``, without a Message or a SendResult per body. Message ids are
        ``host_id()`` + the record's physical offset as 16 hex digits."""
        if not bodies:
            raise FerryError("MESSAGE_ILLEGAL", "no messages to send")
        if self.write_guard is not None:
            self.write_guard()
        cfg = self.writable_topic(topic)
        lengths = list(map(len, bodies))
        if max(lengths) > self.max_message_size or min(lengths) == 0:
            for n in lengths:
                if n > self.max_message_size:
                    raise FerryError("MESSAGE_ILLEGAL",
                                     f"message body is {n} bytes; maxMessageSize is {self.max_message_size}")
                if n == 0:
                    raise FerryError("MESSAGE_ILLEGAL", "message body is empty")
        if queue_id < 0:
            queue_id = self.topics.next_queue(cfg)
        elif queue_id >= cfg.writeQueueNums:
            raise FerryError("MESSAGE_ILLEGAL", f"queueId {queue_id} is not below writeQueueNums "
                                                f"{cfg.writeQueueNums} of topic {cfg.topicName!r}")
        t0 = time.perf_counter()
        batch = self.store.append_batch(topic, queue_id, bodies, props, born_timestamp=born_timestamp, flag=flag)
        end = batch.end
        await self.store.wait_durable(end)
        if self.replication_wait is not None:
            await self.replication_wait(end)
        m = self.metrics
        m.put_latency.observe(time.perf_counter() - t0)
        m.messages_in.labels(topic).inc(len(lengths))
        m.bytes_in.labels(topic).inc(sum(batch.sizes))
        return batch

    def host_id(self) -> str:
        """The store-host half of this broker's message ids (offsetMsgId)."""
        return self.store.commitlog.store_host.hex().upper()

    # ---- pull -------------------------------------------------------------------------------------
    def readable_topic(self, topic: str, queue_id: int) -> TopicConfig:
        cfg = self.topics.require(topic)
        if not cfg.readable:
            raise FerryError("NO_PERMISSION", f"topic {topic!r} is not readable (perm {cfg.to_api()['perm']})")
        if not 0 <= queue_id < cfg.readQueueNums:
            raise FerryError("INVALID_REQUEST",
                             f"queueId {queue_id} is not below readQueueNums {cfg.readQueueNums} of {topic!r}")
        return cfg

    async def pull(self, topic: str, queue_id: int, offset: int, max_messages: int,
                   tags: frozenset[str] | None, wait_ms: int) -> GetResult:
        self.readable_topic(topic, queue_id)
        if offset < 0:
            raise FerryError("OFFSET_ILLEGAL", f"offset {offset} is negative")
        if max_messages < 1:
            raise FerryError("INVALID_REQUEST", "maxMessages must be at least 1")
        if wait_ms < 0:
            raise FerryError("INVALID_REQUEST", "waitMs must not be negative")
        max_messages = min(max_messages, self.max_pull_messages)
        wait_ms = min(wait_ms, self.long_polling_max_ms)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            seen_max = self.store.max_offset(topic, queue_id)
            res = await loop.run_in_executor(self.readers, self.store.get_messages, topic, queue_id,
                                             offset, max_messages, tags)
            remaining = deadline - loop.time()
            if res.records or remaining <= 0 or res.status not in ("NO_NEW_MSG", "NO_MATCHED_LOGIC_QUEUE",
                                                                    "NO_MATCHED_MSG", "OFFSET_OVERFLOW_ONE"):
                break
            if res.status == "NO_MATCHED_MSG":
                offset = res.next_offset  # filtered-out entries are consumed; keep waiting past them
            if self.store.max_offset(topic, queue_id) != seen_max:
                continue  # dispatched while the read ran in its thread: that arrival's notify is already gone
            await self.hold.wait(topic, queue_id, max(offset, res.next_offset), remaining)
        self.metrics.observe_get(topic, res.records)
        return res

    # ---- offsets ----------------------------------------------------------------------------------
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        cfg = self.topics.require(topic)
        if not 0 <= queue_id < max(cfg.readQueueNums, cfg.writeQueueNums):
            raise FerryError("INVALID_REQUEST", f"topic {topic!r} has no queue {queue_id}")
        max_off = self.store.max_offset(topic, queue_id)
        if offset < 0 or offset > max_off:
            raise FerryError("OFFSET_ILLEGAL",
                             f"offset {offset} is outside [0, {max_off}] of {topic}/{queue_id}")
        self.offsets.commit(group, topic, queue_id, offset)

    def shutdown(self) -> None:
        self.hold.wake_all()
        self.readers.shutdown(wait=True, cancel_futures=True)

