"""Recovery of the commit log after a crash: validate, fence off damage, cut the torn tail.

Records from the checkpoint on are checked one by one (magic, sizes, the physical offset each record
names, body CRC). A damaged record in the middle of good data is fenced off with a CORRUPT marker
(its bytes are kept aside in ``corrupt/``) and the scan re-synchronises on the next valid record, so a
single bit flip loses one record, never everything after it. Damage that runs to the end of a segment
(its last record, its END_OF_FILE blank) is fenced up to the segment end when the next segment holds
valid records, so it never cuts the following segments off. The first position after which no valid
record follows is the end of the log; everything from there on is zeroed.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from pathlib import Path

from ferrymq.broker.store.commitlog import CommitLog
from ferrymq.broker.store.segments import SegmentedFile, zero_range
from ferrymq.common import record

log = logging.getLogger(__name__)
SCAN_CHUNK = 4 * 1024 * 1024


class RecoveryReport:
    def __init__(self) -> None:
        self.start = 0
        self.end = 0
        self.records = 0
        self.corrupt_ranges: list[tuple[int, int]] = []
        self.truncated_bytes = 0

    def __repr__(self) -> str:
        return (f"RecoveryReport(start={self.start}, end={self.end}, records={self.records}, "
                f"corrupt={self.corrupt_ranges}, truncated={self.truncated_bytes})")


class _Window:
    """Reads a segment on demand, a few MiB at a time, so recovery never holds a whole segment."""

    def __init__(self, commitlog: CommitLog, seg_base: int, seg_size: int) -> None:
        self.files = commitlog.files
        self.base = seg_base
        self.size = seg_size
        self.off = 0
        self.buf = b""

    def ensure(self, p: int, n: int) -> int:
        """Make the buffer cover [p, p+n) (segment-relative); return p's index in the buffer."""
        n = min(n, self.size - p)
        if p < self.off or p + n > self.off + len(self.buf):
            self.off = p
            self.buf = self.files.pread(self.base + p, max(n, SCAN_CHUNK))
        return p - self.off


def _find_next_valid(files: SegmentedFile, seg_base: int, seg_size: int, p: int) -> int | None:
    """Segment-relative position of the next valid record after ``p``, found by its magic code.

    Gives up at the first all-zero chunk: that is past the written data."""
    q = p + 1
    while q < seg_size:
        chunk = files.pread(seg_base + q, min(SCAN_CHUNK, seg_size - q))
        if not chunk.strip(b"\x00"):
            return None
        j = chunk.find(record.MAGIC_BYTES)
        while j >= 0:
            cand = q + j - 4
            if cand > p:
                (size,) = struct.unpack(">i", files.pread(seg_base + cand, 4))
                if record.FIXED_OVERHEAD <= size <= seg_size - cand:
                    try:
                        record.check_record(files.pread(seg_base + cand, size), 0, seg_base + cand)
                        return cand
                    except record.RecordError:
                        pass
            j = chunk.find(record.MAGIC_BYTES, j + 1)
        q += max(len(chunk) - 4, 1)  # overlap, so a magic code across two chunks is still seen
    return None


def recover_commitlog(
    commitlog: CommitLog, start: int, corrupt_dir: Path,
    on_record: Callable[[bytes, int], None],
) -> RecoveryReport:
    """Scan from ``start`` (a record boundary) to the end, calling ``on_record(buffer, index)`` for
    each valid record, and truncate the log after the last one."""
    rep = RecoveryReport()
    files = commitlog.files
    seg_size = files.segment_size
    rep.start = start = max(start, files.min_offset)
    pos = start
    while True:
        seg = files.segment_for(pos)
        if seg is None:
            break
        win = _Window(commitlog, seg.base, seg_size)
        p = pos - seg.base
        next_segment = False
        while seg_size - p >= record.END_FILE_MIN_BLANK_LENGTH:
            i = win.ensure(p, record.FIXED_OVERHEAD)
            size, magic = struct.unpack_from(">ii", win.buf, i)
            if magic == record.BLANK_MAGIC_CODE and size == seg_size - p:
                next_segment = True
                break
            if magic == record.CORRUPT_MAGIC_CODE and 0 < size <= seg_size - p:
                p += size
                continue
            try:
                if size == 0 and magic == 0:
                    # Usually the end of the written data; but zeros may also be a hole in the middle
                    # (lost sectors), so look for valid records after it before believing the end.
                    raise record.RecordError("zeros")
                if not record.FIXED_OVERHEAD <= size <= seg_size - p:
                    raise record.RecordError(f"bad total size {size}")
                i = win.ensure(p, size)
                record.check_record(win.buf, i, seg.base + p)
            except record.RecordError as exc:
                q = _find_next_valid(files, seg.base, seg_size, p)
                if q is None:
                    nxt = files.segment_for(seg.end)
                    if nxt is None or _find_next_valid(files, nxt.base, seg_size, -1) is None:
                        if size or magic:
                            log.warning("commit log ends at %d: %s", seg.base + p, exc)
                        break
                    q = seg_size  # the damage runs to the segment end, but the log goes on after it
                _fence(commitlog, corrupt_dir, seg.base + p, seg.base + q)
                rep.corrupt_ranges.append((seg.base + p, seg.base + q))
                log.error("fenced off damaged commit-log range [%d, %d): %s", seg.base + p, seg.base + q, exc)
                win.buf = b""
                p = q
                continue
            on_record(win.buf, i)
            rep.records += 1
            p += size
        if p >= seg_size:
            next_segment = True  # a fence reached the segment end
        if next_segment and files.segment_for(seg.end) is not None:
            pos = seg.end
            continue
        pos = seg.end if next_segment else seg.base + p
        break
    rep.end = pos
    last_written = files.segments[-1].end if files.segments else pos
    rep.truncated_bytes = max(0, last_written - pos)
    files.truncate(pos)
    return rep


def _fence(commitlog: CommitLog, corrupt_dir: Path, start: int, end: int) -> None:
    """Keep the damaged bytes aside, then cover [start, end) with a CORRUPT marker and zeros."""
    files = commitlog.files
    corrupt_dir.mkdir(parents=True, exist_ok=True)
    with open(corrupt_dir / f"{start:020d}.bin", "wb") as out:
        off = start
        while off < end:
            chunk = files.pread(off, min(SCAN_CHUNK, end - off))
            if not chunk:
                break
            out.write(chunk)
            off += len(chunk)
    seg = files.segment_for(start)
    assert seg is not None and end <= seg.end
    marker = record.END_FILE_MIN_BLANK_LENGTH
    if end - start < marker:
        # Too short for a marker (never written so by the log itself): zeros, which the next scan
        # re-synchronises past the same way.
        zero_range(seg.fd, start - seg.base, end - start, False)
        return
    files.pwrite(start, struct.pack(">ii", end - start, record.CORRUPT_MAGIC_CODE))
    zero_range(seg.fd, start - seg.base + marker, end - start - marker, files.preallocate)
