"""Delay levels, as RocketMQ's ScheduleMessageService.

A message with delay level N (1..len(messageDelayLevel)) is stored in SCHEDULE_TOPIC_XXXX queue N-1;
its consume-queue tag slot holds the delivery time (store time + the level's delay). One task per
level follows its queue: entries of one level arrive in delivery-time order, so the task only ever
looks at the head, sleeps until it is due, then moves every due entry to its real topic in one put
and records how far it got (RocketMQ's delayOffset.json, via DurableProgress). A restart resumes at
the recorded offsets: nothing pending is lost, and only deliveries after the last durable progress
record can repeat (at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from ferrymq.broker.services.messaging import MessagingService
from ferrymq.broker.services.progress import DurableProgress, cancel_tasks
from ferrymq.broker.services.system_topics import (
    SCHEDULE_TOPIC,
    TIMESTAMP_CODE_FLOOR,
    read_entries,
    release,
    store_timestamp,
)
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common import record
from ferrymq.common.errors import FerryError
from ferrymq.common.message import PROPERTY_DELAY_LEVEL, Message

log = logging.getLogger(__name__)
BATCH = 2048
IDLE_WAIT_S = 1.0
ERROR_BACKOFF_S = 0.5


def now_ms() -> int:
    return int(time.time() * 1000)


def delay_level_of(msg: Message, max_level: int) -> int:
    """The message's delay level (0 = none), capped at the highest level as RocketMQ does."""
    raw = msg.properties.get(PROPERTY_DELAY_LEVEL)
    if raw is None:
        return 0
    try:
        level = int(raw)
    except ValueError as exc:
        raise FerryError("MESSAGE_ILLEGAL", f"delay level {raw!r} is not an integer") from exc
    if level < 0:
        raise FerryError("MESSAGE_ILLEGAL", f"delay level {level} is negative")
    return min(level, max_level)


class ScheduleService:
    def __init__(self, store: MessageStore, messaging: MessagingService, levels_ms: list[int], data_dir: Path,
                 is_master: Callable[[], bool]) -> None:
        self.store = store
        self.messaging = messaging
        self.levels_ms = levels_ms
        self.is_master = is_master
        self.progress = DurableProgress(data_dir / "config" / "delayOffset.json", store)
        self.offsets: dict[int, int] = {}  # level -> next queue offset to deliver
        self._arrived: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.delivered = 0

    @property
    def max_level(self) -> int:
        return len(self.levels_ms)

    def due_ms(self, level: int, stored_at_ms: int) -> int:
        """The delivery time of a message stored now with ``level``: its consume-queue tag slot."""
        return stored_at_ms + self.levels_ms[level - 1]

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._load_offsets()
        self.store.add_arrival_listener(self._on_arrival)
        self.progress.start()
        loop = asyncio.get_running_loop()
        for level in range(1, self.max_level + 1):
            self._arrived[level] = asyncio.Event()
            self._tasks.append(loop.create_task(self._deliver_level(level), name=f"delay-level-{level}"))

    async def stop(self) -> None:
        await cancel_tasks(self._tasks)
        self._tasks.clear()
        await self.progress.stop()

    def write_final(self) -> None:
        self.progress.write_final()

    def _load_offsets(self) -> None:
        raw = self.progress.load().get("offsetTable", {})
        self.offsets = {lvl: int(raw.get(str(lvl), 0)) for lvl in range(1, self.max_level + 1)}

    def _on_arrival(self, topic: str, queue_id: int, _max_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            ev = self._arrived.get(queue_id + 1)
            if ev is not None:
                ev.set()

    def _state(self) -> dict[str, object]:
        return {"offsetTable": {str(k): v for k, v in self.offsets.items()}}

    def pending(self) -> dict[int, int]:
        return {lvl: self.store.max_offset(SCHEDULE_TOPIC, lvl - 1) - off for lvl, off in self.offsets.items()}

    # ---- delivery ---------------------------------------------------------------------------------
    async def _deliver_level(self, level: int) -> None:
        qid = level - 1
        arrived = self._arrived[level]
        loop = asyncio.get_running_loop()
        delay = self.levels_ms[level - 1]
        was_master = self.is_master()
        while True:
            try:
                if not self.is_master():
                    was_master = False
                    await asyncio.sleep(IDLE_WAIT_S)
                    continue
                if not was_master:
                    # promoted: resume from the progress on disk (a slave's copy of the master's)
                    raw = self.progress.load().get("offsetTable", {})
                    self.offsets[level] = int(raw.get(str(level), 0))
                    was_master = True
                offset = max(self.offsets[level], self.store.min_offset(SCHEDULE_TOPIC, qid))
                arrived.clear()
                entries = await loop.run_in_executor(self.messaging.readers, self._due_heads, qid, offset, delay)
                if not entries:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(arrived.wait(), IDLE_WAIT_S)
                    continue
                now = now_ms()
                due = 0
                for _qoff, _phys, _size, due_ms in entries:
                    if due_ms > now:
                        break
                    due += 1
                if due == 0:
                    await asyncio.sleep(min(entries[0][3] - now, IDLE_WAIT_S * 1000) / 1000)
                    continue
                await self._deliver(level, qid, offset, due)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("delivering delay level %d failed; retrying", level)
                await asyncio.sleep(ERROR_BACKOFF_S)

    def _due_heads(self, qid: int, offset: int, delay: int) -> list[tuple[int, int, int, int]]:
        """Entries from ``offset`` with their delivery time (thread)."""
        out = []
        for qoff, phys, size, code in read_entries(self.store, SCHEDULE_TOPIC, qid, offset, BATCH):
            if code < TIMESTAMP_CODE_FLOOR:
                ts = store_timestamp(self.store, phys)
                code = (ts or 0) + delay
            out.append((qoff, phys, size, code))
        return out

    async def _deliver(self, level: int, qid: int, offset: int, count: int) -> None:
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(self.messaging.readers, self.store.get_messages, SCHEDULE_TOPIC, qid,
                                         offset, count)
        msgs = []
        for raw in res.records:
            m = release(record.decode(raw, verify=False), drop=(PROPERTY_DELAY_LEVEL,))
            if self._fit_to_topic(m):
                msgs.append(m)
        end = 0
        if msgs:
            await self.messaging.put(msgs)
            end = self.store.commitlog.max_offset  # at or past the end of what was just put
            self.delivered += len(msgs)
        next_offset = res.next_offset if res.next_offset > offset else offset + count
        self.offsets[level] = next_offset
        self.progress.record(self._state(), end)

    def _fit_to_topic(self, m: Message) -> bool:
        cfg = self.messaging.topics.get(m.topic)
        if cfg is None:
            log.warning("dropping a delayed message for %r: the topic no longer exists", m.topic)
            return False
        if not 0 <= m.queue_id < cfg.writeQueueNums:
            m.queue_id %= cfg.writeQueueNums  # the topic shrank while the message waited
        return True
