"""The message store: commit log + consume queues + dispatch + flush + checkpoint + recovery + retention.

Threads: the event loop appends and dispatches; the flush service fsyncs the commit log; the
consume-queue flusher fsyncs queues and writes the checkpoint; the retention service deletes old
segments. Reads run in a small thread pool (``get_messages`` is thread-safe).

Visibility: a message is dispatched into its consume queue (and so becomes pullable) only once it is
as durable as the flush policy promises: at once under ASYNC_FLUSH, after its fsync under
SYNC_FLUSH. Replication adds its own limit (``extra_visibility_limit``). So a consumer never sees a
message that a crash could take back and hand to another message's offset.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ferrymq.broker.store.checkpoint import Checkpoint, CheckpointFile
from ferrymq.broker.store.commitlog import Appended, Batch, CommitLog, batches_of
from ferrymq.broker.store.consume_queue import ConsumeQueue
from ferrymq.broker.store.flush import FlushTimeout, GroupCommitService, IntervalFlushService
from ferrymq.broker.store.recovery import RecoveryReport, recover_commitlog
from ferrymq.broker.store.retention import RetentionService
from ferrymq.common import record
from ferrymq.common.config import FlushDiskType, StoreConfig
from ferrymq.common.errors import FerryError
from ferrymq.common.message import PROPERTY_TAGS, Message, decode_properties, tags_hash

log = logging.getLogger(__name__)

# GetMessageStatus, as RocketMQ names them
FOUND = "FOUND"
NO_NEW_MSG = "NO_NEW_MSG"
NO_MATCHED_MSG = "NO_MATCHED_MSG"
OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"

MAX_SCAN_ENTRIES = 16_000


@dataclass
class GetResult:
    status: str
    # Views into the blocks read from the log (no copy per record); bytes-like, decode with record.decode.
    records: list[bytes | memoryview] = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    skipped_corrupt: int = 0


@dataclass
class StoreStats:
    corrupt_records_skipped: int = 0
    flush_latency_observer: Callable[[float], None] | None = None


def disk_used_ratio(path: Path) -> float:
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    if total == 0:
        return 0.0
    return 1.0 - (st.f_bavail * st.f_frsize) / total


class MessageStore:
    def __init__(
        self,
        config: StoreConfig,
        store_host: bytes = b"\x7f\x00\x00\x01\x00\x00\x00\x00",
        *,
        disk_usage: Callable[[Path], float] = disk_used_ratio,
        on_flush_latency: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config
        self.root = Path(config.store_path_root_dir)
        self.commitlog = CommitLog(self.root, config.mapped_file_size_commit_log, store_host,
                                   preallocate=config.preallocate_commit_log)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._cq_root = self.root / "consumequeue"
        self._checkpoint = CheckpointFile(self.root / "checkpoint")
        self._abort = self.root / "abort"
        # Appended but not yet dispatched (not visible), in log order.
        self._pending: collections.deque[Batch] = collections.deque()
        self.dispatched_offset = 0
        self.sync_flush = config.flush_disk_type == FlushDiskType.SYNC_FLUSH
        # An extra cap on what is visible (replication's confirm offset); None = no cap.
        self.extra_visibility_limit: Callable[[], int] | None = None
        self._arrival_listeners: list[Callable[[str, int, int], None]] = []
        # Called on the loop after every append and every flush (replication wakes its senders).
        self.log_listeners: list[Callable[[], None]] = []
        self._dirty_queues: set[ConsumeQueue] = set()
        self._dirty_lock = threading.Lock()
        self._disk_usage = disk_usage
        self._on_flush_latency = on_flush_latency
        self.disk_full = False
        self.last_disk_ratio = 0.0  # as the retention service last measured it
        self.stats = StoreStats()
        self.recovery: RecoveryReport | None = None
        self.clean_start = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flusher: GroupCommitService | IntervalFlushService | None = None
        self._cq_flusher: threading.Thread | None = None
        self._retention: RetentionService | None = None
        self._stopping = threading.Event()
        self._started = False

    # ---- lifecycle --------------------------------------------------------------------------------
    def load(self) -> None:
        """Open files and recover; blocking, so call it before serving (or in a thread)."""
        self.root.mkdir(parents=True, exist_ok=True)
        crashed = self._abort.exists()
        cp = self._checkpoint.load()
        self.commitlog.files.load()
        self._load_queues()
        if cp is not None and cp.clean and not crashed:
            self._clean_start(cp)
        elif cp is None and not crashed and not self.commitlog.files.segments and not self.queues:
            self.clean_start = True  # a new, empty store
        else:
            self._crash_recovery(cp)
        fd = os.open(self._abort, os.O_WRONLY | os.O_CREAT, 0o644)
        os.close(fd)
        self._checkpoint.save(Checkpoint(log_flushed=self.commitlog.max_offset,
                                         dispatched=self.dispatched_offset))

    def _load_queues(self) -> None:
        if not self._cq_root.exists():
            return
        for topic_dir in self._cq_root.iterdir():
            if not topic_dir.is_dir():
                continue
            for qdir in topic_dir.iterdir():
                if qdir.is_dir() and qdir.name.lstrip("-").isdigit():
                    cq = ConsumeQueue(self._cq_root, topic_dir.name, int(qdir.name),
                                      self.config.consume_queue_entries_per_file)
                    cq.load()
                    self.queues[(cq.topic, cq.queue_id)] = cq

    def _clean_start(self, cp: Checkpoint) -> None:
        self.clean_start = True
        files = self.commitlog.files
        end = cp.write_offset
        if files.segments and not files.segments[0].base <= end <= files.segments[-1].end:
            raise RuntimeError(f"checkpoint says the log ends at {end}, outside its segments")
        files.write_offset = files.flushed_offset = max(end, files.min_offset)
        for cq in self.queues.values():
            cq.truncate_beyond(end)
        self.dispatched_offset = files.write_offset
        self._rebuild_queue_offsets()
        self._correct_queue_minimums()

    def _crash_recovery(self, cp: Checkpoint | None) -> None:
        start = cp.recover_from if cp is not None else 0
        log.warning("store %s was not shut down cleanly; recovering from offset %d", self.root, start)
        redispatch: list[tuple[int, int, str, int, int, int]] = []

        def on_record(buf: bytes, i: int) -> None:
            size, qid, qoff, _ts, topic, props, _sysflag = record.dispatch_fields(buf, i)
            (phys,) = record.struct.unpack_from(">q", buf, i + record.OFF_PHYSICAL_OFFSET)
            tags = decode_properties(props).get(PROPERTY_TAGS) if props else None
            redispatch.append((phys, size, topic, qid, qoff, tags_hash(tags)))

        self.recovery = recover_commitlog(self.commitlog, start, self.root / "corrupt", on_record)
        end = self.recovery.end
        for cq in self.queues.values():
            cq.truncate_beyond(end)
        for phys, size, topic, qid, qoff, code in redispatch:
            self._queue(topic, qid).put(qoff, phys, size, code)
        for cq in self.queues.values():
            cq.flush()
        self.commitlog.files.flush_all()
        self.dispatched_offset = end
        self._rebuild_queue_offsets()
        self._correct_queue_minimums()
        log.warning("recovery done: %s", self.recovery)

    def _rebuild_queue_offsets(self) -> None:
        self.commitlog.queue_offsets = {key: cq.max_offset for key, cq in self.queues.items()}

    def _correct_queue_minimums(self) -> None:
        log_min = self.commitlog.min_offset
        for cq in self.queues.values():
            cq.correct_min_offset(log_min)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the flush, checkpoint and retention threads; ``load()`` must have run."""
        self._loop = loop or asyncio.get_running_loop()
        files = self.commitlog.files
        if self.sync_flush:
            self._flusher = GroupCommitService(files, self._loop, self._on_log_flushed, self._on_flush_latency)
        else:
            self._flusher = IntervalFlushService(
                files, self._loop, self._on_log_flushed, self._on_flush_latency,
                interval_ms=self.config.flush_interval_commit_log,
                least_pages=self.config.flush_commit_log_least_pages,
                thorough_ms=self.config.flush_commit_log_thorough_interval,
            )
        self._flusher.start()
        self._cq_flusher = threading.Thread(target=self._cq_flush_loop, name="cq-flush", daemon=True)
        self._cq_flusher.start()
        self._retention = RetentionService(self, self._disk_usage)
        self._retention.start()
        self._started = True

    def shutdown(self) -> None:
        """Flush everything, write a clean checkpoint and close files. Safe to call twice."""
        if not self._started:
            self._close_files()
            return
        self._started = False
        self._stopping.set()
        if self._retention is not None:
            self._retention.stop()
        if self._flusher is not None:
            self._flusher.stop()
        if self._cq_flusher is not None:
            self._cq_flusher.join()
        self.commitlog.files.flush_all()
        # Everything written is durable now: make it visible so the clean checkpoint covers it.
        self._dispatch_up_to(self.commitlog.max_offset)
        for cq in list(self.queues.values()):
            cq.flush()
        self._checkpoint.save(Checkpoint(log_flushed=self.commitlog.max_offset,
                                         dispatched=self.dispatched_offset,
                                         write_offset=self.commitlog.max_offset, clean=True))
        self._abort.unlink(missing_ok=True)
        self._close_files()

    def _close_files(self) -> None:
        self.commitlog.files.close()
        for cq in self.queues.values():
            cq.close()

    # ---- write path -------------------------------------------------------------------------------
    def check_writable(self) -> None:
        if self.disk_full:
            raise FerryError("SERVICE_NOT_AVAILABLE",
                             "the broker's disk is nearly full; writes are refused until space is freed",
                             reason="DISK_FULL")
        if self._flusher is not None and self._flusher.error is not None:
            raise FerryError("SERVICE_NOT_AVAILABLE", f"the flush thread failed: {self._flusher.error}")

    def append(self, msgs: list[Message], tags_codes: list[int] | None = None) -> list[Appended]:
        """Write to the commit log (page cache); the caller then awaits ``wait_durable``."""
        self.check_writable()
        recs = self.commitlog.append(msgs, tags_codes)
        self._pending.extend(batches_of(recs))
        self._appended()
        return recs

    def append_batch(self, topic: str, queue_id: int, bodies: list[bytes],
                     props: list[dict[str, str] | None] | None = None, *, born_timestamp: int = 0,
                     flag: int = 0) -> Batch:
        """``append`` of bodies bound for one queue, without a Message per body (the batch send path)."""
        self.check_writable()
        batch = self.commitlog.append_batch(topic, queue_id, bodies, props, born_timestamp=born_timestamp,
                                            flag=flag)
        self._pending.append(batch)
        self._appended()
        return batch

    def _appended(self) -> None:
        if not self.sync_flush:
            self._dispatch_up_to(self._visibility_limit(self.commitlog.max_offset))
        for fn in self.log_listeners:
            fn()

    async def wait_durable(self, end_offset: int) -> None:
        """Under SYNC_FLUSH, wait for the fsync covering ``end_offset`` (FLUSH_DISK_TIMEOUT after
        syncFlushTimeout); under ASYNC_FLUSH return at once."""
        if not self.sync_flush:
            return
        assert isinstance(self._flusher, GroupCommitService)
        try:
            await self._flusher.wait_flushed(end_offset, self.config.sync_flush_timeout / 1000)
        except FlushTimeout as exc:
            raise FerryError("FLUSH_DISK_TIMEOUT",
                             f"the message was written but its fsync did not finish within "
                             f"{self.config.sync_flush_timeout} ms") from exc

    async def put(self, msgs: list[Message], tags_codes: list[int] | None = None) -> list[Appended]:
        recs = self.append(msgs, tags_codes)
        if recs:
            await self.wait_durable(recs[-1].end)
        return recs

    def fail_flush_waiters(self, exc: BaseException) -> None:
        """Fail every put still waiting for its fsync (the replica lost mastership meanwhile)."""
        if isinstance(self._flusher, GroupCommitService):
            self._flusher.fail_all(exc)

    def _on_log_flushed(self, flushed: int) -> None:
        if isinstance(self._flusher, GroupCommitService):
            self._flusher.resolve(flushed)
        if self.sync_flush:
            self._dispatch_up_to(self._visibility_limit(flushed))
        for fn in self.log_listeners:
            fn()

    def _visibility_limit(self, limit: int) -> int:
        if self.extra_visibility_limit is not None:
            return min(limit, self.extra_visibility_limit())
        return limit

    def redispatch(self) -> None:
        """Re-evaluate visibility (replication calls this when its confirm offset moves)."""
        base = self.commitlog.files.flushed_offset if self.sync_flush else self.commitlog.max_offset
        self._dispatch_up_to(self._visibility_limit(base))

    def _dispatch_up_to(self, limit: int) -> None:
        pending = self._pending
        if not pending:
            return
        head = pending[0]
        if head.offsets[0] + head.sizes[0] > limit:
            return
        # Each queue's entries are consecutive queue offsets (offsets are assigned in log order), so
        # batches are merged per queue and written with one pwrite each, however producers interleave.
        runs: dict[tuple[str, int], list[Batch]] = {}
        end = self.dispatched_offset
        while pending:
            b = pending[0]
            partial = b.end > limit
            if not partial:
                pending.popleft()
            else:
                # The limit falls inside this batch (replication confirms record by record).
                k = 0
                offsets, sizes = b.offsets, b.sizes
                while offsets[k] + sizes[k] <= limit:
                    k += 1
                if k == 0:
                    break
                b = b.split(k)
            run = runs.get((b.topic, b.queue_id))
            if run is None:
                runs[(b.topic, b.queue_id)] = [b]
            else:
                run.append(b)
            end = b.end
            if partial:
                break
        touched: dict[tuple[str, int], int] = {}
        dirty: set[ConsumeQueue] = set()
        for key, run in runs.items():
            cq = self._queue(*key)
            first = run[0]
            if len(run) == 1:
                cq.put_columns(first.queue_offset, first.offsets, first.sizes, first.codes)
            else:
                start = first.queue_offset
                offsets, sizes, codes = list(first.offsets), list(first.sizes), list(first.codes)
                for b in run[1:]:
                    if b.queue_offset != start + len(offsets):  # out of sequence: write what came before
                        cq.put_columns(start, offsets, sizes, codes)
                        start, offsets, sizes, codes = b.queue_offset, [], [], []
                    offsets += b.offsets
                    sizes += b.sizes
                    codes += b.codes
                cq.put_columns(start, offsets, sizes, codes)
            dirty.add(cq)
            last = run[-1]
            touched[key] = last.queue_offset + len(last.offsets)
        with self._dirty_lock:
            self._dirty_queues |= dirty
        # Only now: the checkpoint takes every entry below dispatched_offset as written and fsyncs the
        # queues it finds dirty, so they must be listed before the offset moves.
        self.dispatched_offset = end
        for (topic, qid), max_off in touched.items():
            for listener in self._arrival_listeners:
                listener(topic, qid, max_off)

    def add_arrival_listener(self, fn: Callable[[str, int, int], None]) -> None:
        self._arrival_listeners.append(fn)

    def _queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self._cq_root, topic, queue_id, self.config.consume_queue_entries_per_file)
            cq.load()
            self.queues[key] = cq
        return cq

    def _cq_flush_loop(self) -> None:
        interval = self.config.flush_interval_consume_queue / 1000
        while not self._stopping.wait(interval):
            try:
                self.flush_queues_and_checkpoint()
            except Exception:  # pragma: no cover - a failing disk; keep trying, loudly
                log.exception("consume-queue flush failed")

    def flush_queues_and_checkpoint(self) -> None:
        generation = self._checkpoint.generation
        dispatched = self.dispatched_offset  # read first: every entry below it is already written
        log_flushed = self.commitlog.files.flushed_offset
        with self._dirty_lock:
            dirty, self._dirty_queues = self._dirty_queues, set()
        for cq in dirty:
            if not cq.files.segments or cq.files.segments[0].closed:
                continue
            try:
                cq.flush()
            except OSError:
                if not cq.files.segments or cq.files.segments[-1].closed:
                    continue  # deleted meanwhile
                raise
        self._checkpoint.save(Checkpoint(log_flushed=log_flushed, dispatched=dispatched), generation=generation)

    # ---- topics -----------------------------------------------------------------------------------
    def delete_topic(self, topic: str) -> None:
        for key in [k for k in self.queues if k[0] == topic]:
            cq = self.queues.pop(key)
            with self._dirty_lock:
                self._dirty_queues.discard(cq)
            cq.destroy()
            self.commitlog.queue_offsets.pop(key, None)
        shutil.rmtree(self._cq_root / topic, ignore_errors=True)

    # ---- read path (thread-safe) --------------------------------------------------------------------
    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.max_offset if cq is not None else 0

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.queues.get((topic, queue_id))
        return cq.min_offset if cq is not None else 0

    def get_messages(self, topic: str, queue_id: int, offset: int, max_msgs: int,
                     tags: frozenset[str] | None = None, max_bytes: int = 16 * 1024 * 1024) -> GetResult:
        cq = self.queues.get((topic, queue_id))
        mn, mx = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
        if offset < mn:
            return GetResult(OFFSET_TOO_SMALL, next_offset=mn, min_offset=mn, max_offset=mx)
        if offset == mx:
            return GetResult(NO_NEW_MSG, next_offset=offset, min_offset=mn, max_offset=mx)
        if offset > mx:
            status = OFFSET_OVERFLOW_ONE if offset == mx + 1 else OFFSET_OVERFLOW_BADLY
            return GetResult(status, next_offset=mx, min_offset=mn, max_offset=mx)
        assert cq is not None
        codes = {tags_hash(t) for t in tags} if tags else None
        scan = min(MAX_SCAN_ENTRIES, max(max_msgs * 4, 800)) if codes is not None else max_msgs
        wanted: list[tuple[int, int, int]] = []
        next_offset = offset
        total = 0
        # Replication caps what may be served (a replica never serves bytes its master may not have):
        # entries indexed by crash recovery or before a role change can lie past the cap.
        limit = self.extra_visibility_limit() if self.extra_visibility_limit is not None else None
        for qoff, phys, size, code in cq.entries(offset, scan):
            if limit is not None and phys + size > limit:
                break
            next_offset = qoff + 1
            if size <= 0 or (codes is not None and code not in codes):
                continue
            wanted.append((qoff, phys, size))
            total += size
            if len(wanted) >= max_msgs or total >= max_bytes:
                break
        status = FOUND if wanted else (NO_MATCHED_MSG if next_offset > offset else NO_NEW_MSG)
        res = GetResult(status, next_offset=next_offset, min_offset=mn, max_offset=mx)
        log_min = self.commitlog.min_offset
        for raw, (_qoff, phys, _size) in zip(self._read_records(wanted), wanted, strict=True):
            if raw is None:
                if phys >= log_min:
                    res.skipped_corrupt += 1
                continue
            if tags and decode_properties(_props_of(raw)).get(PROPERTY_TAGS) not in tags:
                continue
            res.records.append(raw)
        if res.skipped_corrupt:
            self.stats.corrupt_records_skipped += res.skipped_corrupt
            log.error("skipped %d damaged record(s) in %s/%d", res.skipped_corrupt, topic, queue_id)
        if not res.records and res.status == FOUND:
            res.status = NO_MATCHED_MSG
        return res

    def _read_records(self, wanted: list[tuple[int, int, int]]) -> list[memoryview | None]:
        """Read and verify records; neighbours in one segment are read with a single pread, and each
        record is a view into that block."""
        out: list[memoryview | None] = []
        files = self.commitlog.files
        i = 0
        while i < len(wanted):
            _q, first, _s = wanted[i]
            seg = files.segment_for(first)
            j = i
            span_end = first + wanted[i][2]
            useful = wanted[i][2]
            while j + 1 < len(wanted):
                nphys, nsize = wanted[j + 1][1], wanted[j + 1][2]
                if seg is None or nphys + nsize > seg.end or nphys < first:
                    break
                new_end = max(span_end, nphys + nsize)
                if new_end - first > 2 * (useful + nsize) + 65536:
                    break
                span_end, useful, j = new_end, useful + nsize, j + 1
            try:
                blob = files.pread(first, span_end - first)
            except OSError:
                blob = b""
            view = memoryview(blob)
            for _q2, phys, size in wanted[i : j + 1]:
                rel = phys - first
                raw = view[rel : rel + size]
                try:
                    if len(raw) != size:
                        raise record.RecordError("short read")
                    record.check_record(raw, 0, phys)
                    out.append(raw)
                except record.RecordError:
                    out.append(None)
            i = j + 1
        return out

    def lookup_offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset whose message was stored at or after ``timestamp_ms``."""
        cq = self.queues.get((topic, queue_id))
        if cq is None:
            return 0
        lo, hi = cq.min_offset, cq.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            e = cq.entry(mid)
            ts = self._store_timestamp(e[0]) if e is not None and e[1] > 0 else None
            if ts is None or ts < timestamp_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _store_timestamp(self, phys: int) -> int | None:
        raw = self.commitlog.files.pread(phys + record.OFF_STORE_TIMESTAMP, 8)
        return int.from_bytes(raw, "big", signed=True) if len(raw) == 8 else None

    def read_message(self, phys: int, size: int | None = None) -> bytes | None:
        """One verified record by commit-log offset (lookup by message id)."""
        if size is None:
            head = self.commitlog.files.pread(phys, 8)
            if len(head) < 8:
                return None
            size, _magic = record.peek_size_magic(head)
            if size <= 0 or size > record.MAX_RECORD_SIZE:
                return None
        raw = self.commitlog.files.pread(phys, size)
        try:
            record.check_record(raw, 0, phys)
        except record.RecordError:
            return None
        return raw

    def total_disk_bytes(self) -> int:
        return sum(s.size for s in self.commitlog.files.segments)

    def now_ms(self) -> int:
        return int(time.time() * 1000)


def _props_of(raw: bytes | memoryview) -> bytes | memoryview:
    p = record.HEADER_SIZE
    blen = int.from_bytes(raw[p : p + 4], "big")
    p += 4 + blen
    tlen = raw[p]
    p += 1 + tlen
    plen = int.from_bytes(raw[p : p + 2], "big")
    return raw[p + 2 : p + 2 + plen]


# ---- replication support ---------------------------------------------------------------------------
# Kept apart from the put path: a slave appends records it receives verbatim, and a replica joining a
# master cuts its log back to where the two histories agree.


def _iter_records(data: bytes | memoryview, start: int) -> list[tuple[int, bytes | memoryview, int]]:
    """(physical offset, buffer, index) of each message record in ``data`` (blanks skipped)."""
    out = []
    p = 0
    n = len(data)
    while p + record.END_FILE_MIN_BLANK_LENGTH <= n:
        size, magic = record.peek_size_magic(data, p)
        if size <= 0 or p + size > n:
            raise record.RecordError(f"incomplete record at {start + p}")
        if magic == record.MESSAGE_MAGIC_CODE:
            out.append((start + p, data, p))
        elif magic not in (record.BLANK_MAGIC_CODE, record.CORRUPT_MAGIC_CODE):
            raise record.RecordError(f"bad magic {magic:#x} at {start + p}")
        p += size
    if p != n:
        raise record.RecordError(f"trailing {n - p} bytes after the last record")
    return out


def append_replicated(store: MessageStore, start: int, data: bytes) -> int:
    """Append whole records received from the master at ``start``; returns the new log end.

    Records are checked (CRC included) before anything is written, so a damaged transfer never lands.
    """
    recs = _iter_records(data, start)
    appended: list[Appended] = []
    for phys, buf, i in recs:
        record.check_record(buf, i, phys)
        size, qid, qoff, ts, topic, props, _sysflag = record.dispatch_fields(buf, i)
        tags = decode_properties(props).get(PROPERTY_TAGS) if props else None
        appended.append(Appended(phys, size, topic, qid, qoff, tags_hash(tags), ts))
    seg_size = store.commitlog.segment_size
    pos = start
    view = memoryview(data)
    while view:
        room = seg_size - pos % seg_size
        chunk = view[:room]
        store.commitlog.append_raw(chunk, pos)
        pos += len(chunk)
        view = view[len(chunk):]
    offsets = store.commitlog.queue_offsets
    for a in appended:
        offsets[(a.topic, a.queue_id)] = a.queue_offset + 1
    store._pending.extend(batches_of(appended))
    store.redispatch()
    return pos


def truncate_to(store: MessageStore, offset: int) -> None:
    """Cut the log (and the queues that index it) back to ``offset``, a record boundary."""
    files = store.commitlog.files
    if offset >= files.write_offset:
        return
    if offset < files.min_offset:
        reset_to(store, offset)
        return
    store._checkpoint.begin_cut()
    files.truncate(offset)
    for cq in store.queues.values():
        cq.truncate_beyond(offset)
        cq.flush()
    kept: collections.deque[Batch] = collections.deque()
    for b in store._pending:
        if b.end <= offset:
            kept.append(b)
        elif b.offsets[0] < offset:  # the cut falls inside the batch: keep the records before it
            k = sum(1 for o, n in zip(b.offsets, b.sizes, strict=True) if o + n <= offset)
            kept.append(b.split(k))
    store._pending = kept
    store.dispatched_offset = min(store.dispatched_offset, offset)
    store._rebuild_queue_offsets()
    store._checkpoint.save(Checkpoint(log_flushed=files.flushed_offset, dispatched=store.dispatched_offset))


def reset_to(store: MessageStore, offset: int) -> None:
    """Throw the whole log and every queue away and start empty at ``offset`` (a segment boundary):
    the replica shares no history with its master."""
    files = store.commitlog.files
    store._checkpoint.begin_cut()
    files.reset_to(offset)
    for key in list(store.queues):
        store.queues.pop(key).destroy()
    store._pending.clear()
    store.commitlog.queue_offsets.clear()
    store.dispatched_offset = offset
    store._checkpoint.save(Checkpoint(log_flushed=offset, dispatched=offset))
