"""The message model: properties as RocketMQ encodes them, tag hashes, message ids.

RocketMQ keeps everything that is not a fixed header field (tags, keys, delay level, the real topic
of a scheduled or half message, ...) in a properties string of ``name \\x01 value \\x02`` pairs. We do
the same so that system services can move a message between topics without touching its body.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field

from ferrymq.common.errors import FerryError
from ferrymq.common.limits import PROPERTIES_MAX_LENGTH

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "

# RocketMQ MessageConst property names.
PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_DELAY_LEVEL = "DELAY"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_CHECK_IMMUNITY_TIME = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"

# Names the broker manages; the API exposes them through dedicated fields, not as user properties.
SYSTEM_PROPERTIES = frozenset({PROPERTY_TAGS, PROPERTY_KEYS})

# sysflag bits, as MessageSysFlag.
SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_NOT_TYPE = 0x0
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC


def encode_properties(props: dict[str, str]) -> bytes:
    if not props:
        return b""
    parts = []
    for k, v in props.items():
        if (
            NAME_VALUE_SEPARATOR in k
            or PROPERTY_SEPARATOR in k
            or NAME_VALUE_SEPARATOR in v
            or PROPERTY_SEPARATOR in v
        ):
            raise FerryError("MESSAGE_ILLEGAL", f"property {k!r} contains a reserved control character")
        parts.append(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}")
    data = "".join(parts).encode()
    if len(data) > PROPERTIES_MAX_LENGTH:
        raise FerryError(
            "PROPERTIES_SIZE_EXCEEDED",
            f"encoded properties are {len(data)} bytes; the limit is {PROPERTIES_MAX_LENGTH}",
        )
    return data


def decode_properties(data: bytes | memoryview) -> dict[str, str]:
    if not data:
        return {}
    out: dict[str, str] = {}
    for item in bytes(data).decode("utf-8", "replace").split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            out[name] = value
    return out


@functools.lru_cache(maxsize=65536)
def tags_hash(tags: str | None) -> int:
    """Java's ``String.hashCode`` of the tags, as RocketMQ stores it in the consume queue."""
    if not tags:
        return 0
    units = tags.encode("utf-16-be")
    h = 0
    for unit in struct.unpack(f">{len(units) // 2}H", units):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def split_tag_filter(expression: str | None) -> frozenset[str] | None:
    """RocketMQ's subscription expression: ``*`` (or empty) for all, else ``a || b``."""
    if expression is None:
        return None
    expression = expression.strip()
    if expression in ("", "*"):
        return None
    return frozenset(t.strip() for t in expression.split("||") if t.strip())


def offset_msg_id(store_host: bytes, physical_offset: int) -> str:
    """RocketMQ's offsetMsgId: store host (ip + port) then the commit-log offset, in hex."""
    return (store_host + physical_offset.to_bytes(8, "big")).hex().upper()


def parse_offset_msg_id(msg_id: str) -> int:
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError as exc:
        raise FerryError("INVALID_REQUEST", f"{msg_id!r} is not a message id") from exc
    if len(raw) != 16:
        raise FerryError("INVALID_REQUEST", f"{msg_id!r} is not a message id")
    return int.from_bytes(raw[8:], "big")


@dataclass(slots=True)
class Message:
    """A message on its way in: what a producer gives, before the store assigns offsets."""

    topic: str
    body: bytes
    queue_id: int = -1
    flag: int = 0
    properties: dict[str, str] = field(default_factory=dict)
    sysflag: int = 0
    born_timestamp: int = 0
    born_host: bytes = b"\x00" * 8
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return raw.split(KEY_SEPARATOR) if raw else []


@dataclass(slots=True)
class StoredMessage:
    """A message as the commit log holds it, decoded."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    body: bytes
    properties: dict[str, str]
    flag: int
    sysflag: int
    born_timestamp: int
    born_host: bytes
    store_timestamp: int
    store_host: bytes
    reconsume_times: int
    prepared_transaction_offset: int
    body_crc: int

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self.store_host, self.physical_offset)

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return raw.split(KEY_SEPARATOR) if raw else []
