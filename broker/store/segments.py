"""A logical byte stream kept as fixed-size segment files named by their 20-digit start offset.

RocketMQ's MappedFileQueue: the commit log and every consume queue are such streams. Writes go to
the page cache with ``pwrite`` (cheap, never waiting on the device); durability comes from
``fdatasync`` issued by the flush services on their own threads. A lock guards the segment list
against the flush and retention threads; the event-loop thread only appends to it.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_fallocate = getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]


def segment_name(offset: int) -> str:
    return f"{offset:020d}"


def zero_range(fd: int, start: int, length: int, keep_allocated: bool) -> None:
    """Make [start, start+length) of a file read as zeros, cheaply where the filesystem can."""
    if length <= 0:
        return
    if _fallocate is not None and _fallocate(fd, _FALLOC_FL_KEEP_SIZE | _FALLOC_FL_PUNCH_HOLE, start, length) == 0:
        if keep_allocated:
            try:
                os.posix_fallocate(fd, start, length)
            except OSError:
                pass
        return
    chunk = bytes(1 << 20)
    pos = start
    while pos < start + length:
        n = min(len(chunk), start + length - pos)
        os.pwrite(fd, chunk[:n], pos)
        pos += n


class Segment:
    __slots__ = ("base", "closed", "fd", "path", "size")

    def __init__(self, path: Path, base: int, size: int, fd: int) -> None:
        self.path = path
        self.base = base
        self.size = size
        self.fd = fd
        self.closed = False

    @property
    def end(self) -> int:
        return self.base + self.size

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


class SegmentedFile:
    """One stream of fixed-size segments in a directory.

    ``write_offset`` is where the next byte goes; ``flushed_offset`` how far ``fdatasync`` has
    covered. Offsets are absolute (they keep growing across segment deletions).
    """

    def __init__(self, directory: str | os.PathLike[str], segment_size: int, *, preallocate: bool = False,
                 allocate_ahead: bool = False) -> None:
        self.dir = Path(directory)
        self.segment_size = segment_size
        self.preallocate = preallocate
        self.segments: list[Segment] = []
        self._bases: list[int] = []
        self.write_offset = 0
        self.flushed_offset = 0
        self.lock = threading.Lock()
        self._ahead: dict[int, Future[Segment]] = {}
        self._allocator = ThreadPoolExecutor(1, thread_name_prefix="segment-alloc") if allocate_ahead else None
        self._retired: list[Segment] = []

    # ---- loading -------------------------------------------------------------------------------
    def load(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for leftover in self.dir.glob(".*.alloc"):  # an allocation a crash interrupted
            leftover.unlink(missing_ok=True)
        names = sorted(p for p in self.dir.iterdir() if p.name.isdigit() and len(p.name) == 20)
        for p in names:
            base = int(p.name)
            size = p.stat().st_size
            if size != self.segment_size:
                # A segment of another size is either from another configuration or a file cut short
                # by a crash while it was being created; both mean it can't be trusted as is.
                if p is names[-1] and size < self.segment_size:
                    log.warning("segment %s has size %d, extending to %d", p, size, self.segment_size)
                    with open(p, "r+b") as f:
                        f.truncate(self.segment_size)
                else:
                    raise RuntimeError(
                        f"segment {p} is {size} bytes but the configured segment size is {self.segment_size}"
                    )
            fd = os.open(p, os.O_RDWR)
            self._add(Segment(p, base, self.segment_size, fd))
        if self.segments:
            self.write_offset = self.flushed_offset = self.segments[0].base

    def _add(self, seg: Segment) -> None:
        if self._bases and seg.base != self._bases[-1] + self.segment_size:
            raise RuntimeError(f"segment {seg.path} does not follow {self.segments[-1].path}")
        self.segments.append(seg)
        self._bases.append(seg.base)

    # ---- geometry -----------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments[0].base if self.segments else self.write_offset

    def segment_for(self, offset: int) -> Segment | None:
        i = bisect.bisect_right(self._bases, offset) - 1
        if i < 0:
            return None
        seg = self.segments[i]
        return seg if offset < seg.end else None

    def _create(self, base: int) -> Segment:
        # Sized under a temporary name, then renamed: the folder only ever shows whole segments, even
        # while one is being allocated ahead or when a crash interrupts the allocation.
        path = self.dir / segment_name(base)
        tmp = self.dir / f".{path.name}.alloc"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if self.preallocate:
                os.posix_fallocate(fd, 0, self.segment_size)
            else:
                os.ftruncate(fd, self.segment_size)
            os.rename(tmp, path)
        except OSError:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        return Segment(path, base, self.segment_size, fd)

    def segment_at(self, base: int) -> Segment:
        """The segment starting at ``base``, creating it (or taking the one allocated ahead)."""
        if self.segments and self.segments[-1].base == base:
            return self.segments[-1]
        fut = self._ahead.pop(base, None)
        seg = fut.result() if fut is not None else self._create(base)
        with self.lock:
            self._add(seg)
        if self._allocator is not None:
            nxt = base + self.segment_size
            if nxt not in self._ahead:
                self._ahead[nxt] = self._allocator.submit(self._create, nxt)
        return seg

    # ---- I/O -----------------------------------------------------------------------------------
    def pwrite(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` at ``offset``; it must lie within one segment (callers split at segment ends)."""
        seg = self.segment_for(offset)
        if seg is None:
            seg = self.segment_at(offset - offset % self.segment_size)
        pos = offset - seg.base
        if pos + len(data) > seg.size:
            raise ValueError("write crosses a segment boundary")
        view = memoryview(data)
        while view:
            n = os.pwrite(seg.fd, view, pos)
            view = view[n:]
            pos += n

    def pread(self, offset: int, length: int) -> bytes:
        """Read up to ``length`` bytes from ``offset``, never past the end of its segment."""
        seg = self.segment_for(offset)
        if seg is None:
            return b""
        length = min(length, seg.end - offset)
        return os.pread(seg.fd, length, offset - seg.base)

    def flush(self) -> int:
        """fdatasync everything written so far; returns the new flushed offset. Thread-safe."""
        target = self.write_offset
        if target <= self.flushed_offset:
            return self.flushed_offset
        with self.lock:
            for seg in self.segments:
                if seg.end > self.flushed_offset and seg.base < target and not seg.closed:
                    os.fdatasync(seg.fd)
            self.flushed_offset = max(self.flushed_offset, target)
        return self.flushed_offset

    def flush_all(self) -> None:
        with self.lock:
            for seg in self.segments:
                if not seg.closed:
                    os.fdatasync(seg.fd)
            self.flushed_offset = max(self.flushed_offset, self.write_offset)

    # ---- truncation and deletion ------------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Forget everything from ``offset`` on: later segments are removed, the rest zeroed."""
        with self.lock:
            while self.segments and self.segments[-1].base > offset:
                seg = self.segments.pop()
                self._bases.pop()
                seg.close()
                seg.path.unlink(missing_ok=True)
            seg = self.segment_for(offset)
            if seg is not None:
                zero_range(seg.fd, offset - seg.base, seg.size - (offset - seg.base), self.preallocate)
                os.fdatasync(seg.fd)
            self.write_offset = offset
            self.flushed_offset = min(self.flushed_offset, offset)
            for fut in self._ahead.values():
                fut.cancel()
            self._ahead.clear()

    def reset_to(self, offset: int) -> None:
        """Drop every segment and restart the stream empty at ``offset`` (used when a consume queue
        must begin where its old data no longer exists)."""
        with self.lock:
            for seg in self.segments:
                seg.close()
                seg.path.unlink(missing_ok=True)
            self.segments.clear()
            self._bases.clear()
            self.write_offset = self.flushed_offset = offset

    def delete_first(self) -> Segment | None:
        """Remove the oldest segment (never the last one). Its descriptor stays open until the next
        call, so that readers holding it finish their read."""
        with self.lock:
            for seg in self._retired:
                seg.close()
            self._retired.clear()
            if len(self.segments) <= 1:
                return None
            seg = self.segments.pop(0)
            self._bases.pop(0)
            seg.path.unlink(missing_ok=True)
            self._retired.append(seg)
            return seg

    def destroy(self) -> None:
        self.close()
        for seg in self.segments:
            seg.path.unlink(missing_ok=True)
        try:
            self.dir.rmdir()
        except OSError:
            pass

    def close(self) -> None:
        with self.lock:
            for seg in self.segments + self._retired:
                seg.close()
            self._retired.clear()
        if self._allocator is not None:
            self._allocator.shutdown(wait=True, cancel_futures=True)
        # Segments allocated ahead were never written: remove them so the folder holds only data.
        for fut in self._ahead.values():
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                seg = fut.result()
                seg.close()
                seg.path.unlink(missing_ok=True)
        self._ahead.clear()
