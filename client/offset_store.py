"""Where a consumer keeps its progress: on the broker (clustering, RocketMQ's RemoteBrokerOffsetStore)
or with the client (broadcasting, LocalFileOffsetStore).

Updates land in memory; ``persist`` pushes them out (in the background and on shutdown).
An offset is "the next offset to consume": everything below it is done.

On the broker, offsets live with each group's master (a slave's copy is overwritten by its master's at
every sync). While a group has no master (a failover) commits cannot land anywhere that lasts, so
they stay here, pending, and go to the master once there is one again; meanwhile reads of the
committed offset are answered from a slave's copy, or from the pending value when there is one.
``persist`` without a list commits every offset it knows (RocketMQ's persistAll), not only the
changed ones: a newly elected master copied its offsets from the old one up to a few seconds before
the failover, and this brings it up to date.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

from ferrymq.client.errors import BrokerError, ClientError, RemotingError
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import MessageQueue

log = logging.getLogger(__name__)
# Codes (besides connection failures) meaning "no master can take this commit now; try again later".
NO_MASTER_NOW_CODES = frozenset({"SERVICE_NOT_AVAILABLE", "SYSTEM_BUSY"})


def no_master_now(exc: BaseException) -> bool:
    """The commit failed because of where it went (no master, unreachable), not because of what it is."""
    return isinstance(exc, RemotingError) or (isinstance(exc, BrokerError) and exc.code in NO_MASTER_NOW_CODES)


class OffsetStore:
    def __init__(self) -> None:
        self.offsets: dict[MessageQueue, int] = {}
        self._dirty: set[MessageQueue] = set()

    def update(self, mq: MessageQueue, offset: int, *, only_increase: bool = True) -> None:
        cur = self.offsets.get(mq, -1)
        if not only_increase or offset > cur:
            self.offsets[mq] = offset
            self._dirty.add(mq)

    def memory(self, mq: MessageQueue) -> int:
        return self.offsets.get(mq, -1)

    async def read(self, mq: MessageQueue) -> int:
        """The stored offset, or -1 when there is none."""
        raise NotImplementedError

    async def persist(self, mqs: list[MessageQueue] | None = None) -> None:
        raise NotImplementedError

    def remove(self, mq: MessageQueue) -> None:
        self.offsets.pop(mq, None)
        self._dirty.discard(mq)


class RemoteOffsetStore(OffsetStore):
    def __init__(self, instance: ClientInstance, group: str) -> None:
        super().__init__()
        self.instance = instance
        self.group = group

    def pending(self) -> list[MessageQueue]:
        """Queues whose latest offset has not reached a master yet."""
        return sorted(self._dirty)

    async def read(self, mq: MessageQueue) -> int:
        if mq in self._dirty:
            return self.offsets[mq]  # newer than anything a broker has
        off = await self.instance.query_offset(self.group, mq)
        if off >= 0:
            self.offsets[mq] = off
        return off

    async def commit(self, mq: MessageQueue, offset: int) -> bool:
        """Commit now. True when a master took it; False when none could (it stays pending and goes
        out with the next ``persist``); the broker's refusal of the offset itself is raised."""
        before = self.offsets.get(mq)
        self.update(mq, offset, only_increase=False)
        try:
            await self.instance.update_offset(self.group, mq, offset)
        except ClientError as exc:
            if no_master_now(exc):
                log.debug("no master took offset %d of %s now; kept until one does: %s", offset, mq, exc)
                return False
            if before is None:
                self.offsets.pop(mq, None)
            else:
                self.offsets[mq] = before
            self._dirty.discard(mq)
            raise
        if self.offsets.get(mq) == offset:
            self._dirty.discard(mq)
        return True

    async def persist(self, mqs: list[MessageQueue] | None = None) -> None:
        todo = [mq for mq in (list(self.offsets) if mqs is None else mqs) if mq in self.offsets]
        sent = {mq: self.offsets[mq] for mq in todo}
        results = await asyncio.gather(*(self.instance.update_offset(self.group, mq, off) for mq, off in sent.items()),
                                       return_exceptions=True)
        for (mq, off), r in zip(sent.items(), results, strict=True):
            if isinstance(r, asyncio.CancelledError):
                raise r
            if not isinstance(r, BaseException):
                if self.offsets.get(mq) == off:
                    self._dirty.discard(mq)
            elif no_master_now(r):
                log.debug("committing offset %d of %s must wait for a master: %s", off, mq, r)
            else:
                log.warning("committing offset %d of %s failed: %s", off, mq, r)


class LocalOffsetStore(OffsetStore):
    """Broadcasting: each member has its own progress. With ``path`` it survives restarts (a JSON file
    written and renamed atomically); without, it lives in memory only."""

    def __init__(self, path: Path | None) -> None:
        super().__init__()
        self.path = path
        self._loaded: dict[str, int] = {}
        if path is not None and path.exists():
            with contextlib.suppress(OSError, ValueError):
                self._loaded = {k: int(v) for k, v in json.loads(path.read_text()).items()}

    @staticmethod
    def _key(mq: MessageQueue) -> str:
        return f"{mq.topic}/{mq.broker_group}/{mq.queue_id}"

    async def read(self, mq: MessageQueue) -> int:
        off = self.offsets.get(mq, self._loaded.get(self._key(mq), -1))
        if off >= 0:
            self.offsets[mq] = off
        return off

    async def persist(self, mqs: list[MessageQueue] | None = None) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty.clear()
        data = {**self._loaded, **{self._key(mq): off for mq, off in self.offsets.items()}}
        try:
            await asyncio.to_thread(_write_atomic, self.path, json.dumps(data, sort_keys=True).encode())
        except OSError as exc:
            raise ClientError("SYSTEM_ERROR", f"cannot write offsets to {self.path}: {exc}") from exc


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
