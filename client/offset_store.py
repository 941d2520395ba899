"""Where a consumer keeps its progress: on the broker (clustering, RocketMQ's RemoteBrokerOffsetStore)
or with the client (broadcasting, LocalFileOffsetStore).

Updates land in memory; ``persist`` pushes the changed ones out (in the background and on shutdown).
An offset is "the next offset to consume": everything below it is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from pathlib import Path

from ferrymq.client.errors import ClientError
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import MessageQueue

log = logging.getLogger(__name__)


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

    async def read(self, mq: MessageQueue) -> int:
        off = await self.instance.query_offset(self.group, mq)
        if off >= 0:
            self.offsets[mq] = off
        return off

    async def persist(self, mqs: list[MessageQueue] | None = None) -> None:
        todo = [mq for mq in (mqs if mqs is not None else list(self._dirty)) if mq in self._dirty]
        for mq in todo:
            self._dirty.discard(mq)
        results = await asyncio.gather(*(self.instance.update_offset(self.group, mq, self.offsets[mq])
                                         for mq in todo if mq in self.offsets), return_exceptions=True)
        for mq, r in zip(todo, results, strict=False):
            if isinstance(r, BaseException):
                self._dirty.add(mq)
                log.debug("committing offset of %s failed: %s", mq, r)


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
