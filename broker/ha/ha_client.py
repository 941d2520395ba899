"""Slave side of replication: connect to the master, agree on history, append what it streams.

After the handshake the slave truncates its log to the offset the master named (or resets it when
they share no history), adopts the master's epoch entries for that prefix, then appends each data
frame verbatim (records are CRC-checked first), records a new epoch entry when a frame starts a newer
epoch, dispatches its own consume queues up to the master's confirm offset, and acks its max offset
(after its own fsync when it runs SYNC_FLUSH).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ferrymq.broker.ha import ha_protocol as proto
from ferrymq.broker.ha.epoch_file import EpochEntry, EpochFile
from ferrymq.broker.store.message_store import append_replicated, reset_to, truncate_to
from ferrymq.common.errors import FerryError

if TYPE_CHECKING:
    from ferrymq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)


class HAClient:
    def __init__(self, store: MessageStore, epochs: EpochFile, broker_id: int, master_address: str,
                 master_epoch: int, on_topics: Callable[[dict], Awaitable[None]] | None = None) -> None:
        self.store = store
        self.epochs = epochs
        self.broker_id = broker_id
        self.master_address = master_address
        self.master_epoch = master_epoch
        self.on_topics = on_topics
        self.confirm_offset = 0
        self.connected = False
        self._task: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run_forever(), name=f"ha-client->{self.master_address}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    async def _run_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._run_once()
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except (OSError, asyncio.IncompleteReadError, proto.HAProtocolError, TimeoutError) as exc:
                log.info("replication from %s interrupted: %s", self.master_address, exc or type(exc).__name__)
            except Exception:
                log.exception("replication from %s failed", self.master_address)
            finally:
                self.connected = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    async def _run_once(self) -> None:
        host, _, port = self.master_address.rpartition(":")
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
        self._writer = writer
        try:
            await proto.send(writer, {
                "t": "hello", "brokerId": self.broker_id, "maxOffset": self.store.commitlog.max_offset,
                "epochs": [[e.epoch, e.start_offset] for e in self.epochs.entries],
            })
            welcome, _ = await asyncio.wait_for(proto.receive(reader), 10)
            if welcome.get("t") == "error":
                raise proto.HAProtocolError(f"master refused: {welcome.get('code')}: {welcome.get('message')}")
            if welcome.get("t") != "welcome":
                raise proto.HAProtocolError("expected welcome")
            await self._agree(welcome)
            self.connected = True
            await proto.send(writer, {"t": "ack", "offset": self.store.commitlog.max_offset})
            acker = _Acker(self, writer)
            while True:
                header, payload = await proto.receive(reader)
                if header.get("t") == "topics":
                    if self.on_topics is not None and isinstance(header.get("topics"), dict):
                        await self.on_topics(header["topics"])
                    continue
                if header.get("t") != "data":
                    raise proto.HAProtocolError(f"unexpected frame {header.get('t')!r}")
                await self._on_data(header, payload, acker)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _agree(self, welcome: dict) -> None:
        start = int(welcome["startOffset"])
        master_entries = [EpochEntry(int(e), int(s)) for e, s in welcome["epochs"]]
        if welcome.get("reset"):
            log.warning("no shared history with the master: resetting the log to start at %d", start)
            reset_to(self.store, start)
        elif start < self.store.commitlog.max_offset:
            log.warning("truncating the log from %d to %d to match the master",
                        self.store.commitlog.max_offset, start)
            # On the loop thread on purpose: truncation rewrites the in-memory dispatch state too, and
            # it happens once per role change (a few fdatasyncs).
            truncate_to(self.store, start)
        elif start > self.store.commitlog.max_offset:
            raise proto.HAProtocolError(f"master wants {start}, our log ends at {self.store.commitlog.max_offset}")
        self.epochs.replace([e for e in master_entries if e.start_offset < start])

    async def _on_data(self, header: dict, payload: bytes, acker: _Acker) -> None:
        offset = int(header["offset"])
        epoch = int(header["epoch"])
        end = self.store.commitlog.max_offset
        if payload:
            if offset != end:
                raise proto.HAProtocolError(f"data at {offset}, our log ends at {end}")
            if epoch > self.epochs.last_epoch:
                self.epochs.append(epoch, offset)
            append_replicated(self.store, offset, payload)
        self.confirm_offset = max(self.confirm_offset, int(header.get("confirm", 0)))
        self.store.redispatch()
        # Ack idle heartbeats too: the master counts a slave as caught up only when it hears that the
        # slave has everything, and without traffic that is the only thing it hears. Otherwise an idle
        # group would drop its slaves from the SyncStateSet after haMaxTimeSlaveNotCatchup.
        acker.ack(self.store.commitlog.max_offset)


class _Acker:
    """Acks the slave's max offset; under SYNC_FLUSH only after the slave's own fsync covers it.
    Waiting happens off the receive loop, so transfers keep flowing while the disk syncs."""

    def __init__(self, client: HAClient, writer: asyncio.StreamWriter) -> None:
        self.client = client
        self.writer = writer
        self._latest = 0
        self._task: asyncio.Task[None] | None = None

    def ack(self, offset: int) -> None:
        self._latest = max(self._latest, offset)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send())

    async def _send(self) -> None:
        sent = -1
        try:
            while self._latest != sent:
                target = self._latest
                await self.client.store.wait_durable(target)
                await proto.send(self.writer, {"t": "ack", "offset": target})
                sent = target
        except (OSError, FerryError) as exc:  # the link broke; the receive loop reconnects
            log.debug("ack to the master failed: %s", exc)
