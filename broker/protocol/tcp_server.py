"""The broker's TCP server: frames in, handlers run concurrently, responses out matched by opaque.

One asyncio.Protocol per connection (cheaper than streams on the hot path). Each connection may have
at most ``serverMaxInflightRequestsPerChannel`` requests running; past that a request is answered at
once with SYSTEM_BUSY, so a flooding client cannot make the broker queue unbounded work. When the
socket's send buffer fills, the connection stops reading until it drains. A connection with nothing
in flight and no traffic for ``serverChannelMaxIdleTimeSeconds`` is closed, and the client
registrations that came over it are dropped (RocketMQ's NettyServer idle handler +
ClientHousekeepingService). Bytes that are not a frame close the connection: past them the stream
cannot be trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from ferrymq.broker.protocol.request_codes import RequestCode, response_code
from ferrymq.broker.protocol.tcp_codec import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    Command,
    FrameDecoder,
    FrameError,
    encode_frame,
)
from ferrymq.broker.services.consumer_groups import ConsumerGroupService
from ferrymq.common.errors import FerryError

log = logging.getLogger(__name__)

Reply = tuple[dict[str, Any] | None, bytes]
Handler = Callable[["TcpConnection", Command], Awaitable[Reply]]


def error_frame(opaque: int, err: FerryError) -> bytes:
    ext: dict[str, Any] = {"error": err.code}
    for k, v in err.details.items():
        if isinstance(v, str | int | float | bool) or v is None:
            ext[k] = v
    return encode_frame(response_code(err.code), opaque, FLAG_RESPONSE, ext, err.message)


class TcpConnection(asyncio.Protocol):
    def __init__(self, server: TcpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(server.max_frame)
        self.inflight = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.last_active = time.monotonic()
        self.remote = "?"
        self.closed = False
        self._notify_opaque = 0
        self._out: list[bytes] = []
        self._eof = False

    # ---- asyncio.Protocol -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.remote = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            log.info("closing %s: %s", self.remote, exc)
            self.close()
            return
        for cmd in frames:
            if cmd.is_response:
                continue  # answers to our oneway notifications never come; ignore strays
            self._dispatch(cmd)

    def eof_received(self) -> bool:
        # A client that half-closes still gets the answers to what it sent before its EOF: the
        # connection stays open for writing until they are out (see _flush_out).
        self._eof = True
        return self.inflight > 0 or bool(self._out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for t in self.tasks:
            t.cancel()
        self.server.groups.channel_closed(self)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # ---- requests -------------------------------------------------------------------------------------
    def _dispatch(self, cmd: Command) -> None:
        oneway = cmd.is_oneway
        handler = self.server.handlers.get(cmd.code)
        if handler is None:
            if not oneway:
                self.write(error_frame(cmd.opaque, FerryError(
                    "REQUEST_CODE_NOT_SUPPORTED", f"request code {cmd.code} is not supported")))
            return
        if self.inflight >= self.server.max_inflight:
            if not oneway:
                self.write(error_frame(cmd.opaque, FerryError(
                    "SYSTEM_BUSY", f"too many requests in flight on this connection "
                                   f"(limit {self.server.max_inflight}); retry later")))
            return
        self.inflight += 1
        task = asyncio.get_running_loop().create_task(self._run(handler, cmd))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, handler: Handler, cmd: Command) -> None:
        try:
            ext, body = await handler(self, cmd)
            frame = encode_frame(0, cmd.opaque, FLAG_RESPONSE, ext, None, body)
        except FerryError as err:
            frame = error_frame(cmd.opaque, err)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("request %s from %s failed", cmd.code, self.remote)
            frame = error_frame(cmd.opaque, FerryError("SYSTEM_ERROR", f"internal error: {type(exc).__name__}"))
        finally:
            self.inflight -= 1
            self.last_active = time.monotonic()
        if not cmd.is_oneway:
            self.write(frame)
        elif self._eof and self.inflight == 0 and not self._out:
            self.close()

    def write(self, frame: bytes) -> None:
        """Queue a frame; everything queued in one loop iteration goes out in one send() call (a
        group commit answers dozens of requests at once, and a syscall each would dominate)."""
        if self.transport is None or self.closed:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush_out)
        self._out.append(frame)

    def _flush_out(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.closed and out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))
            if self._eof and self.inflight == 0:
                self.close()  # after the client's EOF, once the last answer is written

    # ---- ClientChannel ----------------------------------------------------------------------------------
    def notify_consumer_ids_changed(self, group: str) -> None:
        self._notify_opaque += 1
        self.write(encode_frame(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._notify_opaque, FLAG_ONEWAY,
                                {"consumerGroup": group}))

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()


class TcpServer:
    def __init__(self, handlers: dict[int, Handler], groups: ConsumerGroupService, *, host: str, port: int,
                 max_inflight: int, max_frame: int, idle_timeout_s: float) -> None:
        self.handlers = handlers
        self.groups = groups
        self.host = host
        self.port = port
        self.max_inflight = max_inflight
        self.max_frame = max_frame
        self.idle_timeout = idle_timeout_s
        self.connections: set[TcpConnection] = set()
        self._server: asyncio.Server | None = None
        self._housekeeping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: TcpConnection(self), self.host, self.port,
                                                reuse_address=True, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        self._housekeeping = loop.create_task(self._housekeep())
        log.info("TCP protocol listening on %s:%d", self.host, self.port)

    async def _housekeep(self) -> None:
        interval = max(0.05, min(1.0, self.idle_timeout / 4, self.groups.channel_expired_timeout / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                now = time.monotonic()
                for conn in list(self.connections):
                    if conn.inflight == 0 and now - conn.last_active > self.idle_timeout:
                        log.info("closing %s: idle for more than %.0f s", conn.remote, self.idle_timeout)
                        conn.close()
                for ch in self.groups.scan_expired():
                    ch.close()
            except Exception:  # pragma: no cover - housekeeping must survive anything
                log.exception("TCP housekeeping failed")

    async def stop(self) -> None:
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        if self._server is not None:
            self._server.close()
            for conn in list(self.connections):
                conn.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None


def unpack_body(body: bytes) -> Any:
    """A msgpack request body; garbage is the client's error, not the broker's."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:
        raise FerryError("INVALID_REQUEST", f"the body is not valid msgpack: {type(exc).__name__}") from exc
