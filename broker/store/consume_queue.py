"""A consume queue: the index of one (topic, queueId) into the commit log.

Fixed 20-byte entries (commit-log offset i64, size i32, tag hash i64), entry N at byte N*20, in
segment files of ``entries_per_file`` entries, as RocketMQ's ConsumeQueue. Entries are derived from
the commit log alone, so a queue can always be rebuilt by re-dispatching the log.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from ferrymq.broker.store.segments import SegmentedFile

ENTRY = struct.Struct(">qiq")
ENTRY_SIZE = ENTRY.size  # 20


class ConsumeQueue:
    def __init__(self, root: Path, topic: str, queue_id: int, entries_per_file: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.files = SegmentedFile(root / topic / str(queue_id), entries_per_file * ENTRY_SIZE)
        # Logical offsets below this are gone (retention); entries there are not served.
        self.min_logical = 0
        self.max_physical_end = 0  # end of the last record indexed, for recovery checks

    # ---- load / recover ---------------------------------------------------------------------------
    def load(self) -> None:
        self.files.load()
        if not self.files.segments:
            return
        last = self.files.segments[-1]
        data = self.files.pread(last.base, last.size)
        used = len(data.rstrip(b"\x00"))
        entries = -(-used // ENTRY_SIZE)
        self.files.write_offset = last.base + entries * ENTRY_SIZE
        self.files.flushed_offset = self.files.write_offset
        self.min_logical = self.files.min_offset // ENTRY_SIZE
        if entries:
            phys, size, _ = ENTRY.unpack_from(data, (entries - 1) * ENTRY_SIZE)
            self.max_physical_end = phys + size

    def truncate_beyond(self, log_end: int) -> None:
        """Drop trailing entries that point at or past ``log_end`` (a log truncated by recovery).

        Entries are in commit-log order, so the first bad one is found by bisection."""
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            e = self.entry(mid)
            if e is not None and e[0] + e[1] <= log_end:
                lo = mid + 1
            else:
                hi = mid
        if lo < self.max_offset:
            self.files.truncate(lo * ENTRY_SIZE)
        last = self.entry(lo - 1) if lo > self.min_offset else None
        self.max_physical_end = last[0] + last[1] if last else 0

    # ---- offsets ----------------------------------------------------------------------------------
    @property
    def max_offset(self) -> int:
        return self.files.write_offset // ENTRY_SIZE

    @property
    def min_offset(self) -> int:
        return max(self.min_logical, self.files.min_offset // ENTRY_SIZE)

    # ---- write ------------------------------------------------------------------------------------
    def put(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> None:
        """Write the entry for ``queue_offset``. Idempotent, so re-dispatch after a crash is safe."""
        pos = queue_offset * ENTRY_SIZE
        if not self.files.segments and pos > 0:
            # The queue starts past zero (its earlier entries were never here, e.g. a rebuilt
            # queue whose oldest log data is gone): start the stream at the right segment.
            base = pos - pos % self.files.segment_size
            self.files.reset_to(base)
            self.min_logical = queue_offset
        self.files.pwrite(pos, ENTRY.pack(physical_offset, size, tags_code))
        end = pos + ENTRY_SIZE
        if end > self.files.write_offset:
            self.files.write_offset = end
            self.max_physical_end = physical_offset + size

    def put_many(self, queue_offset: int, entries: list[tuple[int, int, int]]) -> None:
        """``put`` for consecutive entries (physical offset, size, tags code) from ``queue_offset`` on,
        one pwrite per segment instead of one per entry."""
        if entries:
            offsets, sizes, codes = (list(c) for c in zip(*entries, strict=True))
            self.put_columns(queue_offset, offsets, sizes, codes)

    def put_columns(self, queue_offset: int, offsets: list[int], sizes: list[int], codes: list[int]) -> None:
        """``put_many`` with the entries as three columns (the dispatcher's form; no tuple per entry)."""
        if len(offsets) == 1 or (not self.files.segments and queue_offset > 0):
            self.put(queue_offset, offsets[0], sizes[0], codes[0])  # put (re)starts a stream past zero
            if len(offsets) == 1:
                return
            queue_offset += 1
            offsets, sizes, codes = offsets[1:], sizes[1:], codes[1:]
        pos = queue_offset * ENTRY_SIZE
        data = memoryview(b"".join(map(ENTRY.pack, offsets, sizes, codes)))
        seg_size = self.files.segment_size
        while data:
            n = min(len(data), seg_size - pos % seg_size)
            self.files.pwrite(pos, data[:n])
            pos += n
            data = data[n:]
        if pos > self.files.write_offset:
            self.files.write_offset = pos
            self.max_physical_end = offsets[-1] + sizes[-1]

    # ---- read -------------------------------------------------------------------------------------
    def entry(self, queue_offset: int) -> tuple[int, int, int] | None:
        raw = self.files.pread(queue_offset * ENTRY_SIZE, ENTRY_SIZE)
        if len(raw) < ENTRY_SIZE:
            return None
        return ENTRY.unpack(raw)

    def entries(self, start: int, count: int) -> Iterator[tuple[int, int, int, int]]:
        """(queue offset, physical offset, size, tags code) from ``start``, at most ``count``, stopping
        at the end of the queue. Reads a segment's worth per syscall."""
        end = min(self.max_offset, start + count)
        off = max(start, self.min_offset)
        while off < end:
            raw = self.files.pread(off * ENTRY_SIZE, (end - off) * ENTRY_SIZE)
            if not raw:
                return
            n = len(raw) // ENTRY_SIZE
            for i, (phys, size, tags) in enumerate(ENTRY.iter_unpack(raw[: n * ENTRY_SIZE])):
                yield off + i, phys, size, tags
            off += n

    # ---- retention --------------------------------------------------------------------------------
    def correct_min_offset(self, log_min: int) -> None:
        """Entries pointing before the log's first offset are gone: move the minimum past them and
        delete the segments that hold only such entries."""
        while len(self.files.segments) > 1:
            seg = self.files.segments[0]
            last = ENTRY.unpack(self.files.pread(seg.end - ENTRY_SIZE, ENTRY_SIZE))
            if last[0] + last[1] > log_min or last[1] == 0:
                break
            self.files.delete_first()
        lo, hi = self.min_offset, self.max_offset
        while lo < hi:  # first entry whose record starts at or after log_min
            mid = (lo + hi) // 2
            e = self.entry(mid)
            if e is not None and e[0] >= log_min:
                hi = mid
            else:
                lo = mid + 1
        self.min_logical = max(self.min_logical, lo)

    def flush(self) -> None:
        self.files.flush()

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        self.files.destroy()
