"""Durable progress of the system services (delay offsets, timer checkpoint, transaction scan).

A progress record says "everything up to here was delivered", and the deliveries are commit-log
records. So a record may reach disk only once the log is durable past the last record it vouches for:
under ASYNC_FLUSH a crash could otherwise lose a delivered message while its progress survives,
losing the message for good. Under SYNC_FLUSH the put has already waited for its fsync, so a snapshot
is written at once. Writes run in a thread and coalesce: only the newest eligible snapshot is written.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import logging
import threading
from pathlib import Path
from typing import Any

from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common.durable import read_json, write_json_atomic

log = logging.getLogger(__name__)
POLL_S = 0.02


async def cancel_tasks(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel background tasks and wait until each has finished unwinding."""
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await t


class DurableProgress:
    def __init__(self, path: Path, store: MessageStore) -> None:
        self.path = path
        self.store = store
        self._pending: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self._written: dict[str, Any] | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # A write cancelled at shutdown goes on in its thread; the final write must not race it.
        self._io_lock = threading.Lock()

    @property
    def written(self) -> dict[str, Any] | None:
        """The newest snapshot known to be on disk."""
        return self._written

    def load(self) -> dict[str, Any]:
        raw = read_json(self.path, {})
        state = raw if isinstance(raw, dict) else {}
        self._written = state
        return state

    def record(self, state: dict[str, Any], log_end: int) -> None:
        """Persist ``state`` once the commit log is durable up to ``log_end``."""
        self._pending.append((log_end, copy.deepcopy(state)))
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"progress:{self.path.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def write_final(self) -> None:
        """After the store's shutdown flushed everything: write the newest snapshot (blocking)."""
        if self._pending:
            _, state = self._pending[-1]
            self._pending.clear()
            if state != self._written:
                self._write(state)
                self._written = state

    def _write(self, state: dict[str, Any]) -> None:
        with self._io_lock:
            write_json_atomic(self.path, state)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                flushed = self.store.commitlog.files.flushed_offset
                newest: dict[str, Any] | None = None
                while self._pending and self._pending[0][0] <= flushed:
                    newest = self._pending.popleft()[1]
                if newest is None:
                    await asyncio.sleep(POLL_S)  # waiting for the flush thread to catch up
                    continue
                if newest == self._written:
                    continue
                try:
                    await asyncio.to_thread(self._write, newest)
                    self._written = newest
                except OSError:
                    log.exception("writing %s failed; retrying with the next progress", self.path)
