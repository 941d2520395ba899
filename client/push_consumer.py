"""The push consumer (RocketMQ's DefaultMQPushConsumer): long-polling pulls, a listener on a worker
pool, rebalancing among the group's members, and at-least-once offsets.

Clustering: the group's live members share the topic's read queues (AllocateMessageQueueAveragely);
each rebalances at start, when the broker says the member set changed, and every
``rebalance_interval``. Broadcasting: every member takes every queue, offsets stay with the client.

At-least-once: a message's offset is committed only after its listener returned SUCCESS or the
message was sent back, and only up to the lowest offset still not done.

Retries (clustering, as RocketMQ): a message whose listener returned RECONSUME_LATER, raised or ran
past ``consume_timeout`` is sent back to the broker (CONSUMER_SEND_MSG_BACK), which stores it in the
group's retry topic ``%RETRY%{group}`` to be delivered again later, at growing intervals, and after
``max_reconsume_times`` reconsumptions moves it to the dead-letter queue ``%DLQ%{group}``. Every member
subscribes to the retry topic too; its messages reach the listener with their original topic and
message id and a higher ``reconsume_times``. A send-back that fails falls back to consuming the message
again here, after a backoff: a message is never skipped. (A listener still running at its timeout
keeps its worker thread until it returns; its late answer is ignored.) Broadcasting consumers have no
retry topic: they retry locally until the listener succeeds.

Orderly: a member consumes a queue only while it holds the queue's lock on the broker, one batch at a
time in offset order; it renews its locks every ``lock_interval`` and releases a queue only after its
current batch finished and its offset was committed. A failed message is retried in place (the queue
waits for it, keeping the order); after ``max_reconsume_times`` retries it is sent straight to the
dead-letter queue (send-back with delay level -1) and the queue moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.client.allocate import allocate_averagely
from ferrymq.client.errors import BrokerError, ClientError, ClientStateError, client_checked
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import ConsumeResult, MessageQueue, ReceivedMessage
from ferrymq.client.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from ferrymq.client.process_queue import ProcessQueue
from ferrymq.common.limits import check_group, check_topic
from ferrymq.common.message import PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC

log = logging.getLogger(__name__)

Listener = Callable[[list[ReceivedMessage]], ConsumeResult | Awaitable[ConsumeResult]]
CONSUME_FROM = {"latest": "CONSUME_FROM_LAST_OFFSET", "earliest": "CONSUME_FROM_FIRST_OFFSET",
                "timestamp": "CONSUME_FROM_TIMESTAMP"}
PULL_ERROR_BACKOFF_S = 1.0  # RocketMQ's pullTimeDelayMillsWhenException is 3 s; tests like it shorter
FLOW_CONTROL_BACKOFF_S = 0.05
RETRY_TOPIC_PREFIX = "%RETRY%"
CONSUME_TIMEOUT_S = 15 * 60.0  # RocketMQ's consumeTimeout
DEFAULT_DELAY_LEVEL = 0  # send-back: the broker picks level 3 + reconsumeTimes
DEAD_LETTER_DELAY_LEVEL = -1  # send-back: straight to the dead-letter queue
RETRY_ROUTE_RECHECK_S = 1.0


class AsyncPushConsumer:
    def __init__(self, url: str, group: str, topic: str, listener: Listener, tags: str = "*", *,
                 orderly: bool = False, broadcast: bool = False, max_reconsume_times: int = 16,
                 consume_from: str = "latest", consume_timestamp_ms: int | None = None,
                 consume_thread_count: int = 8, consume_batch_max_size: int = 1, pull_batch_size: int = 32,
                 pull_threshold_for_queue: int = 1000, long_polling_ms: int = 15_000,
                 auto_commit_interval: float = 5.0, rebalance_interval: float = 20.0, lock_interval: float = 20.0,
                 lock_max_live_time: float = 30.0, heartbeat_interval: float = 30.0,
                 consume_timeout: float = CONSUME_TIMEOUT_S, offset_store_dir: str | Path | None = None,
                 instance_name: str | None = None) -> None:
        client_checked(check_group, group)
        client_checked(check_topic, topic)
        if consume_from not in CONSUME_FROM:
            raise ClientError("INVALID_REQUEST", f"consume_from is one of {sorted(CONSUME_FROM)}")
        if consume_from == "timestamp" and consume_timestamp_ms is None:
            raise ClientError("INVALID_REQUEST", "consume_from='timestamp' needs consume_timestamp_ms")
        self.group, self.topic, self.tags = group, topic, tags or "*"
        self.listener = listener
        self.orderly, self.broadcast = orderly, broadcast
        self.max_reconsume_times = max_reconsume_times
        self.consume_timeout = consume_timeout
        # broadcasting keeps no retry topic: a failed message would reach every member again
        self.retry_topic = None if broadcast else RETRY_TOPIC_PREFIX + group
        self.consume_from, self.consume_timestamp_ms = consume_from, consume_timestamp_ms
        self.batch_max = max(1, consume_batch_max_size)
        self.pull_batch_size = pull_batch_size
        self.pull_threshold = pull_threshold_for_queue
        self.long_polling_ms = long_polling_ms
        self.auto_commit_interval = auto_commit_interval
        self.rebalance_interval = rebalance_interval
        self.lock_interval = lock_interval
        self.lock_max_live_time = lock_max_live_time
        self.instance = ClientInstance(url, instance_name=instance_name, heartbeat_interval=heartbeat_interval)
        self.offsets: OffsetStore = (
            LocalOffsetStore(Path(offset_store_dir) / group / "offsets.json" if offset_store_dir else None)
            if broadcast else RemoteOffsetStore(self.instance, group))
        self.executor = ThreadPoolExecutor(consume_thread_count, thread_name_prefix=f"consume-{group}")
        self.pqs: dict[MessageQueue, ProcessQueue] = {}
        self._is_async_listener = inspect.iscoroutinefunction(listener)
        self._rebalance_wanted = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._consume_tasks: set[asyncio.Task[None]] = set()
        self._running = False
        self._warned_none = False
        self._retry_topic_expected = False  # something was sent back but its retry topic has no route yet

    # ---- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._running:
            return
        self._running = True
        self.instance.members[self.group] = self
        await self.instance.start()
        await self.instance.route(self.topic)
        await self.instance.heartbeat_all()
        await self._rebalance()
        self._tasks = [asyncio.create_task(self._rebalance_loop()), asyncio.create_task(self._commit_loop())]
        if self.orderly and not self.broadcast:
            self._tasks.append(asyncio.create_task(self._lock_loop()))

    async def shutdown(self, await_consume_s: float = 10.0) -> None:
        if not self._running:
            return
        self._running = False
        stopping = [*self._tasks, *(pq.pull_task for pq in self.pqs.values() if pq.pull_task is not None)]
        for t in stopping:
            t.cancel()
        if stopping:
            await asyncio.wait(stopping, timeout=5)
        # Let listeners already running finish, so their offsets can be committed below.
        if self._consume_tasks:
            await asyncio.wait(list(self._consume_tasks), timeout=await_consume_s)
        for t in list(self._consume_tasks):
            t.cancel()
        with contextlib.suppress(ClientError, OSError):
            await self._persist_offsets()
        if self.orderly and not self.broadcast:
            await self._unlock(list(self.pqs))
        await self.instance.shutdown()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> AsyncPushConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # ---- Member -----------------------------------------------------------------------------------------
    def consumer_data(self) -> dict[str, Any]:
        return {"group": self.group, "consumeType": "PUSH",
                "messageModel": "BROADCASTING" if self.broadcast else "CLUSTERING",
                "consumeFromWhere": CONSUME_FROM[self.consume_from], "orderly": self.orderly,
                "subscriptions": [{"topic": t, "expression": self._tags_of(t)} for t in self._topics()]}

    def _topics(self) -> list[str]:
        return [self.topic] if self.retry_topic is None else [self.topic, self.retry_topic]

    def _tags_of(self, topic: str) -> str:
        return self.tags if topic == self.topic else "*"

    def on_consumer_ids_changed(self) -> None:
        self._rebalance_wanted.set()

    def assigned_queues(self) -> list[MessageQueue]:
        return sorted(mq for mq, pq in self.pqs.items() if not pq.dropped)

    # ---- rebalance --------------------------------------------------------------------------------------
    async def _rebalance_loop(self) -> None:
        while self._running:
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that races
                # with the event being set, and shutdown would wait for this loop forever
                async with asyncio.timeout(self.rebalance_interval):
                    await self._rebalance_wanted.wait()
            except TimeoutError:
                pass
            self._rebalance_wanted.clear()
            try:
                await self._rebalance()
            except Exception:  # background: a failed round is retried at the next one
                log.warning("rebalance of group %s failed", self.group, exc_info=True)
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                self._rebalance_wanted.set()

    async def _rebalance(self) -> None:
        async with self._rebalance_lock:
            try:
                route = await self.instance.route(self.topic)
            except ClientError as exc:
                log.warning("no route for topic %s: %s", self.topic, exc)
                return
            mqs = route.read_queues()
            if self.broadcast:
                allocated = set(mqs)
            else:
                addrs = sorted({g.master_tcp for g in route.groups if g.master_tcp})
                if not addrs:
                    return
                cids = await self.instance.consumer_ids(self.group, addrs[0])
                if self.instance.client_id not in cids:
                    # the broker has not registered us yet (or dropped us): announce and come back
                    await self.instance.heartbeat_all()
                    self._rebalance_wanted.set()
                    return
                allocated = set(allocate_averagely(mqs, cids, self.instance.client_id))
                allocated |= await self._allocate_retry_queues(cids)
            await self._update_process_queues(allocated)

    async def _allocate_retry_queues(self, cids: list[str]) -> set[MessageQueue]:
        """This member's share of the group's retry topic, which the broker creates at the first send-back."""
        assert self.retry_topic is not None
        try:
            route = await self.instance.route(self.retry_topic)
        except BrokerError as exc:
            if exc.code != "TOPIC_NOT_EXIST":
                return {mq for mq in self.pqs if mq.topic == self.retry_topic}  # unsure: keep what we have
            if self._retry_topic_expected:  # its route is on the way: look again soon
                asyncio.get_running_loop().call_later(RETRY_ROUTE_RECHECK_S, self._rebalance_wanted.set)
            return set()
        except ClientError:
            return {mq for mq in self.pqs if mq.topic == self.retry_topic}
        self._retry_topic_expected = False
        return set(allocate_averagely(route.read_queues(), cids, self.instance.client_id))

    async def _update_process_queues(self, allocated: set[MessageQueue]) -> None:
        for mq, pq in list(self.pqs.items()):
            # a queue dropped earlier whose orderly batch was still running is retried here too
            if (mq not in allocated or pq.dropped) and await self._remove_queue(mq, pq):
                del self.pqs[mq]
        new = sorted(mq for mq in allocated if mq not in self.pqs)
        if not new:
            return
        if self.orderly and not self.broadcast:
            wanted = new
            new = sorted(await self._lock(wanted))
            if len(new) < len(wanted):
                # the previous owner still holds some: it lets go once its current batch is done
                asyncio.get_running_loop().call_later(1.0, self._rebalance_wanted.set)
        for mq in new:
            try:
                offset = await self._compute_pull_from_where(mq)
            except ClientError as exc:
                log.warning("cannot find where to start %s: %s", mq, exc)
                self._rebalance_wanted.set()
                continue
            pq = ProcessQueue(mq, offset)
            if self.orderly and not self.broadcast:
                pq.locked, pq.last_lock_time = True, time.monotonic()
            self.pqs[mq] = pq
            pq.pull_task = asyncio.create_task(self._pull_loop(pq))
            log.info("%s of group %s now consumes %s from offset %d", self.instance.client_id, self.group, mq, offset)

    async def _remove_queue(self, mq: MessageQueue, pq: ProcessQueue) -> bool:
        """Stop consuming ``mq``; False when an orderly batch is still running (try again later)."""
        pq.dropped = True
        if pq.pull_task is not None:
            pq.pull_task.cancel()
        if self.orderly and not self.broadcast:
            try:
                async with asyncio.timeout(1.0):
                    await pq.consume_lock.acquire()
            except TimeoutError:
                return False
            try:
                await self._persist_offsets([mq])
                await self._unlock([mq])
            finally:
                pq.consume_lock.release()
        else:
            with contextlib.suppress(ClientError, OSError):
                await self._persist_offsets([mq])
        self.offsets.remove(mq)
        log.info("%s of group %s released %s", self.instance.client_id, self.group, mq)
        return True

    async def _compute_pull_from_where(self, mq: MessageQueue) -> int:
        off = await self.offsets.read(mq)
        if off >= 0:
            return off
        if mq.topic == self.retry_topic:
            # RocketMQ: a retry queue is read from its start, whatever consume_from says, since what
            # is in it was sent back by this group
            off = await self.instance.min_offset(mq)
        elif self.consume_from == "latest":
            off = await self.instance.max_offset(mq)
        elif self.consume_from == "earliest":
            off = await self.instance.min_offset(mq)
        else:
            assert self.consume_timestamp_ms is not None
            off = await self.instance.search_offset(mq, self.consume_timestamp_ms)
        # Record the starting point at once, so that a member taking the queue over after a crash
        # starts here too instead of at a newer "latest".
        self.offsets.update(mq, off, only_increase=False)
        with contextlib.suppress(ClientError, OSError):
            await self._persist_offsets([mq])
        return off

    # ---- queue locks (orderly) ----------------------------------------------------------------------------
    async def _by_broker(self, mqs: list[MessageQueue]) -> dict[str, list[MessageQueue]]:
        out: dict[str, list[MessageQueue]] = {}
        for mq in mqs:
            with contextlib.suppress(ClientError):
                out.setdefault(await self.instance.address(mq), []).append(mq)
        return out

    async def _lock(self, mqs: list[MessageQueue]) -> set[MessageQueue]:
        held: set[MessageQueue] = set()
        for addr, group_mqs in (await self._by_broker(mqs)).items():
            try:
                held |= await self.instance.lock_batch(self.group, addr, group_mqs)
            except (ClientError, OSError) as exc:
                log.debug("locking %s at %s failed: %s", group_mqs, addr, exc)
        return held

    async def _unlock(self, mqs: list[MessageQueue]) -> None:
        for addr, group_mqs in (await self._by_broker(mqs)).items():
            with contextlib.suppress(ClientError, OSError):
                await self.instance.unlock_batch(self.group, addr, group_mqs)

    async def _lock_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lock_interval)
            try:
                mine = [mq for mq, pq in self.pqs.items() if not pq.dropped]
                held = await self._lock(mine)
                now = time.monotonic()
                for mq in mine:
                    pq = self.pqs.get(mq)
                    if pq is not None:
                        pq.locked = mq in held
                        if pq.locked:
                            pq.last_lock_time = now
                            self._kick_orderly(pq)
            except Exception:
                log.warning("renewing queue locks of group %s failed", self.group, exc_info=True)

    # ---- pulling ------------------------------------------------------------------------------------------
    async def _pull_loop(self, pq: ProcessQueue) -> None:
        mq = pq.mq
        while self._running and not pq.dropped:
            if len(pq) >= self.pull_threshold:
                await asyncio.sleep(FLOW_CONTROL_BACKOFF_S)
                continue
            commit = None if self.broadcast else self.offsets.memory(mq)
            try:
                res = await self.instance.pull(mq, pq.next_offset, self.pull_batch_size, tags=self._tags_of(mq.topic),
                                               wait_ms=self.long_polling_ms, group=self.group, commit_offset=commit)
            except (ClientError, OSError) as exc:
                log.debug("pull %s failed: %s", mq, exc)
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                with contextlib.suppress(ClientError):
                    await self.instance.route(mq.topic, refresh=True)
                continue
            if pq.dropped:
                return
            if mq.topic == self.retry_topic:
                for m in res.messages:
                    _as_first_sent(m)
            if res.messages:
                pq.put(res.messages)
                self._dispatch(pq, res.messages)
            elif not len(pq) and res.next_offset != pq.next_offset and res.status != "NO_MATCHED_MSG":
                log.info("offset of %s moved from %d to %d (%s)", mq, pq.next_offset, res.next_offset, res.status)
            pq.next_offset = res.next_offset
            if not len(pq) and pq.max_seen < res.next_offset - 1:
                # filtered-out or expired offsets count as done, so commits move past them
                pq.max_seen = res.next_offset - 1
                self.offsets.update(mq, res.next_offset)

    def _dispatch(self, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        if self.orderly:
            self._kick_orderly(pq)
            return
        for i in range(0, len(msgs), self.batch_max):
            self._spawn(self._consume_concurrently(pq, msgs[i:i + self.batch_max]))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._consume_tasks.add(task)
        task.add_done_callback(self._consume_tasks.discard)

    # ---- consuming ----------------------------------------------------------------------------------------
    async def _call_listener(self, msgs: list[ReceivedMessage], limit_s: float | None = None) -> ConsumeResult:
        deadline = asyncio.timeout(limit_s)
        try:
            async with deadline:
                if self._is_async_listener:
                    result = await self.listener(msgs)  # type: ignore[misc]
                else:
                    result = await asyncio.get_running_loop().run_in_executor(self.executor, self.listener, msgs)
        except Exception:
            if deadline.expired():
                log.warning("listener of group %s did not finish within %.3g s (consume_timeout); the message(s) "
                            "will be consumed again", self.group, limit_s)
            else:
                log.warning("listener of group %s raised; the message(s) will be consumed again", self.group,
                            exc_info=True)
            return ConsumeResult.RECONSUME_LATER
        try:
            return ConsumeResult(result)
        except (ValueError, TypeError):
            if not self._warned_none:
                self._warned_none = True
                log.warning("listener of group %s returned %r, not a ConsumeResult; treated as RECONSUME_LATER",
                            self.group, result)
            return ConsumeResult.RECONSUME_LATER

    def _backoff(self, times: int) -> float:
        if self.broadcast and times == self.max_reconsume_times + 1:
            log.warning("message(s) of broadcasting group %s failed %d times; retrying until the listener "
                        "succeeds (broadcasting has no retry topic)", self.group, times)
        return min(0.2 * 2 ** min(times, 10), 10.0)

    async def _consume_concurrently(self, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        retry = msgs
        while True:
            if pq.dropped or not self._running:
                return  # another member (or a restart) takes it up again from the committed offset
            if await self._call_listener(retry, self.consume_timeout) is ConsumeResult.SUCCESS:
                break
            if pq.dropped or not self._running:
                return  # as RocketMQ: no send-back for a queue given up; its next owner consumes it again
            if self.retry_topic is not None:
                retry = await self._send_back(pq.mq, retry, DEFAULT_DELAY_LEVEL)
                if not retry:
                    break  # the retry topic holds them now
            for m in retry:
                m.reconsume_times += 1
            await asyncio.sleep(self._backoff(retry[0].reconsume_times))
        offset = pq.remove(msgs)
        if not pq.dropped:
            self.offsets.update(pq.mq, offset)

    async def _send_back(self, mq: MessageQueue, msgs: list[ReceivedMessage],
                         delay_level: int) -> list[ReceivedMessage]:
        """CONSUMER_SEND_MSG_BACK for each message (to the broker group that stores it); returns those the
        broker did not take, to be consumed again here."""
        taken = await asyncio.gather(*(self._send_back_one(mq, m, delay_level) for m in msgs))
        return [m for m, ok in zip(msgs, taken, strict=True) if not ok]

    async def _send_back_one(self, mq: MessageQueue, m: ReceivedMessage, delay_level: int) -> bool:
        ext = {"group": self.group, "offset": m.commit_log_offset, "delayLevel": delay_level,
               "maxReconsumeTimes": self.max_reconsume_times,
               "originMsgId": m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or m.msg_id, "originTopic": m.topic}
        try:
            addr = await self.instance.address(mq)
            resp = await self.instance.remoting.invoke(addr, RequestCode.CONSUMER_SEND_MSG_BACK, ext)
        except (ClientError, OSError) as exc:
            log.warning("sending message %s of group %s back failed (%s); it is consumed again here",
                        m.msg_id, self.group, exc)
            return False
        if resp.ext.get("deadLetter"):
            log.warning("message %s of group %s was consumed %d times without success; moved to %s",
                        m.msg_id, self.group, m.reconsume_times + 1, resp.ext.get("topic"))
        elif self.retry_topic is not None and self.instance.routes.cached(self.retry_topic) is None:
            # the broker may just have created the retry topic: subscribe to it now, not at the next rebalance
            self._retry_topic_expected = True
            self._rebalance_wanted.set()
        return True

    def _kick_orderly(self, pq: ProcessQueue) -> None:
        if not pq.consuming and len(pq):
            pq.consuming = True
            self._spawn(self._consume_orderly(pq))

    async def _consume_orderly(self, pq: ProcessQueue) -> None:
        try:
            while self._running and not pq.dropped:
                if not self.broadcast and not pq.lock_valid(self.lock_max_live_time):
                    return  # the lock loop restarts us once the lock is renewed
                msgs = pq.head(self.batch_max)
                if not msgs:
                    return
                async with pq.consume_lock:
                    if pq.dropped:
                        return
                    result = await self._call_listener(msgs)
                    if result is ConsumeResult.SUCCESS:
                        self.offsets.update(pq.mq, pq.remove(msgs))
                        continue
                    retry = msgs if self.broadcast else await self._dead_letter_exhausted(pq, msgs)
                if not retry:
                    continue
                for m in retry:
                    m.reconsume_times += 1
                await asyncio.sleep(self._backoff(retry[0].reconsume_times))
        finally:
            pq.consuming = False
            if self._running and not pq.dropped and len(pq) and (
                    self.broadcast or pq.lock_valid(self.lock_max_live_time)):
                self._kick_orderly(pq)

    async def _dead_letter_exhausted(self, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> list[ReceivedMessage]:
        """Orderly (RocketMQ's checkReconsumeTimes): messages retried ``max_reconsume_times`` times go
        straight to the dead-letter queue and count as done; returns the ones to retry in place."""
        exhausted = [m for m in msgs if m.reconsume_times >= self.max_reconsume_times]
        if not exhausted:
            return msgs
        kept = {id(m) for m in await self._send_back(pq.mq, exhausted, DEAD_LETTER_DELAY_LEVEL)}
        dead = [m for m in exhausted if id(m) not in kept]
        if dead:
            self.offsets.update(pq.mq, pq.remove(dead))
        gone = {id(m) for m in dead}
        return [m for m in msgs if id(m) not in gone]

    # ---- offsets ------------------------------------------------------------------------------------------
    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.auto_commit_interval)
            try:
                await self._persist_offsets()
            except Exception:
                log.warning("committing offsets of group %s failed", self.group, exc_info=True)

    async def _persist_offsets(self, mqs: list[MessageQueue] | None = None) -> None:
        await self.offsets.persist(mqs)

    def _check_running(self) -> None:
        if not self._running:
            raise ClientStateError("the consumer is not started")


def _as_first_sent(m: ReceivedMessage) -> None:
    """A message from the retry topic reaches the listener as it was first sent: its original topic and
    message id (stable across redeliveries, like RocketMQ's), with the reconsume count of this copy."""
    m.topic = m.properties.get(PROPERTY_RETRY_TOPIC) or m.topic
    m.msg_id = m.properties.get(PROPERTY_ORIGIN_MESSAGE_ID) or m.msg_id
