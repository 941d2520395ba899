"""The commit-log record codec: one self-describing record per message, as RocketMQ's CommitLog.

Layout (big-endian, as RocketMQ's MessageDecoder, v1 hosts):

    TOTALSIZE i32 | MAGICCODE i32 | BODYCRC i32 | QUEUEID i32 | FLAG i32 | QUEUEOFFSET i64 |
    PHYSICALOFFSET i64 | SYSFLAG i32 | BORNTIMESTAMP i64 | BORNHOST 8 (ipv4, port) |
    STORETIMESTAMP i64 | STOREHOST 8 | RECONSUMETIMES i32 | PREPAREDTRANSACTIONOFFSET i64 |
    BODYLENGTH i32 | BODY | TOPICLENGTH u8 | TOPIC | PROPERTIESLENGTH i16 | PROPERTIES

A segment that cannot hold the next record ends with an END_OF_FILE blank: TOTALSIZE (the rest of
the segment) then BLANK_MAGIC_CODE. Because every record names its own physical offset, recovery can
tell a live record from stale bytes and re-synchronise after a damaged one.
"""

from __future__ import annotations

import socket
import struct
import zlib

from ferrymq.common.message import StoredMessage, decode_properties

MESSAGE_MAGIC_CODE = -626843481  # 0xDAA320A7, RocketMQ's MESSAGE_MAGIC_CODE (v1)
BLANK_MAGIC_CODE = -875286124  # 0xCBD43194, END_OF_FILE padding
# Our own addition: a range that recovery found damaged and fenced off; readers skip it.
CORRUPT_MAGIC_CODE = -1091568914  # 0xBEEFCAEE
END_FILE_MIN_BLANK_LENGTH = 8

HEADER = struct.Struct(">iiiiiqqiq8sq8siq")
HEADER_SIZE = HEADER.size  # 84
# The header and BODYLENGTH: everything in front of the body, packed with one call when encoding.
PREFIX = struct.Struct(">iiiiiqqiq8sq8siqi")
PREFIX_SIZE = PREFIX.size  # 88
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_BLANK = struct.Struct(">ii")
FIXED_OVERHEAD = HEADER_SIZE + 4 + 1 + 2  # 91 bytes besides body, topic and properties
MAX_RECORD_SIZE = 64 * 1024 * 1024

MAGIC_BYTES = _I32.pack(MESSAGE_MAGIC_CODE)

# field offsets inside the header, for cheap peeks
OFF_TOTAL_SIZE = 0
OFF_MAGIC = 4
OFF_QUEUE_ID = 12
OFF_QUEUE_OFFSET = 20
OFF_PHYSICAL_OFFSET = 28
OFF_STORE_TIMESTAMP = 56


def body_crc(body: bytes | memoryview) -> int:
    # RocketMQ's UtilAll.crc32 masks the sign bit so the value fits a positive int.
    return zlib.crc32(body) & 0x7FFFFFFF


def record_size(body_len: int, topic_len: int, props_len: int) -> int:
    return FIXED_OVERHEAD + body_len + topic_len + props_len


def host_bytes(host: str, port: int) -> bytes:
    try:
        ip = socket.inet_aton(host)
    except OSError:
        ip = b"\x00\x00\x00\x00"
    return ip + struct.pack(">i", port)


def host_str(raw: bytes) -> str:
    return f"{socket.inet_ntoa(raw[:4])}:{struct.unpack('>i', raw[4:8])[0]}"


def tail(topic: bytes, properties: bytes) -> bytes:
    """What follows the body: TOPICLENGTH, TOPIC, PROPERTIESLENGTH, PROPERTIES. Messages of one batch
    usually share it, so the batch encoder builds it once per distinct (topic, properties)."""
    return bytes((len(topic),)) + topic + _I16.pack(len(properties)) + properties


def encode_into(
    buf: bytearray,
    pos: int,
    *,
    queue_id: int,
    flag: int,
    queue_offset: int,
    physical_offset: int,
    sysflag: int,
    born_timestamp: int,
    born_host: bytes,
    store_timestamp: int,
    store_host: bytes,
    reconsume_times: int,
    prepared_transaction_offset: int,
    body: bytes,
    body_crc32: int,
    topic: bytes,
    properties: bytes,
) -> int:
    """Write one record into ``buf`` at ``pos``; ``buf`` must already be long enough. (The commit log
    encodes whole batches with PREFIX and ``tail`` directly; this is the one-record form.)"""
    blen = len(body)
    end = tail(topic, properties)
    total = PREFIX_SIZE + blen + len(end)
    PREFIX.pack_into(
        buf,
        pos,
        total,
        MESSAGE_MAGIC_CODE,
        body_crc32,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sysflag,
        born_timestamp,
        born_host,
        store_timestamp,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        blen,
    )
    p = pos + PREFIX_SIZE
    buf[p : p + blen] = body
    buf[p + blen : pos + total] = end
    return total


def encode_blank(size: int) -> bytes:
    return _BLANK.pack(size, BLANK_MAGIC_CODE) + bytes(size - END_FILE_MIN_BLANK_LENGTH)


def encode_corrupt_marker(size: int) -> bytes:
    return _BLANK.pack(size, CORRUPT_MAGIC_CODE) + bytes(size - END_FILE_MIN_BLANK_LENGTH)


class RecordError(ValueError):
    """The bytes at a position are not a valid record."""


def peek_size_magic(buf: bytes | memoryview, pos: int = 0) -> tuple[int, int]:
    return _BLANK.unpack_from(buf, pos)


def check_record(buf: bytes | memoryview, pos: int, expected_physical_offset: int | None = None) -> int:
    """Validate the record at ``pos`` completely (sizes, magic, offset, CRC); return its size.

    Raises RecordError naming what is wrong. ``buf`` must contain the whole record.
    """
    avail = len(buf) - pos
    if avail < FIXED_OVERHEAD:
        raise RecordError(f"only {avail} bytes left, a record needs at least {FIXED_OVERHEAD}")
    total, magic = _BLANK.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordError(f"bad magic code {magic:#x}")
    if total < FIXED_OVERHEAD or total > avail or total > MAX_RECORD_SIZE:
        raise RecordError(f"bad total size {total}")
    if expected_physical_offset is not None:
        (phys,) = struct.unpack_from(">q", buf, pos + OFF_PHYSICAL_OFFSET)
        if phys != expected_physical_offset:
            raise RecordError(f"record names offset {phys}, found at {expected_physical_offset}")
    p = pos + HEADER_SIZE
    (blen,) = _I32.unpack_from(buf, p)
    if blen < 0 or HEADER_SIZE + 4 + blen + 3 > total:
        raise RecordError(f"bad body length {blen}")
    p += 4 + blen
    tlen = buf[p]
    p += 1 + tlen
    if p + 2 - pos > total:
        raise RecordError(f"bad topic length {tlen}")
    (plen,) = _I16.unpack_from(buf, p)
    if plen < 0 or FIXED_OVERHEAD + blen + tlen + plen != total:
        raise RecordError(f"bad properties length {plen}")
    (crc,) = _I32.unpack_from(buf, pos + 8)
    body = buf[pos + HEADER_SIZE + 4 : pos + HEADER_SIZE + 4 + blen]
    if body_crc(body) != crc:
        raise RecordError("body CRC mismatch")
    return total


def decode(buf: bytes | memoryview, pos: int = 0, *, verify: bool = True) -> StoredMessage:
    """Decode the record at ``pos``; with ``verify`` (the default) a damaged record raises RecordError."""
    if verify:
        check_record(buf, pos)
    (
        total,
        _magic,
        crc,
        queue_id,
        flag,
        queue_offset,
        physical_offset,
        sysflag,
        born_ts,
        born_host,
        store_ts,
        store_host,
        reconsume,
        prepared,
    ) = HEADER.unpack_from(buf, pos)
    p = pos + HEADER_SIZE
    (blen,) = _I32.unpack_from(buf, p)
    p += 4
    body = bytes(buf[p : p + blen])
    p += blen
    tlen = buf[p]
    p += 1
    topic = bytes(buf[p : p + tlen]).decode("utf-8", "replace")
    p += tlen
    (plen,) = _I16.unpack_from(buf, p)
    p += 2
    props = decode_properties(buf[p : p + plen])
    return StoredMessage(
        topic=topic,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=physical_offset,
        size=total,
        body=body,
        properties=props,
        flag=flag,
        sysflag=sysflag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
    )


def dispatch_fields(buf: bytes | memoryview, pos: int) -> tuple[int, int, int, int, str, bytes, int]:
    """What the dispatcher needs from a valid record: (size, queue id, queue offset, store ts, topic,
    properties bytes, sysflag), without copying the body."""
    total, _m, _c, queue_id, _f, queue_offset, _p, sysflag, _b, _bh, store_ts = struct.unpack_from(
        ">iiiiiqqiq8sq", buf, pos
    )
    p = pos + HEADER_SIZE
    (blen,) = _I32.unpack_from(buf, p)
    p += 4 + blen
    tlen = buf[p]
    topic = bytes(buf[p + 1 : p + 1 + tlen]).decode("utf-8", "replace")
    p += 1 + tlen
    (plen,) = _I16.unpack_from(buf, p)
    props = bytes(buf[p + 2 : p + 2 + plen])
    return total, queue_id, queue_offset, store_ts, topic, props, sysflag
