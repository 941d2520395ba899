"""Consumer send-back, retry topics and dead-letter queues, as RocketMQ's
SendMessageProcessor.consumerSendMsgBack.

A consumer that could not process a message (its listener asked to reconsume later, raised, or timed
out) sends it back by commit-log offset. The broker re-puts it to ``%RETRY%{group}`` (one queue, perm
RW, created on demand) with delay level ``3 + reconsumeTimes`` (10 s, 30 s, 1 m, ... capped at the
highest level), so the group sees it again later at a growing interval. Once a message has been
reconsumed ``maxReconsumeTimes`` times (or the consumer asks with a negative delay level), the next
send-back puts it to ``%DLQ%{group}`` instead (one queue, perm W as RocketMQ: nobody consumes a
dead-letter queue by accident). Either copy keeps body and properties and records where it came from:
RETRY_TOPIC (the original topic), ORIGIN_MESSAGE_ID (the first message id) and RECONSUME_TIME.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ferrymq.broker.services.messaging import MessagingService, SendResult
from ferrymq.broker.services.topics import PERM_READ, PERM_WRITE, TopicConfig, TopicConfigIn
from ferrymq.broker.store.message_store import FOUND, MessageStore
from ferrymq.common import record
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import check_group
from ferrymq.common.message import (
    PROPERTY_DELAY_LEVEL,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_RETRY_TOPIC,
    Message,
    StoredMessage,
    parse_offset_msg_id,
)

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
FIRST_RETRY_LEVEL = 3  # RocketMQ: the first retry waits level 3 (10 s by default)
MAX_LIST = 256


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


class RetryService:
    def __init__(self, store: MessageStore, messaging: MessagingService,
                 put_routed: Callable[[list[Message]], Awaitable[list[SendResult]]], *, max_reconsume_times: int,
                 max_delay_level: int, on_topics_changed: Callable[[], None]) -> None:
        self.store = store
        self.messaging = messaging
        self.put_routed = put_routed
        self.max_reconsume_times = max_reconsume_times
        self.max_delay_level = max_delay_level
        self.on_topics_changed = on_topics_changed
        self.sent_back = 0
        self.dead_lettered = 0

    async def _ensure_topic(self, name: str, perm: int) -> TopicConfig:
        cfg = self.messaging.topics.get(name)
        if cfg is not None:
            return cfg
        spec = TopicConfigIn(readQueueNums=1, writeQueueNums=1, perm=perm)
        cfg, changed = await asyncio.to_thread(self.messaging.topics.upsert, name, spec)
        if changed:
            self.on_topics_changed()
        return cfg

    async def ensure_retry_topic(self, group: str) -> None:
        """Create ``%RETRY%{group}`` when a clustering consumer group first heartbeats, as RocketMQ
        does, so every member subscribes to it from the start instead of after a later rebalance."""
        if retry_topic(group) not in self.messaging.topics.topics:
            await self._ensure_topic(retry_topic(group), PERM_READ | PERM_WRITE)

    async def _read(self, phys: int) -> StoredMessage:
        loop = asyncio.get_running_loop()
        raw = await loop.run_in_executor(self.messaging.readers, self.store.read_message, phys)
        if raw is None:
            raise FerryError("NOT_FOUND", f"no message at commit-log offset {phys}")
        return record.decode(raw, verify=False)

    async def send_back(self, group: str, commit_log_offset: int, *, delay_level: int | None = None,
                        max_reconsume_times: int | None = None, origin_msg_id: str | None = None,
                        origin_topic: str | None = None) -> dict[str, Any]:
        check_group(group)
        if self.messaging.write_guard is not None:
            self.messaging.write_guard()
        msg = await self._read(commit_log_offset)
        limit = self.max_reconsume_times if max_reconsume_times is None else max_reconsume_times
        if PROPERTY_MAX_RECONSUME_TIMES in msg.properties and max_reconsume_times is None:
            try:
                limit = int(msg.properties[PROPERTY_MAX_RECONSUME_TIMES])
            except ValueError:
                pass
        if limit < 0:
            raise FerryError("INVALID_REQUEST", "maxReconsumeTimes must not be negative")
        times = msg.reconsume_times
        props = {k: v for k, v in msg.properties.items()
                 if k not in (PROPERTY_DELAY_LEVEL, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID)}
        props.setdefault(PROPERTY_RETRY_TOPIC, origin_topic or msg.topic)
        props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin_msg_id or msg.msg_id)
        props[PROPERTY_RECONSUME_TIME] = str(times + 1)
        dead = times >= limit or (delay_level is not None and delay_level < 0)
        if dead:
            topic = dlq_topic(group)
            await self._ensure_topic(topic, PERM_WRITE)
        else:
            topic = retry_topic(group)
            await self._ensure_topic(topic, PERM_READ | PERM_WRITE)
            level = delay_level if delay_level else FIRST_RETRY_LEVEL + times
            props[PROPERTY_DELAY_LEVEL] = str(min(level, self.max_delay_level))
        new = Message(topic=topic, body=msg.body, queue_id=0, flag=msg.flag, properties=props,
                      sysflag=msg.sysflag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                      reconsume_times=times + 1)
        r = (await self.put_routed([new]))[0]
        if dead:
            self.dead_lettered += 1
        else:
            self.sent_back += 1
        return {"status": "OK", "topic": topic, "deadLetter": dead, "reconsumeTimes": times + 1,
                "delayLevel": None if dead else int(props[PROPERTY_DELAY_LEVEL]), "msgId": r.msg_id,
                "originMsgId": props[PROPERTY_ORIGIN_MESSAGE_ID]}

    # ---- dead-letter queue admin --------------------------------------------------------------------
    async def list_dead(self, group: str, offset: int, max_messages: int) -> tuple[list[StoredMessage], int, int]:
        """Browse ``%DLQ%{group}`` regardless of its perm (an admin read); (messages, next, max)."""
        check_group(group)
        topic = dlq_topic(group)
        if self.messaging.topics.get(topic) is None:
            return [], 0, 0
        if offset < 0 or max_messages < 1:
            raise FerryError("INVALID_REQUEST", "offset must be >= 0 and maxMessages >= 1")
        loop = asyncio.get_running_loop()
        offset = max(offset, self.store.min_offset(topic, 0))
        res = await loop.run_in_executor(self.messaging.readers, self.store.get_messages, topic, 0, offset,
                                         min(max_messages, MAX_LIST))
        msgs = [record.decode(r, verify=False) for r in res.records] if res.status == FOUND else []
        return msgs, res.next_offset, res.max_offset

    async def resend_dead(self, group: str, msg_id: str) -> dict[str, Any]:
        """Send a dead-lettered message again to its original topic, as a fresh message."""
        check_group(group)
        msg = await self._read(parse_offset_msg_id(msg_id))
        if msg.topic != dlq_topic(group):
            raise FerryError("INVALID_REQUEST", f"message {msg_id} is not in {dlq_topic(group)}")
        original = msg.properties.get(PROPERTY_RETRY_TOPIC)
        if not original:
            raise FerryError("MESSAGE_ILLEGAL", f"message {msg_id} does not name its original topic")
        props = {k: v for k, v in msg.properties.items()
                 if k not in (PROPERTY_RETRY_TOPIC, PROPERTY_RECONSUME_TIME, PROPERTY_DELAY_LEVEL)}
        again = Message(topic=original, body=msg.body, queue_id=-1, flag=msg.flag, properties=props,
                        born_timestamp=msg.born_timestamp, born_host=msg.born_host)
        r = (await self.messaging.send(original, [again]))[0]
        return {"topic": original, **r.to_api(), "originMsgId": props.get(PROPERTY_ORIGIN_MESSAGE_ID)}
