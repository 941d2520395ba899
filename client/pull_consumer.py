"""The pull consumer (RocketMQ's DefaultMQPullConsumer): the application chooses queues and offsets
and pulls itself; the broker keeps the group's committed offsets on request."""

from __future__ import annotations

from ferrymq.client.errors import ClientStateError, client_checked
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import MessageQueue, PullResult
from ferrymq.common.limits import check_group


class AsyncPullConsumer:
    def __init__(self, url: str, group: str, *, instance_name: str | None = None) -> None:
        client_checked(check_group, group)
        self.group = group
        self.instance = ClientInstance(url, instance_name=instance_name)
        self._running = False

    async def start(self) -> None:
        await self.instance.start()
        self._running = True

    async def shutdown(self) -> None:
        self._running = False
        await self.instance.shutdown()

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
        """The group's committed offset of ``mq`` on the broker; -1 when there is none."""
        self._check()
        return await self.instance.query_offset(self.group, mq)

    async def commit_offset(self, mq: MessageQueue, offset: int) -> None:
        self._check()
        await self.instance.update_offset(self.group, mq, offset)

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
