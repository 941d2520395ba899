"""Delay, timer, transactional and retry messages: the wiring of their services, and the send router.

The router is the one hook in the send path: ``MessagingService.send`` hands every batch to it.
Ordinary messages pass straight to ``MessagingService.put``; a message with a delay level, a delivery
time or TRAN_MSG is parked in its system topic instead (SCHEDULE_TOPIC_XXXX, rmq_sys_wheel_timer,
RMQ_SYS_TRANS_HALF_TOPIC) with the delivery time in its consume-queue tag slot, in the same single
append as the rest of its batch. Send results name the real queue the message is bound for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from ferrymq.broker.services.messaging import SendResult
from ferrymq.broker.services.progress import DurableProgress
from ferrymq.broker.services.retry import RetryService
from ferrymq.broker.services.schedule import ScheduleService, delay_level_of
from ferrymq.broker.services.system_topics import SCHEDULE_TOPIC, TIMER_TOPIC, ensure_system_topics, hold_in
from ferrymq.broker.services.timer import TIMER_PROPERTIES, TimerService, deliver_at_of
from ferrymq.broker.services.transaction import TransactionService
from ferrymq.common.durable import write_json_atomic
from ferrymq.common.durations import parse_delay_levels
from ferrymq.common.errors import FerryError
from ferrymq.common.message import PROPERTY_DELAY_LEVEL, PROPERTY_TRANSACTION_PREPARED, Message, tags_hash

if TYPE_CHECKING:
    from ferrymq.broker.server import Broker

ROLE_POLL_S = 1.0
ROUTED_PROPERTIES = frozenset({PROPERTY_DELAY_LEVEL, PROPERTY_TRANSACTION_PREPARED, *TIMER_PROPERTIES})


class MessageTypes:
    def __init__(self, broker: Broker) -> None:
        c = broker.config
        self.broker = broker
        self.messaging = broker.messaging
        self.levels_ms = parse_delay_levels(c.message_delay_level)
        self.timer_max_delay_sec = c.timer_max_delay_sec
        data_dir = broker.data_dir

        def is_master() -> bool:
            return broker.role == "master"

        self.schedule = ScheduleService(broker.store, broker.messaging, self.levels_ms, data_dir, is_master)
        self.timer = TimerService(broker.store, broker.messaging, data_dir, precision_ms=c.timer_precision_ms,
                                  is_master=is_master)
        self.transactions = TransactionService(
            broker.store, broker.messaging, broker.groups, data_dir,
            check_interval_ms=c.transaction_check_interval, timeout_ms=c.transaction_time_out,
            check_max=c.transaction_check_max, url_prefixes=c.transaction_check_url_prefixes,
            callback_timeout_ms=c.transaction_check_callback_timeout, is_master=is_master)
        self.transactions.put_routed = self.put
        self.retry = RetryService(broker.store, broker.messaging, self.put,
                                  max_reconsume_times=c.max_reconsume_times, max_delay_level=len(self.levels_ms),
                                  on_topics_changed=broker.on_topics_changed)
        broker.messaging.send_router = self.put
        self._watch: asyncio.Task[None] | None = None
        self._topics_ensured = False

    async def start(self) -> None:
        if self.broker.role == "master":
            await self._ensure_system_topics()
        self.schedule.start()
        self.timer.start()
        await self.transactions.start()
        self._watch = asyncio.get_running_loop().create_task(self._watch_role(), name="message-types-role")

    async def _ensure_system_topics(self) -> None:
        if await asyncio.to_thread(ensure_system_topics, self.broker.topics, len(self.levels_ms)):
            self.broker.on_topics_changed()
        self._topics_ensured = True

    async def _watch_role(self) -> None:
        # A replica promoted to master creates the system topics it may never have had.
        while True:
            await asyncio.sleep(ROLE_POLL_S)
            if self.broker.role != "master":
                self._topics_ensured = False
            elif not self._topics_ensured:
                with contextlib.suppress(OSError):
                    await self._ensure_system_topics()

    async def stop(self) -> None:
        """Stop delivering (before the store shuts down)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.transactions.stop()
        await self.timer.stop()
        await self.schedule.stop()

    def write_final(self) -> None:
        """After the store's shutdown flushed the log: persist the last progress (blocking)."""
        self.schedule.write_final()
        self.timer.write_final()
        self.transactions.write_final()

    def _progress_files(self) -> dict[str, DurableProgress]:
        return {"delayOffset": self.schedule.progress, "timerCheckpoint": self.timer.progress,
                "transactionCheck": self.transactions.progress}

    def progress_snapshot(self) -> dict[str, Any]:
        """The durable progress of each service, for slaves to copy (as RocketMQ's syncDelayOffset)."""
        return {name: p.written or {} for name, p in self._progress_files().items()}

    def adopt_progress(self, snapshot: dict[str, Any]) -> None:
        """On a slave: store the master's progress, so that a promotion resumes where the master was.
        Blocking file I/O; refused on a master, whose own progress is the truth."""
        if self.broker.role == "master":
            raise FerryError("SERVICE_NOT_AVAILABLE", "a master does not adopt another replica's progress")
        for name, p in self._progress_files().items():
            state = snapshot.get(name)
            if isinstance(state, dict) and state:
                write_json_atomic(p.path, state)

    def stats(self) -> dict[str, Any]:
        return {"delay": {"delivered": self.schedule.delivered,
                          "pending": {str(k): v for k, v in self.schedule.pending().items() if v}},
                "timer": {"delivered": self.timer.delivered, "pending": self.timer.pending(),
                          "deliveredUpToMs": self.timer.delivered_up_to},
                "transactions": {"open": len(self.transactions.open), **self.transactions.stats},
                "retry": {"sentBack": self.retry.sent_back, "deadLettered": self.retry.dead_lettered}}

    # ---- the send router ----------------------------------------------------------------------------
    async def put(self, msgs: list[Message]) -> list[SendResult]:
        routed = [i for i, m in enumerate(msgs) if not ROUTED_PROPERTIES.isdisjoint(m.properties)]
        if not routed:
            return await self.messaging.put(msgs)
        now = int(time.time() * 1000)
        codes = [tags_hash(m.properties.get("TAGS")) for m in msgs]
        real_queues = [m.queue_id for m in msgs]
        txid: str | None = None
        for i in routed:
            m = msgs[i]
            if m.properties.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true":
                if len(msgs) > 1:
                    raise FerryError("MESSAGE_ILLEGAL", "a transactional message cannot be sent in a batch")
                txid = self.transactions.prepare(m)
                continue
            at = deliver_at_of(m, now, self.timer_max_delay_sec)
            level = delay_level_of(m, len(self.levels_ms))
            if at is not None and level:
                raise FerryError("MESSAGE_ILLEGAL", "give a delay level or a delivery time, not both")
            if at is not None and at > now:
                hold_in(m, TIMER_TOPIC, 0)
                codes[i] = at
            elif level:
                hold_in(m, SCHEDULE_TOPIC, level - 1)
                codes[i] = now + self.levels_ms[level - 1]
        try:
            results = await self.messaging.put(msgs, codes)
        except BaseException:
            if txid is not None:
                self.transactions.prepare_failed(txid)
            raise
        for r, qid in zip(results, real_queues, strict=True):
            r.queue_id = qid
        if txid is not None:
            self.transactions.prepared(txid, results[0])
        return results
