"""The TCP frame codec, shared by the broker and the client.

A frame (big-endian), as RocketMQ's RemotingCommand:

    LENGTH u32 (bytes after this field) | HEADER_LENGTH u32 | HEADER (msgpack) | BODY (raw bytes)

HEADER is the msgpack array ``[code, opaque, flags, ext, remark]``: ``code`` is a request code, or in
a response the response code (0 = success); ``opaque`` matches a response to its request, so many
requests can be in flight on one connection; ``flags`` bit 0 marks a response, bit 1 a oneway request
(no response); ``ext`` is a map of named header fields (or nil); ``remark`` a human message (or nil).
An array rather than a map keeps the header small and quick to pack; docs/protocol.md has the rules.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_packb = msgpack.Packer(use_bin_type=True).pack
_LARGE_FRAME = 256 * 1024


class FrameError(ValueError):
    """Bytes that are not a valid frame; the connection cannot be trusted past them."""


@dataclass(slots=True)
class Command:
    code: int
    opaque: int
    flags: int = 0
    ext: dict[str, Any] = field(default_factory=dict)
    remark: str | None = None
    body: bytes = b""

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)


def encode_frame(code: int, opaque: int, flags: int = 0, ext: dict[str, Any] | None = None,
                 remark: str | None = None, body: bytes | bytearray | memoryview = b"") -> bytes:
    header = _packb([code, opaque, flags, ext, remark])
    return b"".join((_U32X2.pack(4 + len(header) + len(body), len(header)), header, body))


def _header(raw: bytes) -> tuple[int, int, int, dict[str, Any], str | None]:
    try:
        h = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise FrameError(f"header is not valid msgpack: {type(exc).__name__}") from exc
    if not isinstance(h, list | tuple) or len(h) != 5:
        raise FrameError("header must be the array [code, opaque, flags, ext, remark]")
    code, opaque, flags, ext, remark = h
    for name, v in (("code", code), ("opaque", opaque), ("flags", flags)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise FrameError(f"header {name} must be an integer")
    if ext is None:
        ext = {}
    elif not isinstance(ext, dict) or not all(isinstance(k, str) for k in ext):
        raise FrameError("header ext must be a map with string keys")
    if remark is not None and not isinstance(remark, str):
        raise FrameError("header remark must be a string")
    return code, opaque, flags, ext, remark


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole frames back."""

    __slots__ = ("buf", "chunks", "max_frame", "need", "pending")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.buf = bytearray()
        self.max_frame = max_frame
        # A large frame (a pull answer of a megabyte) arrives in many reads: its pieces are kept as they
        # came and joined once, when ``need`` bytes are there, instead of growing ``buf`` read by read.
        self.chunks: list[bytes] = []
        self.pending = 0
        self.need = 0

    def feed(self, data: bytes) -> list[Command]:
        if self.need:
            self.chunks.append(data)
            self.pending += len(data)
            if self.pending < self.need:
                return []
            data = b"".join(self.chunks)
            self.chunks.clear()
            self.pending = self.need = 0
        buf = self.buf
        # Usually the buffer is empty and ``data`` holds whole frames: parse them in place rather than
        # copying everything through the buffer (a body is then sliced out once, not three times).
        src: bytes | bytearray
        if buf:
            buf += data
            src = buf
        else:
            src = data
        view = memoryview(src)
        out: list[Command] = []
        pos = 0
        n = len(src)
        try:
            while n - pos >= 8:
                length, hlen = _U32X2.unpack_from(src, pos)
                if length < 4 or length > self.max_frame:
                    raise FrameError(f"frame length {length} is outside [4, {self.max_frame}]")
                if hlen > length - 4:
                    raise FrameError(f"header length {hlen} exceeds the frame length {length}")
                end = pos + 4 + length
                if end > n:
                    if end - pos > _LARGE_FRAME:
                        self.need = end - pos  # the rest of this frame goes to ``chunks``
                    break
                hstart = pos + 8
                code, opaque, flags, ext, remark = _header(view[hstart:hstart + hlen])
                out.append(Command(code, opaque, flags, ext, remark, bytes(view[hstart + hlen:end])))
                pos = end
        finally:
            view.release()  # the buffer may be resized below (and by the next feed)
        if self.need:
            rest = src[pos:] if pos else src
            self.chunks.append(bytes(rest) if src is buf else rest)
            self.pending = len(rest)
            buf.clear()
        elif src is buf:
            if pos:
                del buf[:pos]
        elif pos < n:
            buf += data[pos:] if pos else data
        return out
