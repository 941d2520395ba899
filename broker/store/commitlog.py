"""The commit log: every message of every topic, appended as self-describing records.

Only the event-loop thread appends (so offsets need no lock); flush threads fsync behind it.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ferrymq.broker.store.segments import SegmentedFile, zero_range
from ferrymq.common import record
from ferrymq.common.errors import FerryError
from ferrymq.common.message import PROPERTY_TAGS, Message, encode_properties, tags_hash


class Appended(NamedTuple):
    """Where one message landed; also the dispatch request that indexes it."""

    physical_offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    tags_code: int
    store_timestamp: int

    @property
    def end(self) -> int:
        return self.physical_offset + self.size


@dataclass(slots=True)
class Batch:
    """Consecutive records of one queue with consecutive queue offsets: a batch send lands as one, and the
    dispatcher indexes one with a single consume-queue write. Columns, not a tuple per record."""

    topic: str
    queue_id: int
    queue_offset: int  # of the first record
    offsets: list[int]  # physical offset of each record
    sizes: list[int]
    codes: list[int]  # consume-queue tag hash of each record
    store_timestamp: int

    @property
    def end(self) -> int:
        return self.offsets[-1] + self.sizes[-1]

    def __len__(self) -> int:
        return len(self.offsets)

    def split(self, k: int) -> Batch:
        """Cut off and return the first ``k`` records (a visibility limit that falls inside the batch)."""
        head = Batch(self.topic, self.queue_id, self.queue_offset, self.offsets[:k], self.sizes[:k],
                     self.codes[:k], self.store_timestamp)
        self.queue_offset += k
        del self.offsets[:k], self.sizes[:k], self.codes[:k]
        return head


def batches_of(recs: list[Appended]) -> list[Batch]:
    """Group appended records into runs of one queue with consecutive queue offsets."""
    out: list[Batch] = []
    last: Batch | None = None
    for a in recs:
        if (last is None or a.topic != last.topic or a.queue_id != last.queue_id
                or a.queue_offset != last.queue_offset + len(last.offsets)):
            last = Batch(a.topic, a.queue_id, a.queue_offset, [], [], [], a.store_timestamp)
            out.append(last)
        last.offsets.append(a.physical_offset)
        last.sizes.append(a.size)
        last.codes.append(a.tags_code)
    return out


def _roll(size: int, seg_size: int, pos: int, seg_end: int, chunk_start: int, buf: bytearray,
          chunks: list[tuple[int, bytearray]]) -> tuple[bytearray, int]:
    """The record does not fit before ``seg_end``: close the segment with an END_OF_FILE blank and
    start a new buffer at the next segment. Returns (new buffer, new position)."""
    if size + record.END_FILE_MIN_BLANK_LENGTH > seg_size:
        raise FerryError("MESSAGE_ILLEGAL", f"a {size}-byte record does not fit a {seg_size}-byte segment")
    buf += record.encode_blank(seg_end - pos)
    chunks.append((chunk_start, buf))
    return bytearray(), seg_end


class CommitLog:
    def __init__(self, root: Path, segment_size: int, store_host: bytes, *, preallocate: bool) -> None:
        self.files = SegmentedFile(root / "commitlog", segment_size, preallocate=preallocate,
                                   allocate_ahead=True)
        self.store_host = store_host
        # next queue offset of every (topic, queueId): RocketMQ's topicQueueTable
        self.queue_offsets: dict[tuple[str, int], int] = {}

    @property
    def segment_size(self) -> int:
        return self.files.segment_size

    @property
    def max_offset(self) -> int:
        return self.files.write_offset

    @property
    def min_offset(self) -> int:
        return self.files.min_offset

    def append(self, msgs: list[Message], tags_codes: list[int] | None = None) -> list[Appended]:
        """Encode and write a batch; all of it lands or none of it does (offsets move only after the
        writes succeeded). ``tags_codes`` overrides the consume-queue tag hash (scheduled messages
        keep their delivery time there).

        One pass encodes the batch into one buffer per segment it touches (normally one), so a batch
        costs one pwrite; the per-message work is a single struct pack and two buffer appends."""
        files = self.files
        seg_size = files.segment_size
        now = int(time.time() * 1000)
        pos = chunk_start = files.write_offset
        seg_end = pos - pos % seg_size + seg_size
        offsets = self.queue_offsets
        new_offsets: dict[tuple[str, int], int] = {}
        results: list[Appended] = []
        chunks: list[tuple[int, bytearray]] = []
        buf = bytearray()
        host = self.store_host
        pack = record.PREFIX.pack
        prefix_size = record.PREFIX_SIZE
        min_blank = record.END_FILE_MIN_BLANK_LENGTH
        magic = record.MESSAGE_MAGIC_CODE
        crc32 = zlib.crc32
        last_topic: str | None = None
        last_props: dict[str, str] | None = None
        tail = b""
        code = 0
        for i, m in enumerate(msgs):
            topic, props, body = m.topic, m.properties, m.body
            if topic != last_topic or props != last_props:
                # Messages of a batch mostly share topic and properties: encode those once.
                topic_b = topic.encode()
                if len(topic_b) > 255:
                    raise FerryError("MESSAGE_ILLEGAL", f"topic {topic!r} is longer than 255 bytes")
                tail = record.tail(topic_b, encode_properties(props))
                code = tags_hash(props.get(PROPERTY_TAGS))
                last_topic, last_props = topic, props
            size = prefix_size + len(body) + len(tail)
            if pos + size + min_blank > seg_end:
                buf, pos = _roll(size, seg_size, pos, seg_end, chunk_start, buf, chunks)
                chunk_start, seg_end = pos, seg_end + seg_size
            key = (topic, m.queue_id)
            qoff = new_offsets.get(key)
            if qoff is None:
                qoff = offsets.get(key, 0)
            new_offsets[key] = qoff + 1
            # BODYCRC masks the sign bit, as RocketMQ's UtilAll.crc32 (record.body_crc).
            buf += pack(size, magic, crc32(body) & 0x7FFFFFFF, m.queue_id, m.flag, qoff, pos, m.sysflag,
                        m.born_timestamp or now, m.born_host, now, host, m.reconsume_times,
                        m.prepared_transaction_offset, len(body))
            buf += body
            buf += tail
            results.append(Appended(pos, size, topic, m.queue_id, qoff,
                                    code if tags_codes is None else tags_codes[i], now))
            pos += size
        chunks.append((chunk_start, buf))
        self._write_chunks(chunks)
        files.write_offset = pos
        offsets.update(new_offsets)
        return results

    def append_batch(self, topic: str, queue_id: int, bodies: list[bytes],
                     props: list[dict[str, str] | None] | None, *, born_timestamp: int = 0, flag: int = 0,
                     born_host: bytes = b"\x00" * 8) -> Batch:
        """``append`` for the common case of a batch send: bodies (with their properties, or None for none)
        of one topic and queue, straight from the request, with no Message object per message. The
        records are byte for byte what ``append`` writes."""
        files = self.files
        seg_size = files.segment_size
        now = int(time.time() * 1000)
        born = born_timestamp or now
        pos = chunk_start = files.write_offset
        seg_end = pos - pos % seg_size + seg_size
        key = (topic, queue_id)
        first_qoff = qoff = self.queue_offsets.get(key, 0)
        chunks: list[tuple[int, bytearray]] = []
        buf = bytearray()
        host = self.store_host
        pack = record.PREFIX.pack
        prefix_size = record.PREFIX_SIZE
        min_blank = record.END_FILE_MIN_BLANK_LENGTH
        magic = record.MESSAGE_MAGIC_CODE
        crc32 = zlib.crc32
        topic_b = topic.encode()
        if len(topic_b) > 255:
            raise FerryError("MESSAGE_ILLEGAL", f"topic {topic!r} is longer than 255 bytes")
        last_props: dict[str, str] | None = None
        tail = record.tail(topic_b, b"")
        code = 0
        positions: list[int] = []
        sizes: list[int] = []
        codes: list[int] = []
        for i, body in enumerate(bodies):
            if props is not None:
                p = props[i]
                if p != last_props:
                    # Messages of a batch mostly share their properties: encode those once.
                    tail = record.tail(topic_b, encode_properties(p) if p else b"")
                    code = tags_hash(p.get(PROPERTY_TAGS)) if p else 0
                    last_props = p
            size = prefix_size + len(body) + len(tail)
            if pos + size + min_blank > seg_end:
                buf, pos = _roll(size, seg_size, pos, seg_end, chunk_start, buf, chunks)
                chunk_start, seg_end = pos, seg_end + seg_size
            buf += pack(size, magic, crc32(body) & 0x7FFFFFFF, queue_id, flag, qoff, pos, 0, born, born_host,
                        now, host, 0, 0, len(body))
            buf += body
            buf += tail
            positions.append(pos)
            sizes.append(size)
            codes.append(code)
            pos += size
            qoff += 1
        chunks.append((chunk_start, buf))
        self._write_chunks(chunks)
        files.write_offset = pos
        self.queue_offsets[key] = qoff
        return Batch(topic, queue_id, first_qoff, positions, sizes, codes, now)

    def _write_chunks(self, chunks: list[tuple[int, bytearray]]) -> None:
        files = self.files
        for start, data in chunks:
            if not data:
                continue
            try:
                files.pwrite(start, data)
            except OSError as exc:
                self._undo(files.write_offset, start + len(data))
                raise FerryError("SERVICE_NOT_AVAILABLE", f"commit log write failed: {exc}") from exc

    def _undo(self, start: int, end: int) -> None:
        # Bytes written past the write offset were never acknowledged; zero them so that recovery
        # after a crash cannot mistake them for records.
        off = start
        while off < end:
            seg = self.files.segment_for(off)
            if seg is None:
                break
            n = min(end, seg.end) - off
            try:
                zero_range(seg.fd, off - seg.base, n, self.files.preallocate)
            except OSError:
                pass
            off += n

    def append_raw(self, data: bytes | memoryview, start: int) -> None:
        """Append bytes that are already records (replication); ``start`` must be the write offset and
        the data must end on a record boundary within one segment."""
        if start != self.files.write_offset:
            raise FerryError("SYSTEM_ERROR", f"raw append at {start}, log ends at {self.files.write_offset}")
        self.files.pwrite(start, data)
        self.files.write_offset = start + len(data)

    def read(self, offset: int, size: int) -> bytes:
        return self.files.pread(offset, size)
