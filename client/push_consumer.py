"""The push consumer (RocketMQ's DefaultMQPushConsumer): long-polling pulls, a listener on a worker
pool, rebalancing among the group's members, and at-least-once offsets.

Clustering: the group's live members share the topic's read queues (AllocateMessageQueueAveragely);
each rebalances at start, when the broker says the member set changed, and every
``rebalance_interval``. Broadcasting: every member takes every queue, offsets stay with the client.

At-least-once: a message's offset is committed only after its listener returned SUCCESS, and only up
to the lowest offset still not done. A listener that returns RECONSUME_LATER (or raises) gets the
same message again after a backoff; it is never skipped (retry topics and the DLQ come with issue #4).

Orderly: a member consumes a queue only while it holds the queue's lock on the broker, one batch at a
time in offset order; it renews its locks every ``lock_interval`` and releases a queue only after its
current batch finished and its offset was committed.
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

from ferrymq.client.allocate import allocate_averagely
from ferrymq.client.errors import ClientError, ClientStateError, client_checked
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import ConsumeResult, MessageQueue, ReceivedMessage
from ferrymq.client.offset_store import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from ferrymq.client.process_queue import ProcessQueue
from ferrymq.common.limits import check_group, check_topic

log = logging.getLogger(__name__)

Listener = Callable[[list[ReceivedMessage]], ConsumeResult | Awaitable[ConsumeResult]]
CONSUME_FROM = {"latest": "CONSUME_FROM_LAST_OFFSET", "earliest": "CONSUME_FROM_FIRST_OFFSET",
                "timestamp": "CONSUME_FROM_TIMESTAMP"}
PULL_ERROR_BACKOFF_S = 1.0  # RocketMQ's pullTimeDelayMillsWhenException is 3 s; tests like it shorter
FLOW_CONTROL_BACKOFF_S = 0.05


class AsyncPushConsumer:
    def __init__(self, url: str, group: str, topic: str, listener: Listener, tags: str = "*", *,
                 orderly: bool = False, broadcast: bool = False, max_reconsume_times: int = 16,
                 consume_from: str = "latest", consume_timestamp_ms: int | None = None,
                 consume_thread_count: int = 8, consume_batch_max_size: int = 1, pull_batch_size: int = 32,
                 pull_threshold_for_queue: int = 1000, long_polling_ms: int = 15_000,
                 auto_commit_interval: float = 5.0, rebalance_interval: float = 20.0, lock_interval: float = 20.0,
                 lock_max_live_time: float = 30.0, heartbeat_interval: float = 30.0,
                 offset_store_dir: str | Path | None = None, instance_name: str | None = None) -> None:
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
                "subscriptions": [{"topic": self.topic, "expression": self.tags}]}

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
            await self._update_process_queues(allocated)

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
        if self.consume_from == "latest":
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
                res = await self.instance.pull(mq, pq.next_offset, self.pull_batch_size, tags=self.tags,
                                               wait_ms=self.long_polling_ms, group=self.group, commit_offset=commit)
            except (ClientError, OSError) as exc:
                log.debug("pull %s failed: %s", mq, exc)
                await asyncio.sleep(PULL_ERROR_BACKOFF_S)
                with contextlib.suppress(ClientError):
                    await self.instance.route(mq.topic, refresh=True)
                continue
            if pq.dropped:
                return
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
    async def _call_listener(self, msgs: list[ReceivedMessage]) -> ConsumeResult:
        try:
            if self._is_async_listener:
                result = await self.listener(msgs)  # type: ignore[misc]
            else:
                result = await asyncio.get_running_loop().run_in_executor(self.executor, self.listener, msgs)
        except Exception:
            log.warning("listener of group %s raised; the message(s) will be consumed again", self.group,
                        exc_info=True)
            return ConsumeResult.RECONSUME_LATER
        if result is None:
            if not self._warned_none:
                self._warned_none = True
                log.warning("listener of group %s returned None; treated as RECONSUME_LATER", self.group)
            return ConsumeResult.RECONSUME_LATER
        return ConsumeResult(result)

    def _backoff(self, times: int) -> float:
        if times > self.max_reconsume_times:
            log.warning("message(s) of group %s failed %d times; retrying until the listener succeeds "
                        "(dead-letter queues arrive with issue #4)", self.group, times)
        return min(0.2 * 2 ** min(times, 10), 10.0)

    async def _consume_concurrently(self, pq: ProcessQueue, msgs: list[ReceivedMessage]) -> None:
        while True:
            if pq.dropped or not self._running:
                return  # another member (or a restart) takes it up again from the committed offset
            if await self._call_listener(msgs) is ConsumeResult.SUCCESS:
                break
            for m in msgs:
                m.reconsume_times += 1
            await asyncio.sleep(self._backoff(msgs[0].reconsume_times))
        offset = pq.remove(msgs)
        if not pq.dropped:
            self.offsets.update(pq.mq, offset)

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
                for m in msgs:
                    m.reconsume_times += 1
                await asyncio.sleep(self._backoff(msgs[0].reconsume_times))
        finally:
            pq.consuming = False
            if self._running and not pq.dropped and len(pq) and (
                    self.broadcast or pq.lock_valid(self.lock_max_live_time)):
                self._kick_orderly(pq)

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
