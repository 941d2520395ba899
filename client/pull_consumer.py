"""The pull consumer (RocketMQ's DefaultMQPullConsumer): the application chooses queues and offsets
and pulls itself; the broker keeps the group's committed offsets on request.

Through a failover pulls go to a slave of the group, and a commit that no master can take is kept
and committed in the background (every ``auto_commit_interval``, and at shutdown) once one can."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ferrymq.client.errors import ClientError, ClientStateError, client_checked
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import MessageQueue, PullResult
from ferrymq.client.offset_store import RemoteOffsetStore
from ferrymq.common.limits import check_group

log = logging.getLogger(__name__)


class AsyncPullConsumer:
    def __init__(self, url: str, group: str, *, auto_commit_interval: float = 5.0,
                 instance_name: str | None = None) -> None:
        client_checked(check_group, group)
        self.group = group
        self.instance = ClientInstance(url, instance_name=instance_name)
        self.offsets = RemoteOffsetStore(self.instance, group)
        self.auto_commit_interval = auto_commit_interval
        self._commit_task: asyncio.Task[None] | None = None
        self._running = False

    async def start(self) -> None:
        await self.instance.start()
        if self._commit_task is None:
            self._commit_task = asyncio.create_task(self._commit_pending_loop())
        self._running = True

    async def shutdown(self) -> None:
        self._running = False
        if self._commit_task is not None:
            self._commit_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._commit_task
            self._commit_task = None
        with contextlib.suppress(ClientError, OSError):
            await self.offsets.persist(self.offsets.pending())
        await self.instance.shutdown()

    async def _commit_pending_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval)
            if self.offsets.pending():
                try:
                    await self.offsets.persist(self.offsets.pending())
                except Exception:  # background: tried again next round
                    log.warning("committing pending offsets of group %s failed", self.group, exc_info=True)

    async def __aenter__(self) -> AsyncPullConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _check(self) -> None:
        if not self._running:
            raise ClientStateError("the pull consumer is not started (call start() first) or was shut down")

    async def fetch_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's readable queues, sorted (topic, broker group, queue id)."""
        self._check()
        return (await self.instance.route(topic, refresh=True)).read_queues()

    async def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32, *, tags: str = "*",
                   wait_ms: int = 0) -> PullResult:
        """Messages from ``offset`` on; ``wait_ms`` > 0 holds the pull on the broker until one arrives."""
        self._check()
        return await self.instance.pull(mq, offset, max_messages, tags=tags, wait_ms=wait_ms)

    async def committed_offset(self, mq: MessageQueue) -> int:
        """The group's committed offset of ``mq`` (its master's, a slave's copy while the group has no
        master, or this consumer's own commit still waiting for one); -1 when there is none."""
        self._check()
        return await self.offsets.read(mq)

    async def commit_offset(self, mq: MessageQueue, offset: int) -> bool:
        """Commit ``offset`` (the next one to consume) for the group. True when the master took it;
        False when the group has no reachable master now: the offset is kept and committed once it
        has. An offset the broker refuses (OFFSET_ILLEGAL, ...) is raised."""
        self._check()
        return await self.offsets.commit(mq, offset)

    async def min_offset(self, mq: MessageQueue) -> int:
        self._check()
        return await self.instance.min_offset(mq)

    async def max_offset(self, mq: MessageQueue) -> int:
        self._check()
        return await self.instance.max_offset(mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset stored at or after ``timestamp_ms`` (epoch ms)."""
        self._check()
        return await self.instance.search_offset(mq, timestamp_ms)
