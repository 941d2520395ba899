"""Blocking twins of the asyncio classes: each runs its async twin on a private event loop thread
(uvloop when installed), so the sync API can be used from any thread, without an event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ferrymq.client.admin import AsyncAdmin
from ferrymq.client.message import Message, MessageQueue, PullResult, ReceivedMessage, SendResult, TransactionState
from ferrymq.client.producer import AsyncProducer, MessageQueueSelector
from ferrymq.client.pull_consumer import AsyncPullConsumer
from ferrymq.client.push_consumer import AsyncPushConsumer, Listener
from ferrymq.client.transaction import AsyncTransactionProducer, TransactionSendResult, as_state

T = TypeVar("T")
log = logging.getLogger(__name__)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.new_event_loop()


class LoopThread:
    def __init__(self, name: str) -> None:
        self.loop = _new_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def make(self, factory: Callable[[], T]) -> T:
        async def build() -> T:
            return factory()

        return self.run(build())

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()


class _SyncWrapper:
    _lt: LoopThread

    def _stop_loop(self) -> None:
        self._lt.stop()

    def __enter__(self) -> Any:
        self.start()  # type: ignore[attr-defined]
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()  # type: ignore[attr-defined]


class Producer(_SyncWrapper):
    def __init__(self, url: str, group: str = "DEFAULT_PRODUCER", **options: Any) -> None:
        self._lt = LoopThread(f"ferrymq-producer-{group}")
        self.impl: AsyncProducer = self._lt.make(lambda: AsyncProducer(url, group, **options))

    def start(self) -> None:
        self._lt.run(self.impl.start())

    def shutdown(self) -> None:
        try:
            self._lt.run(self.impl.shutdown())
        finally:
            self._stop_loop()

    def send(self, msg: Message, *, selector: MessageQueueSelector | None = None, arg: Any = None,
             timeout_s: float | None = None) -> SendResult:
        return self._lt.run(self.impl.send(msg, selector=selector, arg=arg, timeout_s=timeout_s))

    def send_async(self, msg: Message, *, selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout_s: float | None = None) -> concurrent.futures.Future[SendResult]:
        """Returns at once; the Future completes with the SendResult (or the error)."""
        return self._lt.submit(self.impl.send(msg, selector=selector, arg=arg, timeout_s=timeout_s))

    def send_oneway(self, msg: Message, *, selector: MessageQueueSelector | None = None, arg: Any = None) -> None:
        self._lt.run(self.impl.send_oneway(msg, selector=selector, arg=arg))

    def send_batch(self, msgs: list[Message], *, selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout_s: float | None = None) -> list[SendResult]:
        return self._lt.run(self.impl.send_batch(msgs, selector=selector, arg=arg, timeout_s=timeout_s))


class TransactionProducer(_SyncWrapper):
    """``execute(msg, arg)`` runs in the thread that called ``send_in_transaction`` (as RocketMQ's
    executeLocalTransaction), so it can use that thread's own database session; ``check(msg)`` runs on
    the producer's check threads."""

    def __init__(self, url: str, group: str, execute: Callable[[Message, Any], TransactionState],
                 check: Callable[[ReceivedMessage], TransactionState], **options: Any) -> None:
        self._lt = LoopThread(f"ferrymq-tx-{group}")
        self.impl: AsyncTransactionProducer = self._lt.make(
            lambda: AsyncTransactionProducer(url, group, execute, check, **options))

    def start(self) -> None:
        self._lt.run(self.impl.start())

    def shutdown(self) -> None:
        try:
            self._lt.run(self.impl.shutdown())
        finally:
            self._stop_loop()

    def send_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        half = self._lt.run(self.impl.send_half(msg))
        try:
            state = as_state(self.impl.execute(msg, arg), "execute")
        except Exception:
            log.warning("local transaction %s raised; its state is UNKNOWN until checked", half.transaction_id,
                        exc_info=True)
            state = TransactionState.UNKNOWN
        return self._lt.run(self.impl.end(half, state))


class PushConsumer(_SyncWrapper):
    """``listener`` runs on the consumer's worker threads with a list of messages and returns
    ConsumeResult.SUCCESS or ConsumeResult.RECONSUME_LATER."""

    def __init__(self, url: str, group: str, topic: str, tags: str = "*", listener: Listener | None = None,
                 orderly: bool = False, broadcast: bool = False, max_reconsume_times: int = 16,
                 **options: Any) -> None:
        if listener is None:
            raise TypeError("PushConsumer needs a listener")
        self._lt = LoopThread(f"ferrymq-consumer-{group}")
        self.impl: AsyncPushConsumer = self._lt.make(lambda: AsyncPushConsumer(
            url, group, topic, listener, tags, orderly=orderly, broadcast=broadcast,
            max_reconsume_times=max_reconsume_times, **options))

    def start(self) -> None:
        self._lt.run(self.impl.start())

    def shutdown(self) -> None:
        try:
            self._lt.run(self.impl.shutdown())
        finally:
            self._stop_loop()

    def assigned_queues(self) -> list[MessageQueue]:
        async def get() -> list[MessageQueue]:
            return self.impl.assigned_queues()

        return self._lt.run(get())

    @property
    def client_id(self) -> str:
        return self.impl.instance.client_id


class PullConsumer(_SyncWrapper):
    def __init__(self, url: str, group: str, **options: Any) -> None:
        self._lt = LoopThread(f"ferrymq-pull-{group}")
        self.impl: AsyncPullConsumer = self._lt.make(lambda: AsyncPullConsumer(url, group, **options))

    def start(self) -> None:
        self._lt.run(self.impl.start())

    def shutdown(self) -> None:
        try:
            self._lt.run(self.impl.shutdown())
        finally:
            self._stop_loop()

    def fetch_queues(self, topic: str) -> list[MessageQueue]:
        return self._lt.run(self.impl.fetch_queues(topic))

    def pull(self, mq: MessageQueue, offset: int, max_messages: int = 32, *, tags: str = "*",
             wait_ms: int = 0) -> PullResult:
        return self._lt.run(self.impl.pull(mq, offset, max_messages, tags=tags, wait_ms=wait_ms))

    def committed_offset(self, mq: MessageQueue) -> int:
        return self._lt.run(self.impl.committed_offset(mq))

    def commit_offset(self, mq: MessageQueue, offset: int) -> bool:
        return self._lt.run(self.impl.commit_offset(mq, offset))

    def min_offset(self, mq: MessageQueue) -> int:
        return self._lt.run(self.impl.min_offset(mq))

    def max_offset(self, mq: MessageQueue) -> int:
        return self._lt.run(self.impl.max_offset(mq))

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        return self._lt.run(self.impl.search_offset(mq, timestamp_ms))


class Admin(_SyncWrapper):
    """Usable without start(): ``Admin(url).create_topic("orders", read_queues=8, write_queues=8)``."""

    def __init__(self, url: str) -> None:
        self._lt = LoopThread("ferrymq-admin")
        self.impl: AsyncAdmin = self._lt.make(lambda: AsyncAdmin(url))
        self._closed = False

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self.impl.shutdown())
        finally:
            self._stop_loop()

    def __del__(self) -> None:
        # Admin is often used without shutdown() (``Admin(url).create_topic(...)``): close its
        # connections and loop thread, but never wait on that thread while the interpreter exits.
        if getattr(self, "_closed", True) or sys.is_finalizing():
            return
        self._closed = True
        try:
            self._lt.submit(self.impl.shutdown()).result(timeout=2)
        except Exception:
            pass
        self._stop_loop()

    def create_topic(self, name: str, read_queues: int = 8, write_queues: int = 8, perm: str = "RW",
                     message_type: str = "NORMAL", *, group: str | None = None) -> dict[str, Any]:
        return self._lt.run(self.impl.create_topic(name, read_queues, write_queues, perm, message_type, group=group))

    def describe_topic(self, name: str, *, group: str | None = None) -> dict[str, Any]:
        return self._lt.run(self.impl.describe_topic(name, group=group))

    def update_topic(self, name: str, read_queues: int | None = None, write_queues: int | None = None,
                     perm: str | None = None, *, group: str | None = None) -> dict[str, Any]:
        return self._lt.run(self.impl.update_topic(name, read_queues, write_queues, perm, group=group))

    def delete_topic(self, name: str, *, group: str | None = None) -> None:
        self._lt.run(self.impl.delete_topic(name, group=group))

    def consumer_offsets(self, group: str, topic: str) -> dict[MessageQueue, int]:
        return self._lt.run(self.impl.consumer_offsets(group, topic))

    def set_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        self._lt.run(self.impl.set_consumer_offset(group, mq, offset))

    def reset_offsets_by_time(self, group: str, topic: str, timestamp_ms: int) -> dict[MessageQueue, int]:
        return self._lt.run(self.impl.reset_offsets_by_time(group, topic, timestamp_ms))

    def queue_offsets(self, topic: str) -> dict[MessageQueue, tuple[int, int]]:
        return self._lt.run(self.impl.queue_offsets(topic))

    def consumer_ids(self, group: str, topic: str) -> list[str]:
        return self._lt.run(self.impl.consumer_ids(group, topic))


__all__ = ["Admin", "LoopThread", "Producer", "PullConsumer", "PushConsumer", "TransactionProducer"]
