"""Flush services: the only places that wait on the disk, each on its own thread.

* GroupCommitService (SYNC_FLUSH): a put's future resolves only after an fdatasync that covers it.
  Puts that arrive while an fsync runs share the next one, as RocketMQ's GroupCommitService.
* IntervalFlushService (ASYNC_FLUSH): fdatasync every flushIntervalCommitLog ms once
  flushCommitLogLeastPages pages are dirty, and at least every flushCommitLogThoroughInterval ms,
  as RocketMQ's FlushRealTimeService.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import queue
import threading
import time
from collections.abc import Callable

from ferrymq.broker.store.segments import SegmentedFile

log = logging.getLogger(__name__)
PAGE = 4096


class _FlushThread:
    """A daemon thread around ``files.flush()`` that reports each new flushed offset to the loop."""

    name = "flush"

    def __init__(self, files: SegmentedFile, loop: asyncio.AbstractEventLoop,
                 on_flushed: Callable[[int], None], on_latency: Callable[[float], None] | None = None) -> None:
        self.files = files
        self.loop = loop
        self.on_flushed = on_flushed
        self.on_latency = on_latency
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run_safe, name=self.name, daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join()

    def _flush_once(self) -> None:
        t0 = time.perf_counter()
        before = self.files.flushed_offset
        flushed = self.files.flush()
        if flushed != before:
            if self.on_latency is not None:
                self.on_latency(time.perf_counter() - t0)
            try:
                self.loop.call_soon_threadsafe(self.on_flushed, flushed)
            except RuntimeError:  # loop closed during shutdown
                pass

    def _run_safe(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # pragma: no cover - a failing disk
            log.exception("%s thread died", self.name)
            self.error = exc

    def _run(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class FlushTimeout(TimeoutError):
    """The fdatasync covering a put did not finish within the put's timeout."""


class GroupCommitService(_FlushThread):
    name = "group-commit"

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        # (end offset, future, deadline on the loop clock) in arrival order; every put waits with the
        # store's syncFlushTimeout, so deadlines grow along the queue and the head expires first.
        self._waiters: collections.deque[tuple[int, asyncio.Future[None], float]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None
        # The wake-up: a C-level queue, cheaper both ways than threading.Event (a Python Condition
        # whose set() and wait() run several Python frames on each side of every flush).
        self._requests: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._requested = False

    def wait_flushed(self, end_offset: int, timeout_s: float) -> asyncio.Future[None]:
        """Called on the loop thread after a write; the future resolves once ``end_offset`` is durable,
        or fails with FlushTimeout after ``timeout_s``. One timer serves every waiter (the oldest one's
        deadline), so a put costs a bare future, not a timeout task of its own."""
        fut = self.loop.create_future()
        if self.files.flushed_offset >= end_offset:
            fut.set_result(None)
            return fut
        deadline = self.loop.time() + timeout_s
        self._waiters.append((end_offset, fut, deadline))
        if self._timer is None:
            self._timer = self.loop.call_at(deadline, self._expire)
        if not self._requested:
            self._requested = True
            self._requests.put(None)
        return fut

    def resolve(self, flushed: int) -> None:
        """Loop thread: complete every waiter the new flushed offset covers."""
        waiters = self._waiters
        while waiters and waiters[0][0] <= flushed:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_result(None)

    def _expire(self) -> None:
        self._timer = None
        waiters = self._waiters
        now = self.loop.time()
        while waiters and waiters[0][2] <= now:
            fut = waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(FlushTimeout())
        if waiters:
            self._timer = self.loop.call_at(waiters[0][2], self._expire)

    def fail_all(self, exc: BaseException) -> None:
        while self._waiters:
            fut = self._waiters.popleft()[1]
            if not fut.done():
                fut.set_exception(exc)

    def stop(self) -> None:
        self._stop = True
        self._requests.put(None)
        self._thread.join()

    def _run(self) -> None:
        get = self._requests.get
        while True:
            get()
            # Cleared before the flush reads the write offset: a put that lands after this line either
            # is covered by this flush or queues another request.
            self._requested = False
            self._flush_once()
            if self._stop:
                return


class IntervalFlushService(_FlushThread):
    name = "async-flush"

    def __init__(self, *args, interval_ms: int, least_pages: int, thorough_ms: int, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.interval = interval_ms / 1000
        self.least_bytes = least_pages * PAGE
        self.thorough = thorough_ms / 1000
        self._last_thorough = time.monotonic()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.interval)
            now = time.monotonic()
            dirty = self.files.write_offset - self.files.flushed_offset
            thorough = now - self._last_thorough >= self.thorough
            if dirty > 0 and (dirty >= self.least_bytes or thorough or self._stop):
                self._flush_once()
            if thorough:
                self._last_thorough = now
        self._flush_once()
