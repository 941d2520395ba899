"""The commit log: every message of every topic, appended as self-describing records.

Only the event-loop thread appends (so offsets need no lock); flush threads fsync behind it.
"""

from __future__ import annotations

import time
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
        keep their delivery time there)."""
        seg_size = self.files.segment_size
        now = int(time.time() * 1000)
        pos = self.files.write_offset
        offsets = self.queue_offsets
        new_offsets: dict[tuple[str, int], int] = {}
        plan: list[tuple[int, Message, bytes, bytes, int, int, int]] = []
        chunks: list[tuple[int, int]] = []  # (start, end) of contiguous runs within one segment
        run_start = pos
        for i, m in enumerate(msgs):
            topic_b = m.topic.encode()
            props_b = encode_properties(m.properties)
            size = record.record_size(len(m.body), len(topic_b), len(props_b))
            if size + record.END_FILE_MIN_BLANK_LENGTH > seg_size:
                raise FerryError(
                    "MESSAGE_ILLEGAL", f"a {size}-byte record does not fit a {seg_size}-byte segment"
                )
            seg_end = pos - pos % seg_size + seg_size
            if pos + size + record.END_FILE_MIN_BLANK_LENGTH > seg_end:
                plan.append((pos, None, b"", b"", seg_end - pos, 0, 0))  # type: ignore[arg-type]
                chunks.append((run_start, seg_end))
                pos = run_start = seg_end
            key = (m.topic, m.queue_id)
            qoff = new_offsets.get(key)
            if qoff is None:
                qoff = offsets.get(key, 0)
            new_offsets[key] = qoff + 1
            if tags_codes is not None:
                code = tags_codes[i]
            else:
                code = tags_hash(m.properties.get(PROPERTY_TAGS))
            plan.append((pos, m, topic_b, props_b, size, qoff, code))
            pos += size
        chunks.append((run_start, pos))

        results: list[Appended] = []
        host = self.store_host
        for start, end in chunks:
            if end == start:
                continue
            buf = bytearray(end - start)
            for p, m, topic_b, props_b, size, qoff, code in plan:
                if p < start or p >= end:
                    continue
                if m is None:
                    record._BLANK.pack_into(buf, p - start, size, record.BLANK_MAGIC_CODE)
                    continue
                record.encode_into(
                    buf, p - start,
                    queue_id=m.queue_id, flag=m.flag, queue_offset=qoff, physical_offset=p,
                    sysflag=m.sysflag, born_timestamp=m.born_timestamp or now, born_host=m.born_host,
                    store_timestamp=now, store_host=host, reconsume_times=m.reconsume_times,
                    prepared_transaction_offset=m.prepared_transaction_offset, body=m.body,
                    body_crc32=record.body_crc(m.body), topic=topic_b, properties=props_b,
                )
                results.append(Appended(p, size, m.topic, m.queue_id, qoff, code, now))
            try:
                self.files.pwrite(start, buf)
            except OSError as exc:
                self._undo(self.files.write_offset, end)
                raise FerryError("SERVICE_NOT_AVAILABLE", f"commit log write failed: {exc}") from exc
        self.files.write_offset = pos
        offsets.update(new_offsets)
        return results

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
