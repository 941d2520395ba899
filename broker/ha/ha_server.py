"""Master side of replication: one streaming task per connected slave.

Handshake: the slave sends its epoch entries and max offset; the master answers with the offset the
slave must truncate to (the end of their shared history, see epoch_file.consistent_offset) or a full
reset when they share none. Then the master streams its commit log from there in batches of at most
haTransferBatchSize bytes of whole records, never across an epoch boundary, back-pressured by the
socket (``drain``), and records the slave's acks in the SyncStateTracker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ferrymq.broker.ha import ha_protocol as proto
from ferrymq.broker.ha.epoch_file import EpochFile, consistent_offset
from ferrymq.common import record

if TYPE_CHECKING:
    from ferrymq.broker.ha.sync_state import SyncStateTracker
    from ferrymq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL = 1.0


class HAServer:
    def __init__(self, store: MessageStore, epochs: EpochFile, host: str, port: int, batch_size: int,
                 on_ack: Callable[[int, int], None], on_disconnect: Callable[[int], None],
                 topic_version: Callable[[], int] | None = None,
                 topic_configs: Callable[[], dict] | None = None) -> None:
        self.store = store
        self.epochs = epochs
        self.host = host
        self.port = port
        self.batch_size = batch_size
        self.on_ack = on_ack
        self.on_disconnect = on_disconnect
        # Topic configs go to slaves as soon as their version changes, so a topic created just before a
        # failover exists on the new master (the periodic slave sync is the fallback). The version is
        # checked on every loop turn; the configs are only built when it moved.
        self.topic_version = topic_version
        self.topic_configs = topic_configs
        self.tracker: SyncStateTracker | None = None  # set while this replica is master
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._wakeups: set[asyncio.Event] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    def notify_data(self) -> None:
        """New bytes were appended or the confirm offset moved: wake the streaming tasks."""
        for wake in self._wakeups:
            wake.set()

    def serving(self) -> bool:
        return self.tracker is not None

    def close_connections(self) -> None:
        for t in list(self._conns):
            t.cancel()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.close_connections()
        for t in list(self._conns):
            with contextlib.suppress(BaseException):
                await t
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        broker_id = -1
        try:
            hello, _ = await asyncio.wait_for(proto.receive(reader), 10)
            if hello.get("t") != "hello" or not isinstance(hello.get("brokerId"), int):
                raise proto.HAProtocolError("expected hello")
            broker_id = hello["brokerId"]
            if not self.serving():
                await proto.send(writer, {"t": "error", "code": "NOT_MASTER",
                                          "message": "this replica is not the master"})
                return
            start = self._agree(hello)
            await proto.send(writer, {"t": "welcome", "startOffset": start[0], "reset": start[1],
                                      "epochs": [[e.epoch, e.start_offset] for e in self.epochs.entries]})
            log.info("slave %d joined at offset %d%s", broker_id, start[0], " (full reset)" if start[1] else "")
            acks = asyncio.create_task(self._read_acks(reader, broker_id))
            try:
                await self._stream(writer, start[0], acks, broker_id)
            finally:
                acks.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, proto.HAProtocolError) as exc:
            log.info("replication link to slave %d closed: %s", broker_id, exc or type(exc).__name__)
        except asyncio.CancelledError:
            pass  # this replica stopped being master, or is shutting down
        finally:
            if broker_id >= 0:
                self.on_disconnect(broker_id)
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _agree(self, hello: dict) -> tuple[int, bool]:
        from ferrymq.broker.ha.epoch_file import EpochEntry

        slave_entries = [EpochEntry(int(e), int(s)) for e, s in hello.get("epochs", [])]
        slave_max = int(hello.get("maxOffset", 0))
        mine = self.epochs.entries
        master_max = self.store.commitlog.max_offset
        log_min = self.store.commitlog.min_offset
        if not slave_entries:
            # An empty replica (or one that never had data) starts from our first byte.
            if slave_max == 0 and log_min == 0:
                return 0, False
            return log_min, True
        point = consistent_offset(mine, master_max, slave_entries, slave_max)
        if point is None or point < log_min:
            return log_min, True
        return point, False

    async def _read_acks(self, reader: asyncio.StreamReader, broker_id: int) -> None:
        while True:
            header, _ = await proto.receive(reader)
            if header.get("t") == "ack":
                self.on_ack(broker_id, int(header["offset"]))

    async def _stream(self, writer: asyncio.StreamWriter, offset: int, acks: asyncio.Task[None],
                      broker_id: int) -> None:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()  # one per link: a shared one could be cleared under another link's feet
        self._wakeups.add(wake)
        try:
            await self._stream_loop(writer, offset, acks, broker_id, wake, loop)
        finally:
            self._wakeups.discard(wake)
        if acks.done() and not acks.cancelled() and acks.exception() is not None:
            raise acks.exception()  # type: ignore[misc]

    async def _stream_loop(self, writer: asyncio.StreamWriter, offset: int, acks: asyncio.Task[None],
                           broker_id: int, wake: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
        sent_confirm = -1
        sent_topics = -1
        last_sent = 0.0
        while not acks.done() and self.tracker is not None:
            wake.clear()  # before looking: whatever arrives from here on sets it again
            tracker = self.tracker
            if self.topic_version is not None and self.topic_configs is not None:
                version = self.topic_version()
                if version != sent_topics:
                    await proto.send(writer, {"t": "topics", "version": version, "topics": self.topic_configs()})
                    sent_topics = version
            end = self.store.commitlog.max_offset
            if offset < end:
                epoch, limit = self._epoch_at(offset)
                data = await loop.run_in_executor(None, self._read_batch, offset, min(end, limit))
                if not data:
                    raise proto.HAProtocolError(f"nothing readable at {offset} (log {end})")
                confirm = tracker.confirm_offset
                tracker.on_transfer(broker_id, end)
                await proto.send(writer, {"t": "data", "epoch": epoch, "offset": offset, "confirm": confirm}, data)
                sent_confirm, last_sent = confirm, loop.time()
                offset += len(data)
                continue
            confirm = tracker.confirm_offset
            # An empty frame carries a new confirm offset, and doubles as a heartbeat when idle: the
            # slave acks it, which is how the master knows an idle slave is still caught up.
            if confirm != sent_confirm or loop.time() - last_sent >= HEARTBEAT_INTERVAL:
                tracker.on_transfer(broker_id, end)
                await proto.send(writer, {"t": "data", "epoch": self.epochs.last_epoch, "offset": offset,
                                          "confirm": confirm})
                sent_confirm, last_sent = confirm, loop.time()
                continue
            waiter = asyncio.ensure_future(wake.wait())
            await asyncio.wait({waiter, acks}, timeout=max(0.0, HEARTBEAT_INTERVAL - (loop.time() - last_sent)),
                               return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()

    def _epoch_at(self, offset: int) -> tuple[int, int]:
        """The epoch that wrote ``offset`` and where the next one starts (a batch must stop there)."""
        entries = self.epochs.entries
        epoch, limit = (entries[-1].epoch if entries else 0), 1 << 62
        for i, e in enumerate(entries):
            if e.start_offset <= offset:
                epoch = e.epoch
                limit = entries[i + 1].start_offset if i + 1 < len(entries) else 1 << 62
        return epoch, limit

    def _read_batch(self, offset: int, end: int) -> bytes:
        """Whole records from ``offset``: up to batch_size bytes, or one record if it is larger."""
        files = self.store.commitlog.files
        want = min(self.batch_size, end - offset)
        data = files.pread(offset, want)
        p = 0
        while p + record.END_FILE_MIN_BLANK_LENGTH <= len(data):
            size, _magic = record.peek_size_magic(data, p)
            if size <= 0:
                break
            if p + size > len(data):
                if p == 0:  # a single record (or blank) larger than the batch
                    return files.pread(offset, min(size, end - offset))
                break
            p += size
        return data[:p]
