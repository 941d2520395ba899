"""The producer (RocketMQ's DefaultMQProducer): sync, async, oneway and batch sends.

A send picks a write queue (round-robin with latency-based fault avoidance, or the caller's queue
selector) and goes to that group's master. Everything happens within ``send_timeout_ms`` (3000, as
RocketMQ) in total; a failover takes longer than that (the controller's heartbeat timeout, 10 s by
default), so a producer that must ride one out raises it.

What happens after a failure depends on whether the message may have been stored:

* Certainly not stored, because the group cannot take writes right now (cannot connect to its master,
  SERVICE_NOT_AVAILABLE from a slave or a fenced master, IN_SYNC_REPLICAS_NOT_ENOUGH, or the route
  names no master during a failover): another group is tried at once if there is one; otherwise the
  route is re-read after a short, growing pause (50 ms up to 500 ms) until the group has a master that
  takes the message. These waits do not use up retries — a failover is not the message's fault.
* Other retriable refusals (SYSTEM_BUSY, TOPIC_NOT_EXIST, NO_PERMISSION, ...): retried
  ``retry_times_when_send_failed`` times (2), counted over all groups, on another group when there is
  one.
* Stored but not as durable as promised (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
  SLAVE_NOT_AVAILABLE): raised as BrokerError with that code, not resent — resending would store it
  twice (RocketMQ's retryAnotherBrokerWhenNotStoreOK, false by default; set
  ``retry_another_broker_when_not_store_ok`` to resend).
* Unknown outcome (the connection broke, or no answer in time, after the request was written): raised
  as RemotingError / RemotingTimeoutError, not resent, for the same reason. RocketMQ resends these
  (and may then store the message twice); ``retry_when_outcome_unknown=True`` does too.

So a SendResult means stored once, and an error means "not acknowledged": the caller decides whether
to send again.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.client.errors import (
    BrokerError,
    ClientError,
    ClientStateError,
    RemotingConnectError,
    RemotingError,
    RemotingTimeoutError,
)
from ferrymq.client.fault import MASTER_UNAVAILABLE_LATENCY_MS, LatencyFaultTolerance, QueueSelector
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import Message, MessageQueue, SendResult
from ferrymq.client.routes import TopicRoute

log = logging.getLogger(__name__)
_packb = msgpack.Packer(use_bin_type=True).pack

MessageQueueSelector = Callable[[list[MessageQueue], Message, Any], MessageQueue]

WAIT_MIN_S, WAIT_MAX_S = 0.05, 0.5  # pauses between route reads while a group has no usable master
# Refused before anything was stored, because the group cannot take writes now (a failover).
MASTER_UNAVAILABLE_CODES = frozenset({"SERVICE_NOT_AVAILABLE", "IN_SYNC_REPLICAS_NOT_ENOUGH"})
# Stored, but not as durable as the broker's policy promises.
NOT_STORE_OK_CODES = frozenset({"FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"})


class Failure(enum.Enum):
    FATAL = "fatal"  # would fail the same way anywhere: raise
    MASTER_UNAVAILABLE = "master unavailable"  # not stored; wait for (or go around) the failover
    RETRY = "retry"  # not stored as far as we know; counts against retry_times_when_send_failed
    RAISE = "raise"  # may be stored: never resent unless the producer was told to


def classify(exc: ClientError, *, retry_not_store_ok: bool, retry_unknown: bool) -> Failure:
    if isinstance(exc, RemotingConnectError):
        return Failure.MASTER_UNAVAILABLE
    if isinstance(exc, RemotingError):
        return Failure.RETRY if retry_unknown else Failure.RAISE
    if exc.code in MASTER_UNAVAILABLE_CODES:
        return Failure.MASTER_UNAVAILABLE
    if exc.code in NOT_STORE_OK_CODES:
        return Failure.RETRY if retry_not_store_ok else Failure.RAISE
    if isinstance(exc, BrokerError) and exc.retriable:
        return Failure.RETRY
    return Failure.FATAL


def select_by_hash(queues: list[MessageQueue], msg: Message, arg: Any) -> MessageQueue:
    """Same ``arg`` (or, without one, same first key) → same queue: per-key order for ordered messages.
    A CRC rather than hash(): it must agree across processes."""
    key = arg if arg is not None else (msg.keys[0] if msg.keys else msg.tags or "")
    return queues[zlib.crc32(str(key).encode()) % len(queues)]


class AsyncProducer:
    def __init__(self, url: str, group: str = "DEFAULT_PRODUCER", *, send_timeout_ms: int = 3000,
                 retry_times_when_send_failed: int = 2, send_latency_fault_enable: bool = True,
                 retry_another_broker_when_not_store_ok: bool = False, retry_when_outcome_unknown: bool = False,
                 instance_name: str | None = None) -> None:
        if send_timeout_ms <= 0:
            raise ClientError("INVALID_REQUEST", "send_timeout_ms must be positive")
        if retry_times_when_send_failed < 0:
            raise ClientError("INVALID_REQUEST", "retry_times_when_send_failed must not be negative")
        self.group = group
        self.send_timeout = send_timeout_ms / 1000
        self.retry_times = retry_times_when_send_failed
        self.retry_not_store_ok = retry_another_broker_when_not_store_ok
        self.retry_unknown = retry_when_outcome_unknown
        self.instance = ClientInstance(url, instance_name=instance_name)
        self.fault = LatencyFaultTolerance()
        self.selector = QueueSelector(self.fault, send_latency_fault_enable)
        # Derived from the last route object seen (a refresh makes a new one), so that a send with an
        # unchanged route does not rebuild them: the route that passed _first_route's checks and the
        # route's writable queues.
        self._checked_route: TopicRoute | None = None
        self._writable: tuple[TopicRoute | None, list[MessageQueue]] = (None, [])
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
        # time.monotonic, not loop.time(): asyncio.get_running_loop() costs a getpid() per call (3.11)
        deadline = time.monotonic() + budget
        retries_left = 0 if selector is not None else self.retry_times
        route = await self._first_route(topic, deadline)
        avoid: str | None = None  # the group that failed last: any other group first
        hold_avoided = False  # it failed for want of a master: not again before a pause
        pause = WAIT_MIN_S
        last_exc: ClientError | None = None
        while True:
            mq = self._pick(route, msgs[0], selector, arg, avoid)
            addr = self._master(route, mq)
            if mq is not None and addr is not None and not (hold_avoided and mq.broker_group == avoid):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                t0 = time.perf_counter()
                try:
                    results = await self._send_to(mq, addr, msgs, remaining)
                except (RemotingError, BrokerError) as exc:
                    failure = classify(exc, retry_not_store_ok=self.retry_not_store_ok,
                                       retry_unknown=self.retry_unknown)
                    log.debug("send to %s at %s failed (%s): %s", mq, addr, failure.value, exc)
                    if failure is Failure.FATAL or failure is Failure.RAISE:
                        raise
                    if failure is Failure.MASTER_UNAVAILABLE:
                        self.fault.update(mq.broker_group, MASTER_UNAVAILABLE_LATENCY_MS, False, addr)
                    else:
                        self.fault.update(mq.broker_group, (time.perf_counter() - t0) * 1000, True, addr)
                    last_exc, avoid = exc, mq.broker_group
                    if failure is Failure.RETRY:
                        if retries_left <= 0:
                            raise
                        retries_left -= 1
                    hold_avoided = failure is Failure.MASTER_UNAVAILABLE
                    route = await self._refresh(topic, route)
                    continue
                self.fault.update(mq.broker_group, (time.perf_counter() - t0) * 1000, False, addr)
                return results
            if last_exc is None:
                last_exc = BrokerError("SERVICE_NOT_AVAILABLE", f"no master can take messages for topic {topic!r} "
                                       "now (a failover is under way)")
            # Nowhere to send right now: give the controller time to elect, then look again.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(pause, remaining))
            pause = min(pause * 2, WAIT_MAX_S)
            hold_avoided = False
            route = await self._refresh(topic, route)
        if last_exc is not None:
            raise last_exc
        raise RemotingTimeoutError(f"send to topic {topic!r} did not finish within {budget:.3g} s")

    async def _first_route(self, topic: str, deadline: float) -> TopicRoute:
        """The topic's route; an unreachable controller is retried until the deadline."""
        route = self.instance.fresh_route(topic)  # the usual case: cached, no await
        pause = WAIT_MIN_S
        while route is None:
            try:
                route = await self.instance.route(topic)
            except RemotingError:
                if time.monotonic() + pause >= deadline:
                    raise
                await asyncio.sleep(pause)
                pause = min(pause * 2, WAIT_MAX_S)
        if route is self._checked_route:
            return route
        if not route.write_queues(include_masterless=True):
            raise BrokerError("TOPIC_NOT_EXIST", f"no broker group has a writable queue for topic {topic!r}")
        self.fault.follow_masters(route.masters())
        self._checked_route = route
        return route

    async def _refresh(self, topic: str, route: TopicRoute) -> TopicRoute:
        try:
            route = await self.instance.route(topic, refresh=True)
        except ClientError as exc:  # the controller is unreachable: keep going with what we know
            log.debug("refreshing the route of %s failed: %s", topic, exc)
        self.fault.follow_masters(route.masters())
        return route

    def _pick(self, route: TopicRoute, msg: Message, selector: MessageQueueSelector | None, arg: Any,
              avoid: str | None) -> MessageQueue | None:
        if selector is not None:
            # The full list, groups in a failover included: a key keeps its queue (its order) and
            # waits for that group's new master rather than moving to another queue.
            queues = route.write_queues(include_masterless=True)
            return selector(queues, msg, arg) if queues else None
        cached_for, queues = self._writable
        if cached_for is not route:
            queues = route.write_queues()
            self._writable = (route, queues)
        return self.selector.select(queues, avoid) if queues else None

    @staticmethod
    def _master(route: TopicRoute, mq: MessageQueue | None) -> str | None:
        g = route.group(mq.broker_group) if mq is not None else None
        return g.master_tcp if g is not None and g.writable else None

    async def _send_to(self, mq: MessageQueue, addr: str, msgs: list[Message], timeout_s: float) -> list[SendResult]:
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
