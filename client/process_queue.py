"""A consumer's view of one assigned queue (RocketMQ's ProcessQueue): the messages pulled but not yet
done, in offset order, and the offset it is safe to commit — the lowest offset not yet done, so a
crash redelivers rather than skips."""

from __future__ import annotations

import asyncio
import itertools
import time

from ferrymq.client.message import MessageQueue, ReceivedMessage


class ProcessQueue:
    def __init__(self, mq: MessageQueue, next_offset: int) -> None:
        self.mq = mq
        self.next_offset = next_offset  # where the next pull starts
        self.msgs: dict[int, ReceivedMessage] = {}  # insertion order == offset order
        self.max_seen = next_offset - 1
        self.dropped = False
        self.locked = False
        self.last_lock_time = 0.0
        self.consume_lock = asyncio.Lock()  # orderly: held while the listener runs
        self.consuming = False  # orderly: a consume loop is running
        self.pull_task: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self.msgs)

    def put(self, msgs: list[ReceivedMessage]) -> None:
        for m in msgs:
            if m.queue_offset > self.max_seen:
                self.msgs[m.queue_offset] = m
                self.max_seen = m.queue_offset

    def commit_offset(self) -> int:
        """Everything below this offset is done."""
        for off in self.msgs:
            return off
        return self.max_seen + 1

    def remove(self, msgs: list[ReceivedMessage]) -> int:
        for m in msgs:
            self.msgs.pop(m.queue_offset, None)
        return self.commit_offset()

    def head(self, n: int) -> list[ReceivedMessage]:
        """Orderly: the next ``n`` messages in offset order."""
        return list(itertools.islice(self.msgs.values(), n))

    def lock_valid(self, max_live_s: float) -> bool:
        return self.locked and time.monotonic() - self.last_lock_time <= max_live_s
