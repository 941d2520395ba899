"""What the client hands over and gets back: messages, send and pull results, queues, listener answers.

Properties travel as RocketMQ's do: tags, keys and delivery settings are reserved properties
(TAGS, KEYS, DELAY, TIMER_DELIVER_MS) next to the user's own.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from ferrymq.client.errors import ClientError
from ferrymq.common import record
from ferrymq.common.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    SYSTEM_PROPERTIES,
    decode_properties,
)


class ConsumeResult(StrEnum):
    SUCCESS = "SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


class TransactionState(StrEnum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class MessageQueue(NamedTuple):
    """One queue of a topic on one broker group; sorts as RocketMQ's (topic, broker, queue id)."""

    topic: str
    broker_group: str
    queue_id: int


@dataclass
class Message:
    topic: str
    body: bytes
    tags: str | None = None
    keys: list[str] | str | None = None
    properties: dict[str, str] | None = None
    delay_level: int = 0
    deliver_at_ms: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.body, str):
            self.body = self.body.encode()
        if not isinstance(self.body, bytes | bytearray | memoryview):
            raise ClientError("MESSAGE_ILLEGAL", "a message body is bytes (or str, sent as UTF-8)")
        if isinstance(self.keys, str):
            self.keys = [self.keys]

    def wire_properties(self) -> dict[str, str] | None:
        """The properties map as it goes on the wire (reserved names included)."""
        props: dict[str, str] = {}
        if self.properties:
            for k, v in self.properties.items():
                if k in SYSTEM_PROPERTIES:
                    raise ClientError("MESSAGE_ILLEGAL", f"property {k!r} is reserved; use the {k.lower()} field")
                if not isinstance(k, str) or not isinstance(v, str) or not k:
                    raise ClientError("MESSAGE_ILLEGAL", "properties map non-empty strings to strings")
                props[k] = v
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        if self.keys:
            for k in self.keys:
                if not k or KEY_SEPARATOR in k:
                    raise ClientError("MESSAGE_ILLEGAL", f"key {k!r} must be non-empty and contain no spaces")
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(self.keys)
        if self.delay_level:
            if self.deliver_at_ms is not None:
                raise ClientError("MESSAGE_ILLEGAL", "give delay_level or deliver_at_ms, not both")
            props[PROPERTY_DELAY_LEVEL] = str(self.delay_level)
        if self.deliver_at_ms is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliver_at_ms)
        return props or None


@dataclass(slots=True)
class ReceivedMessage:
    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    tags: str | None
    keys: list[str]
    properties: dict[str, str]
    born_timestamp: int
    store_timestamp: int
    reconsume_times: int
    broker_group: str
    commit_log_offset: int = 0

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_group, self.queue_id)


@dataclass(slots=True)
class SendResult:
    msg_id: str
    queue_id: int
    queue_offset: int
    topic: str
    broker_group: str
    status: str = "SEND_OK"


@dataclass(slots=True)
class PullResult:
    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[ReceivedMessage] = field(default_factory=list)


_HEADER = record.HEADER
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def decode_records(blob: bytes, broker_group: str) -> list[ReceivedMessage]:
    """The raw commit-log records of a pull response → messages. The broker verified each record
    (CRC included) when it read it, so this only unpacks."""
    out: list[ReceivedMessage] = []
    pos, n = 0, len(blob)
    mv = memoryview(blob)
    while pos + record.FIXED_OVERHEAD <= n:
        (total, _magic, _crc, queue_id, _flag, queue_offset, phys, _sysflag, born_ts, _bh, store_ts,
         store_host, reconsume, _prep) = _HEADER.unpack_from(blob, pos)
        if total < record.FIXED_OVERHEAD or pos + total > n:
            raise ClientError("SYSTEM_ERROR", f"malformed record at byte {pos} of a pull response")
        p = pos + record.HEADER_SIZE
        (blen,) = _I32.unpack_from(blob, p)
        p += 4
        body = bytes(mv[p:p + blen])
        p += blen
        tlen = blob[p]
        topic = bytes(mv[p + 1:p + 1 + tlen]).decode("utf-8", "replace")
        p += 1 + tlen
        (plen,) = _I16.unpack_from(blob, p)
        props = decode_properties(mv[p + 2:p + 2 + plen]) if plen else {}
        tags = props.pop(PROPERTY_TAGS, None)
        raw_keys = props.pop(PROPERTY_KEYS, None)
        out.append(ReceivedMessage(
            msg_id=(store_host + phys.to_bytes(8, "big")).hex().upper(), topic=topic, queue_id=queue_id,
            queue_offset=queue_offset, body=body, tags=tags, keys=raw_keys.split(KEY_SEPARATOR) if raw_keys else [],
            properties=props, born_timestamp=born_ts, store_timestamp=store_ts, reconsume_times=reconsume,
            broker_group=broker_group, commit_log_offset=phys))
        pos += total
    return out
