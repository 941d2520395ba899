"""The producer (RocketMQ's DefaultMQProducer): sync, async, oneway and batch sends.

A send picks a write queue (round-robin with latency-based fault avoidance, or the caller's queue
selector), and on failure retries ``retry_times_when_send_failed`` times on another broker group,
all within ``send_timeout`` (3 s) in total. Routes are refreshed after a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.client.errors import BrokerError, ClientError, ClientStateError, RemotingError, RemotingTimeoutError
from ferrymq.client.fault import LatencyFaultTolerance, QueueSelector
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import Message, MessageQueue, SendResult

log = logging.getLogger(__name__)
_packb = msgpack.Packer(use_bin_type=True).pack

MessageQueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]


def select_by_hash(queues: list[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Same ``arg`` (or, without one, same first key) → same queue: per-key order for ordered messages.
    A CRC rather than hash(): it must agree across processes."""
    key = arg if arg is not None else (msg.keys[0] if msg.keys else msg.tags or "")
    return queues[zlib.crc32(str(key).encode()) % len(queues)]


class AsyncProducer:
    def __init__(self, url: str, group: str = "DEFAULT_PRODUCER", *, send_timeout: float = 3.0,
                 retry_times_when_send_failed: int = 2, send_latency_fault_enable: bool = True,
                 instance_name: str | None = None) -> None:
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times = retry_times_when_send_failed
        self.instance = ClientInstance(url, instance_name=instance_name)
        self.fault = LatencyFaultTolerance()
        self.selector = QueueSelector(self.fault, send_latency_fault_enable)
        self._running = False

    async def start(self) -> None:
        self.instance.producer_groups.add(self.group)
        await self.instance.start()
        self._running = True

    async def shutdown(self) -> None:
        self._running = False
        await self.instance.shutdown()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ---- API --------------------------------------------------------------------------------------------
    async def send(self, msg: Message, *, selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout_s: float | None = None) -> SendResult:
        return (await self._send([msg], selector, arg, timeout_s))[0]

    def send_async(self, msg: Message, *, selector: MessageQueueSelector | None = None, arg: Any = None,
                   timeout_s: float | None = None) -> asyncio.Task[SendResult]:
        """Start a send and return at once; await the task (or add a done callback) for the result."""
        return asyncio.get_running_loop().create_task(self.send(msg, selector=selector, arg=arg, timeout_s=timeout_s))

    async def send_batch(self, msgs: list[Message], *, selector: MessageQueueSelector | None = None,
                         arg: Any = None, timeout_s: float | None = None) -> list[SendResult]:
        """All messages go to one queue in one frame, in order."""
        if not msgs:
            raise ClientError("MESSAGE_ILLEGAL", "send_batch needs at least one message")
        if len({m.topic for m in msgs}) != 1:
            raise ClientError("MESSAGE_ILLEGAL", "every message of a batch must have the same topic")
        if any(m.delay_level or m.deliver_at_ms is not None for m in msgs):
            raise ClientError("MESSAGE_ILLEGAL", "delayed messages cannot be sent in a batch")
        return await self._send(msgs, selector, arg, timeout_s)

    async def send_oneway(self, msg: Message, *, selector: MessageQueueSelector | None = None,
                          arg: Any = None) -> None:
        """Fire and forget: no answer, no retry, no durability promise."""
        self._check_running()
        route = await self.instance.route(msg.topic)
        queues = route.write_queues()
        if not queues:
            raise BrokerError("TOPIC_NOT_EXIST", f"no writable queue for topic {msg.topic!r}")
        mq = selector(queues, msg, arg) if selector else self.selector.select(queues, None)
        addr = await self.instance.address(mq)
        await self.instance.remoting.invoke_oneway(addr, RequestCode.SEND_MESSAGE, self._ext(mq, msg), bytes(msg.body))

    # ---- the send loop (sendDefaultImpl) ------------------------------------------------------------------
    def _check_running(self) -> None:
        if not self._running:
            raise ClientStateError("the producer is not started (call start() first) or was shut down")

    @staticmethod
    def _ext(mq: MessageQueue, msg: Message) -> dict[str, Any]:
        ext: dict[str, Any] = {"topic": mq.topic, "queueId": mq.queue_id, "bornTs": int(time.time() * 1000)}
        props = msg.wire_properties()
        if props:
            ext["props"] = props
        return ext

    async def _send(self, msgs: list[Message], selector: MessageQueueSelector | None, arg: Any,
                    timeout_s: float | None) -> list[SendResult]:
        self._check_running()
        topic = msgs[0].topic
        budget = self.send_timeout if timeout_s is None else timeout_s
        deadline = time.monotonic() + budget
        attempts = 1 if selector is not None else 1 + self.retry_times
        route = await self.instance.route(topic)
        last_failed: str | None = None
        last_exc: ClientError | None = None
        for attempt in range(attempts):
            queues = route.write_queues()
            if not queues:
                raise BrokerError("TOPIC_NOT_EXIST", f"no broker group has a writable master for topic {topic!r}")
            mq = selector(queues, msgs[0], arg) if selector is not None else self.selector.select(queues, last_failed)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            t0 = time.perf_counter()
            try:
                results = await self._send_to(mq, msgs, remaining)
                self.fault.update(mq.broker_group, (time.perf_counter() - t0) * 1000, False)
                return results
            except (RemotingError, BrokerError) as exc:
                if isinstance(exc, BrokerError) and not exc.retriable:
                    raise
                self.fault.update(mq.broker_group, (time.perf_counter() - t0) * 1000, True)
                last_failed, last_exc = mq.broker_group, exc
                log.debug("send to %s failed (attempt %d): %s", mq, attempt + 1, exc)
                if attempt + 1 < attempts:
                    try:
                        route = await self.instance.route(topic, refresh=True)
                    except ClientError:
                        pass
        if last_exc is not None:
            raise last_exc
        raise RemotingTimeoutError(f"send to topic {topic!r} did not finish within {budget:.3g} s")

    async def _send_to(self, mq: MessageQueue, msgs: list[Message], timeout_s: float) -> list[SendResult]:
        addr = await self.instance.address(mq)
        inv = self.instance.remoting.invoke
        if len(msgs) == 1:
            resp = await inv(addr, RequestCode.SEND_MESSAGE, self._ext(mq, msgs[0]), bytes(msgs[0].body),
                             timeout_s=timeout_s)
            e = resp.ext
            return [SendResult(e["msgId"], e["queueId"], e["queueOffset"], mq.topic, mq.broker_group, e["status"])]
        body = _packb([[bytes(m.body), m.wire_properties()] for m in msgs])
        resp = await inv(addr, RequestCode.SEND_BATCH_MESSAGE,
                         {"topic": mq.topic, "queueId": mq.queue_id, "bornTs": int(time.time() * 1000)}, body,
                         timeout_s=timeout_s)
        qid, status = resp.ext["queueId"], resp.ext["status"]
        return [SendResult(mid, qid, qoff, mq.topic, mq.broker_group, status)
                for mid, qoff in msgpack.unpackb(resp.body, raw=False)]
