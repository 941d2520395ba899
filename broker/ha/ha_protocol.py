"""Frames of the replication link between a master and its slaves.

A frame is ``u32 length | u32 header length | msgpack header | payload``. Slave → master: ``hello``
(its brokerId, epoch entries, max offset) then ``ack`` (its max offset). Master → slave: ``welcome``
(where to truncate to, the master's epochs) then ``data`` frames (epoch, start offset, the master's
confirm offset, and whole commit-log records as payload; a frame never spans two epochs; an empty
payload just carries the confirm offset).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgpack

MAX_FRAME = 64 * 1024 * 1024
_HEAD = struct.Struct(">II")


class HAProtocolError(Exception):
    pass


def encode(header: dict[str, Any], payload: bytes | memoryview = b"") -> list[bytes | memoryview]:
    h = msgpack.packb(header)
    return [_HEAD.pack(4 + len(h) + len(payload), len(h)), h, payload]


async def send(writer: asyncio.StreamWriter, header: dict[str, Any], payload: bytes | memoryview = b"") -> None:
    writer.writelines(encode(header, payload))
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    head = await reader.readexactly(_HEAD.size)
    total, hlen = _HEAD.unpack(head)
    if total > MAX_FRAME or hlen + 4 > total:
        raise HAProtocolError(f"bad frame lengths {total}/{hlen}")
    body = await reader.readexactly(total - 4)
    try:
        header = msgpack.unpackb(body[:hlen])
    except Exception as exc:
        raise HAProtocolError(f"bad frame header: {exc}") from exc
    if not isinstance(header, dict) or "t" not in header:
        raise HAProtocolError("frame header is not a typed map")
    return header, body[hlen:]
