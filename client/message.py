"""What the client hands over and gets back: messages, send and pull results, queues, listener answers.

Properties travel as RocketMQ's do: tags, keys and delivery settings are reserved properties
(TAGS, KEYS, DELAY, TIMER_DELIVER_MS) next to the user's own.
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

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


_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_HEADER = record.HEADER
# field groups of a lazily decoded message, each unpacked at once on first access to one of its fields
_HEADER_BIT, _BODY_BIT, _TOPIC_BIT, _PROPERTIES_BIT, _MSG_ID_BIT = 1, 2, 4, 8, 16
_ALL_BITS = 31


def _load_header(m: ReceivedMessage) -> None:
    (_total, _magic, _crc, queue_id, _flag, queue_offset, phys, _sysflag, born_ts, _bh, store_ts, _sh,
     reconsume, _prep) = _HEADER.unpack_from(m._blob, m._pos)
    m._queue_id, m._queue_offset, m._commit_log_offset = queue_id, queue_offset, phys
    m._born_timestamp, m._store_timestamp, m._reconsume_times = born_ts, store_ts, reconsume
    m._loaded |= _HEADER_BIT


def _body_span(m: ReceivedMessage) -> tuple[int, int]:
    p = m._pos + record.HEADER_SIZE
    (blen,) = _I32.unpack_from(m._blob, p)
    return p + 4, p + 4 + blen


def _load_body(m: ReceivedMessage) -> None:
    blob, p = m._blob, m._pos + record.HEADER_SIZE
    (blen,) = _I32.unpack_from(blob, p)
    m._body = blob[p + 4:p + 4 + blen]
    m._loaded |= _BODY_BIT


def _topic_span(m: ReceivedMessage) -> tuple[int, int]:
    p = _body_span(m)[1]
    return p + 1, p + 1 + m._blob[p]


def _load_topic(m: ReceivedMessage) -> None:
    start, end = _topic_span(m)
    m._topic = m._blob[start:end].decode("utf-8", "replace")
    m._loaded |= _TOPIC_BIT


def _load_properties(m: ReceivedMessage) -> None:
    p = _topic_span(m)[1]
    (plen,) = _I16.unpack_from(m._blob, p)
    props = decode_properties(m._blob[p + 2:p + 2 + plen]) if plen else {}
    m._tags = props.pop(PROPERTY_TAGS, None)
    raw_keys = props.pop(PROPERTY_KEYS, None)
    m._keys = raw_keys.split(KEY_SEPARATOR) if raw_keys else []
    m._properties = props
    m._loaded |= _PROPERTIES_BIT


# RocketMQ's offset message id: store host (8 bytes) + physical offset (8 bytes), read from the record
_PHYS_AT = struct.calcsize(">iiiiiq")
_STORE_HOST_AT = struct.calcsize(">iiiiiqqiq8sq")


def _load_msg_id(m: ReceivedMessage) -> None:
    blob, pos = m._blob, m._pos
    host, phys = pos + _STORE_HOST_AT, pos + _PHYS_AT
    m._msg_id = (blob[host:host + 8] + blob[phys:phys + 8]).hex().upper()
    m._loaded |= _MSG_ID_BIT


def _lazy(slot: str, bit: int, load: Callable[[ReceivedMessage], None]) -> Any:
    """A field read from the record's bytes on first access (then kept). A loader fills every field of its
    group (and sets the group's bit of ``_loaded``), so setting a field loads its group first: a later
    read of a sibling cannot overwrite it. (A bit rather than an unset slot: catching the AttributeError
    of an unset slot costs more than the whole decode.)"""
    get = operator.attrgetter(slot)

    def fget(self: ReceivedMessage) -> Any:
        if not self._loaded & bit:
            load(self)
        return get(self)

    def fset(self: ReceivedMessage, value: Any) -> None:
        if not self._loaded & bit:
            load(self)
        setattr(self, slot, value)

    return property(fget, fset)


class ReceivedMessage:
    """A consumed message. Those of a pull response are views of its raw commit-log records: each group
    of fields is unpacked on first access (a consumer that only reads bodies pays for nothing else, and
    decoding a pull of a thousand messages costs little more than finding where each one starts). Such
    a message keeps the pull response's bytes alive as long as it lives."""

    __slots__ = ("_blob", "_body", "_born_timestamp", "_commit_log_offset", "_keys", "_loaded", "_msg_id", "_pos",
                 "_properties", "_queue_id", "_queue_offset", "_reconsume_times", "_store_timestamp", "_tags",
                 "_topic", "broker_group")

    FIELDS = ("msg_id", "topic", "queue_id", "queue_offset", "body", "tags", "keys", "properties", "born_timestamp",
              "store_timestamp", "reconsume_times", "broker_group", "commit_log_offset")

    msg_id: str = _lazy("_msg_id", _MSG_ID_BIT, _load_msg_id)
    topic: str = _lazy("_topic", _TOPIC_BIT, _load_topic)
    queue_id: int = _lazy("_queue_id", _HEADER_BIT, _load_header)
    queue_offset: int = _lazy("_queue_offset", _HEADER_BIT, _load_header)
    body: bytes = _lazy("_body", _BODY_BIT, _load_body)
    tags: str | None = _lazy("_tags", _PROPERTIES_BIT, _load_properties)
    keys: list[str] = _lazy("_keys", _PROPERTIES_BIT, _load_properties)
    properties: dict[str, str] = _lazy("_properties", _PROPERTIES_BIT, _load_properties)
    born_timestamp: int = _lazy("_born_timestamp", _HEADER_BIT, _load_header)
    store_timestamp: int = _lazy("_store_timestamp", _HEADER_BIT, _load_header)
    reconsume_times: int = _lazy("_reconsume_times", _HEADER_BIT, _load_header)
    commit_log_offset: int = _lazy("_commit_log_offset", _HEADER_BIT, _load_header)

    def __init__(self, msg_id: str, topic: str, queue_id: int, queue_offset: int, body: bytes, tags: str | None,
                 keys: list[str], properties: dict[str, str], born_timestamp: int, store_timestamp: int,
                 reconsume_times: int, broker_group: str, commit_log_offset: int = 0) -> None:
        self._msg_id, self._topic, self._queue_id, self._queue_offset = msg_id, topic, queue_id, queue_offset
        self._body, self._tags, self._keys, self._properties = body, tags, keys, properties
        self._born_timestamp, self._store_timestamp = born_timestamp, store_timestamp
        self._reconsume_times, self._commit_log_offset = reconsume_times, commit_log_offset
        self.broker_group = broker_group
        self._loaded = _ALL_BITS

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self.FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return f"ReceivedMessage({', '.join(f'{f}={getattr(self, f)!r}' for f in self.FIELDS)})"

    @property
    def queue(self) -> MessageQueue:
        return MessageQueue(self.topic, self.broker_group, self.queue_id)


_new = object.__new__


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


def decode_records(blob: bytes, broker_group: str) -> list[ReceivedMessage]:
    """The raw commit-log records of a pull response → messages. The broker verified each record
    (CRC included) when it read it, so this only finds where each one starts; fields are unpacked when
    the application reads them."""
    out: list[ReceivedMessage] = []
    append = out.append
    unpack_total = _I32.unpack_from
    minimum = record.FIXED_OVERHEAD
    pos, n = 0, len(blob)
    while pos + minimum <= n:
        (total,) = unpack_total(blob, pos)
        if total < minimum or pos + total > n:
            raise ClientError("SYSTEM_ERROR", f"malformed record at byte {pos} of a pull response")
        m = _new(ReceivedMessage)  # no __init__: every field group is decoded on first access
        m._blob, m._pos, m.broker_group, m._loaded = blob, pos, broker_group, 0
        append(m)
        pos += total
    return out
