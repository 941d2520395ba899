"""Long polling: hold a pull until a message arrives in its queue or the wait ends.

RocketMQ's PullRequestHoldService, driven by arrivals rather than polling: the store calls
``notify`` (on the event loop) whenever it dispatches new entries into a queue.
"""

from __future__ import annotations

import asyncio
import contextlib


class PullHoldService:
    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], list[tuple[int, asyncio.Future[None]]]] = {}

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        waiters = self._waiters.get((topic, queue_id))
        if not waiters:
            return
        keep = []
        for offset, fut in waiters:
            if fut.done():
                continue
            if offset < max_offset:
                fut.set_result(None)
            else:
                keep.append((offset, fut))
        if keep:
            self._waiters[(topic, queue_id)] = keep
        else:
            del self._waiters[(topic, queue_id)]

    async def wait(self, topic: str, queue_id: int, offset: int, timeout_s: float) -> bool:
        """Wait until the queue grows past ``offset``; False on timeout."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault((topic, queue_id), []).append((offset, fut))
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if not fut.done():
                fut.cancel()
            waiters = self._waiters.get((topic, queue_id))
            if waiters is not None:
                with contextlib.suppress(ValueError):
                    waiters.remove((offset, fut))
                if not waiters:
                    self._waiters.pop((topic, queue_id), None)

    def wake_all(self) -> None:
        for waiters in self._waiters.values():
            for _, fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        self._waiters.clear()
