"""Timer messages (``deliverAtMs``), as RocketMQ 5's TimerMessageStore: a timing wheel over a
time-bucketed log.

1. The put: a message due at T is stored in ``rmq_sys_wheel_timer`` queue 0 with T in its tag slot
   (so it is durable and replicated like any message).
2. Enqueue: a task follows that queue and appends (T, commit-log offset, size) to the *bucket file*
   of T's minute (``timer/buckets/<minute start ms>.log``), fsyncs it, then records the queue offset.
   The bucket files are the time-bucketed log: everything due in one minute is in one file.
3. The wheel: the buckets of the current and the next minute are loaded into memory, in slots of
   ``timerPrecisionMs``. Every tick the slots that are due are taken out, their messages put to the
   real topic in one batch, and ``deliveredUpToMs`` advances. A bucket file goes once a durable
   checkpoint lies past its minute.

Checkpoint (``config/timerCheckpoint.json``): ``enqueueOffset`` and ``deliveredUpToMs`` (everything
due before it was delivered). A restart re-reads the queue from ``enqueueOffset`` (entries already in a
bucket file are de-duplicated by commit-log offset) and reloads the buckets from ``deliveredUpToMs``.
An entry that arrives for a time already passed is filed at ``deliveredUpToMs`` and goes at the next
tick, so nothing slips behind the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path

from ferrymq.broker.services.messaging import MessagingService
from ferrymq.broker.services.progress import DurableProgress, cancel_tasks
from ferrymq.broker.services.system_topics import TIMER_TOPIC, TIMESTAMP_CODE_FLOOR, read_entries, release
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common import record
from ferrymq.common.errors import FerryError
from ferrymq.common.message import PROPERTY_TIMER_DELIVER_MS, Message

log = logging.getLogger(__name__)
BUCKET_MS = 60_000
ENTRY = struct.Struct(">qqi")  # deliver ms, commit-log offset, size
ENQUEUE_BATCH = 2048
IDLE_WAIT_S = 1.0
ERROR_BACKOFF_S = 0.5
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
TIMER_PROPERTIES = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS)

Entry = tuple[int, int, int]  # (deliver ms, phys, size)


def now_ms() -> int:
    return int(time.time() * 1000)


def deliver_at_of(msg: Message, now: int, max_delay_sec: int) -> int | None:
    """When a message asks to be delivered (TIMER_DELIVER_MS, or TIMER_DELAY_SEC/MS from now); None
    for an ordinary message. Refuses times beyond ``timerMaxDelaySec``."""
    props = msg.properties
    if PROPERTY_TIMER_DELIVER_MS in props:
        name, base, unit = PROPERTY_TIMER_DELIVER_MS, 0, 1
    elif PROPERTY_TIMER_DELAY_MS in props:
        name, base, unit = PROPERTY_TIMER_DELAY_MS, now, 1
    elif PROPERTY_TIMER_DELAY_SEC in props:
        name, base, unit = PROPERTY_TIMER_DELAY_SEC, now, 1000
    else:
        return None
    try:
        value = int(props[name])
    except ValueError as exc:
        raise FerryError("MESSAGE_ILLEGAL", f"{name} {props[name]!r} is not an integer") from exc
    if value < 0:
        raise FerryError("MESSAGE_ILLEGAL", f"{name} must not be negative")
    at = base + value * unit
    if at - now > max_delay_sec * 1000:
        raise FerryError("MESSAGE_ILLEGAL",
                         f"delivery is {(at - now) // 1000} s away; timerMaxDelaySec is {max_delay_sec}")
    return at


def bucket_of(ms: int) -> int:
    return ms - ms % BUCKET_MS


class TimerService:
    def __init__(self, store: MessageStore, messaging: MessagingService, data_dir: Path, *, precision_ms: int,
                 is_master: Callable[[], bool]) -> None:
        self.store = store
        self.messaging = messaging
        self.precision = precision_ms
        self.is_master = is_master
        self.dir = data_dir / "timer" / "buckets"
        self.progress = DurableProgress(data_dir / "config" / "timerCheckpoint.json", store)
        self.enqueue_offset = 0
        self.delivered_up_to = 0
        self.buckets: set[int] = set()  # bucket files on disk
        self.loaded: set[int] = set()  # buckets whose entries are in the wheel
        self.wheel: dict[int, list[Entry]] = {}  # slot start ms -> entries
        self.in_wheel: set[int] = set()  # commit-log offsets in the wheel (de-duplication)
        self._lock = asyncio.Lock()
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.delivered = 0
        self._last_recorded = 0
        self._master_state = False

    # ---- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._load()
        self.store.add_arrival_listener(self._on_arrival)
        self.progress.start()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._enqueue_loop(), name="timer-enqueue"),
                       loop.create_task(self._tick_loop(), name="timer-tick")]

    async def stop(self) -> None:
        await cancel_tasks(self._tasks)
        self._tasks.clear()
        await self.progress.stop()

    def write_final(self) -> None:
        self.progress.write_final()

    def _load(self) -> None:
        cp = self.progress.load()
        self.enqueue_offset = int(cp.get("enqueueOffset", 0))
        self.delivered_up_to = int(cp.get("deliveredUpToMs", 0))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.buckets = {int(p.stem) for p in self.dir.glob("*.log") if p.stem.isdigit()}
        self.loaded.clear()
        self.wheel.clear()
        self.in_wheel.clear()
        self._master_state = self.is_master()

    async def _ready(self) -> bool:
        """True when this replica is master with its state loaded (reloaded after a promotion)."""
        if not self.is_master():
            self._master_state = False
            return False
        if not self._master_state:
            async with self._lock:
                if not self._master_state:
                    await asyncio.to_thread(self._load)
        return True

    def _on_arrival(self, topic: str, _queue_id: int, _max_offset: int) -> None:
        if topic == TIMER_TOPIC:
            self._arrived.set()

    def _state(self) -> dict[str, int]:
        return {"enqueueOffset": self.enqueue_offset, "deliveredUpToMs": self.delivered_up_to}

    def pending(self) -> int:
        return sum(len(v) for v in self.wheel.values()) + (self.store.max_offset(TIMER_TOPIC, 0) - self.enqueue_offset)

    # ---- enqueue: timer queue -> bucket files ------------------------------------------------------
    async def _enqueue_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                if not await self._ready():
                    await asyncio.sleep(IDLE_WAIT_S)
                    continue
                self._arrived.clear()
                start = max(self.enqueue_offset, self.store.min_offset(TIMER_TOPIC, 0))
                entries = await loop.run_in_executor(self.messaging.readers, self._read_new, start)
                if not entries:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._arrived.wait(), IDLE_WAIT_S)
                    continue
                async with self._lock:
                    filed = [(max(at, self.delivered_up_to), phys, size) for _q, phys, size, at in entries]
                    await asyncio.to_thread(self._append_buckets, filed)
                    for e in filed:
                        if bucket_of(e[0]) in self.loaded:
                            self._add(e)
                    self.enqueue_offset = entries[-1][0] + 1
                    log_end = max(phys + size for _q, phys, size, _at in entries)
                    self.progress.record(self._state(), log_end)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer enqueue failed; retrying")
                await asyncio.sleep(ERROR_BACKOFF_S)

    def _read_new(self, start: int) -> list[tuple[int, int, int, int]]:
        out = []
        for qoff, phys, size, code in read_entries(self.store, TIMER_TOPIC, 0, start, ENQUEUE_BATCH):
            if code < TIMESTAMP_CODE_FLOOR:
                code = self._deliver_ms_from_record(phys, size)
            out.append((qoff, phys, size, code))
        return out

    def _deliver_ms_from_record(self, phys: int, size: int) -> int:
        raw = self.store.read_message(phys, size)
        if raw is None:
            return 0  # unreadable: file it as due now; delivery skips what it cannot read
        try:
            return int(record.decode(raw, verify=False).properties.get(PROPERTY_TIMER_DELIVER_MS, "0"))
        except ValueError:
            return 0

    def _append_buckets(self, entries: list[Entry]) -> None:
        by_bucket: dict[int, bytearray] = {}
        for e in entries:
            by_bucket.setdefault(bucket_of(e[0]), bytearray()).extend(ENTRY.pack(*e))
        for bucket, data in by_bucket.items():
            fd = os.open(self.dir / f"{bucket}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            self.buckets.add(bucket)

    # ---- the wheel --------------------------------------------------------------------------------
    def _add(self, e: Entry) -> None:
        if e[1] in self.in_wheel:
            return
        self.in_wheel.add(e[1])
        slot = e[0] - e[0] % self.precision
        self.wheel.setdefault(slot, []).append(e)

    def _load_bucket(self, bucket: int) -> list[Entry]:
        try:
            data = (self.dir / f"{bucket}.log").read_bytes()
        except FileNotFoundError:
            return []
        n = len(data) // ENTRY.size
        return [ENTRY.unpack_from(data, i * ENTRY.size) for i in range(n)]

    async def _ensure_loaded(self, up_to: int) -> None:
        for bucket in sorted(b for b in self.buckets if b < up_to and b not in self.loaded):
            entries = await asyncio.to_thread(self._load_bucket, bucket)
            for e in entries:
                if e[0] >= self.delivered_up_to:
                    self._add(e)
            self.loaded.add(bucket)

    async def _tick_loop(self) -> None:
        while True:
            try:
                await asyncio.sleep(self.precision / 1000 - (time.time() * 1000 % self.precision) / 1000)
                if not await self._ready():
                    continue
                async with self._lock:
                    await self._tick(now_ms())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("timer tick failed; retrying")
                await asyncio.sleep(ERROR_BACKOFF_S)

    async def _tick(self, now: int) -> None:
        await self._ensure_loaded(bucket_of(now) + 2 * BUCKET_MS)
        due_slots = [s for s in self.wheel if s <= now]
        due: list[Entry] = []
        for s in sorted(due_slots):
            keep = []
            for e in self.wheel.pop(s):
                (due if e[0] <= now else keep).append(e)
            if keep:
                self.wheel[s] = keep
        end = 0
        if due:
            end = await self._deliver(due)
            for e in due:
                self.in_wheel.discard(e[1])
        self.delivered_up_to = max(self.delivered_up_to, now + 1)
        # An idle wheel records its position only once a minute: a restart then merely re-scans a
        # little more of an empty stretch.
        if due or now - self._last_recorded >= BUCKET_MS:
            self._last_recorded = now
            self.progress.record(self._state(), end)
        await self._drop_old_buckets()

    async def _deliver(self, due: list[Entry]) -> int:
        loop = asyncio.get_running_loop()
        raws = await loop.run_in_executor(self.messaging.readers, self._read_records, due)
        msgs = []
        for raw in raws:
            if raw is None:
                continue
            stored = record.decode(raw, verify=False)
            if stored.topic != TIMER_TOPIC:
                continue  # the log was cut back by recovery and this offset now holds another record
            m = release(stored, drop=TIMER_PROPERTIES)
            cfg = self.messaging.topics.get(m.topic)
            if cfg is None:
                log.warning("dropping a timer message for %r: the topic no longer exists", m.topic)
                continue
            if not 0 <= m.queue_id < cfg.writeQueueNums:
                m.queue_id %= cfg.writeQueueNums
            msgs.append(m)
        if not msgs:
            return 0
        await self.messaging.put(msgs)
        self.delivered += len(msgs)
        return self.store.commitlog.max_offset

    def _read_records(self, due: list[Entry]) -> list[bytes | None]:
        return [self.store.read_message(phys, size) for _at, phys, size in sorted(due, key=lambda e: e[1])]

    async def _drop_old_buckets(self) -> None:
        written = self.progress.written
        if written is None:
            return
        safe = int(written.get("deliveredUpToMs", 0))
        old = [b for b in self.buckets if b + BUCKET_MS <= safe]
        for b in old:
            await asyncio.to_thread(lambda b=b: (self.dir / f"{b}.log").unlink(missing_ok=True))
            self.buckets.discard(b)
            self.loaded.discard(b)
