"""The client side of the TCP protocol: one multiplexed connection per broker address.

Many requests share a connection, each waiting on a future keyed by its opaque (RocketMQ's
responseTable); a request that is not answered in time fails with RemotingTimeoutError and its late
answer is dropped. The broker may also send requests (NOTIFY_CONSUMER_IDS_CHANGED); they go to
``on_request``. A closed connection fails everything pending on it and is replaced on the next call.

Errors say whether the request may have reached the broker: RemotingConnectError means it was never
written (safe to send elsewhere); RemotingError / RemotingTimeoutError after writing mean the broker
may have acted on it. Addresses that fail either way are noted in ``health`` for a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from ferrymq.broker.protocol.request_codes import CODE_NAMES
from ferrymq.broker.protocol.tcp_codec import FLAG_ONEWAY, Command, FrameDecoder, FrameError, encode_frame
from ferrymq.client.errors import BrokerError, RemotingConnectError, RemotingError, RemotingTimeoutError
from ferrymq.client.fault import AddressHealth

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 3.0


class Connection(asyncio.Protocol):
    def __init__(self, address: str, on_request: Callable[[Connection, Command], None] | None) -> None:
        self.address = address
        self.on_request = on_request
        self.transport: asyncio.Transport | None = None
        # Kept from connection_made: asyncio.get_running_loop() costs a getpid() system call on every
        # call (CPython 3.11), three of them per request otherwise.
        self.loop: asyncio.AbstractEventLoop | None = None
        self.decoder = FrameDecoder()
        self.pending: dict[int, asyncio.Future[Command]] = {}
        self._opaque = itertools.count(1)
        self.closed = False
        self._out: list[bytes] = []
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.feed(data)
        except FrameError as exc:
            log.warning("bad frame from %s (%s); closing", self.address, exc)
            self.close()
            return
        for cmd in frames:
            if cmd.is_response:
                fut = self.pending.pop(cmd.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(cmd)
            elif self.on_request is not None:
                self.on_request(self, cmd)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        err = RemotingError(f"connection to {self.address} closed", address=self.address)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(err)
        self.pending.clear()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True

    async def request(self, code: int, ext: dict[str, Any] | None, body: bytes, timeout_s: float) -> Command:
        if not self._writable.is_set():
            await self._writable.wait()
        if self.closed or self.transport is None:
            # nothing was written: the caller may send it elsewhere as if it never left
            raise RemotingConnectError(f"connection to {self.address} closed", address=self.address)
        opaque = next(self._opaque)
        loop = self.loop
        assert loop is not None  # set with the transport
        fut: asyncio.Future[Command] = loop.create_future()
        self.pending[opaque] = fut
        self._write(encode_frame(code, opaque, 0, ext, None, body))
        timer = loop.call_later(timeout_s, self._expire, fut, code, timeout_s)
        try:
            return await fut
        finally:
            timer.cancel()
            self.pending.pop(opaque, None)

    def _expire(self, fut: asyncio.Future[Command], code: int, timeout_s: float) -> None:
        if not fut.done():
            fut.set_exception(RemotingTimeoutError(
                f"no answer from {self.address} within {timeout_s:.3g} s (request code {code})", address=self.address))

    def oneway(self, code: int, ext: dict[str, Any] | None, body: bytes = b"") -> None:
        if self.closed or self.transport is None:
            raise RemotingError(f"connection to {self.address} closed", address=self.address)
        self._write(encode_frame(code, next(self._opaque), FLAG_ONEWAY, ext, None, body))

    def _write(self, frame: bytes) -> None:
        # Frames queued in one loop iteration leave in one send() call: many concurrent requests on
        # one connection then cost one syscall, not one each.
        if not self._out:
            self.loop.call_soon(self._flush_out)  # type: ignore[union-attr]  # set with the transport
        self._out.append(frame)

    def _flush_out(self) -> None:
        out, self._out = self._out, []
        if self.transport is not None and not self.closed and out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))


def check_response(cmd: Command, address: str) -> Command:
    if cmd.code != 0:
        name = cmd.ext.get("error") if isinstance(cmd.ext.get("error"), str) else None
        name = name or CODE_NAMES.get(cmd.code, "SYSTEM_ERROR")
        details = {k: v for k, v in cmd.ext.items() if k not in ("error", "code", "message", "broker")}
        raise BrokerError(name, cmd.remark or name, broker=address, **details)
    return cmd


class RemotingClient:
    """Connections by address, opened on first use and re-opened after they close."""

    def __init__(self, on_request: Callable[[Connection, Command], None] | None = None,
                 on_connect: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.on_request = on_request
        self.on_connect = on_connect
        self.conns: dict[str, Connection] = {}
        self.health = AddressHealth()
        self._connecting: dict[str, asyncio.Future[Connection]] = {}
        self._background: set[asyncio.Task[None]] = set()

    async def connection(self, address: str) -> Connection:
        conn = self.conns.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[address] = fut
        try:
            conn = await self._open(address)
            self.conns[address] = conn
            self.health.ok(address)
            fut.set_result(conn)
        except BaseException as exc:
            if isinstance(exc, RemotingError):
                self.health.failed(address)
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: nobody else may be waiting
            raise
        finally:
            self._connecting.pop(address, None)
        if self.on_connect is not None:
            task = asyncio.get_running_loop().create_task(self.on_connect(address))
            self._background.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._background.discard)
        return conn

    async def _open(self, address: str) -> Connection:
        host, _, port = address.rpartition(":")
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: Connection(address, self.on_request), host, int(port)),
                CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise RemotingConnectError(f"cannot connect to {address}: {exc or type(exc).__name__}",
                                       address=address) from exc
        return proto

    async def invoke(self, address: str, code: int, ext: dict[str, Any] | None = None, body: bytes = b"",
                     timeout_s: float = 3.0) -> Command:
        conn = self.conns.get(address)
        if conn is None or conn.closed:
            conn = await self.connection(address)
        try:
            resp = await conn.request(code, ext, body, timeout_s)
        except RemotingError:
            self.health.failed(address)
            raise
        return check_response(resp, address)

    async def invoke_oneway(self, address: str, code: int, ext: dict[str, Any] | None = None,
                            body: bytes = b"") -> None:
        (await self.connection(address)).oneway(code, ext, body)

    def close_address(self, address: str) -> None:
        conn = self.conns.pop(address, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()
        self.conns.clear()
