"""Checkpoint and recovery on real files: clean start, torn tails, bit flips, fenced damage, rebuilt
consume queues. A crash is what it leaves on disk: the ``abort`` file and a checkpoint that is not clean
(taken some time before the end of the log)."""

from __future__ import annotations

import asyncio
import base64
import random
import struct
from pathlib import Path

import pytest
from support import BrokerProcess

from ferrymq.broker.store.checkpoint import Checkpoint, CheckpointFile
from ferrymq.broker.store.commitlog import Appended
from ferrymq.broker.store.consume_queue import ENTRY_SIZE
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common import record
from ferrymq.common.config import FlushDiskType, StoreConfig
from ferrymq.common.message import Message

SEGMENT = 64 * 1024


def config(root: Path) -> StoreConfig:
    return StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
                       consume_queue_entries_per_file=16, flush_disk_type=FlushDiskType.SYNC_FLUSH,
                       preallocate_commit_log=False)


def body_of(i: int, size: int = 900) -> bytes:
    return (f"message-{i}-".encode() * (size // 10 + 1))[:size]


async def write(root: Path, n: int, start: int = 0, queues: int = 2, size: int = 900) -> list[Appended]:
    """Put ``n`` messages through a real store and shut it down cleanly."""
    store = MessageStore(config(root))
    store.load()
    store.start(asyncio.get_running_loop())
    recs = []
    for i in range(start, start + n):
        recs += await store.put([Message("t", body_of(i, size), queue_id=i % queues)])
    store.shutdown()
    return recs


def open_store(root: Path) -> MessageStore:
    store = MessageStore(config(root))
    store.load()
    return store


def crash(root: Path, checkpoint_at: int = 0) -> None:
    """Make the store look as a kill -9 leaves it: abort file present, checkpoint from earlier."""
    (root / "abort").touch()
    CheckpointFile(root / "checkpoint").save(Checkpoint(log_flushed=checkpoint_at, dispatched=checkpoint_at))


def segment_path(root: Path, offset: int) -> Path:
    return root / "commitlog" / f"{offset - offset % SEGMENT:020d}"


def patch(root: Path, offset: int, data: bytes) -> None:
    with open(segment_path(root, offset), "r+b") as f:
        f.seek(offset % SEGMENT)
        f.write(data)


def read(root: Path, offset: int, n: int) -> bytes:
    with open(segment_path(root, offset), "rb") as f:
        f.seek(offset % SEGMENT)
        return f.read(n)


def flip(root: Path, offset: int) -> None:
    patch(root, offset, bytes([read(root, offset, 1)[0] ^ 0x10]))


def served(store: MessageStore, queues: int = 2) -> dict[tuple[int, int], bytes]:
    """(queueId, queueOffset) -> body of everything a consumer can pull."""
    out = {}
    for q in range(queues):
        offset = store.min_offset("t", q)
        while offset < store.max_offset("t", q):
            res = store.get_messages("t", q, offset, 50)
            for raw in res.records:
                m = record.decode(raw)
                out[(q, m.queue_offset)] = m.body
            offset = res.next_offset
    return out


def expected(recs: list[Appended], skip: set[int] = frozenset()) -> dict[tuple[int, int], bytes]:  # type: ignore[assignment]
    return {(r.queue_id, r.queue_offset): body_of(i) for i, r in enumerate(recs) if i not in skip}


async def test_clean_shutdown_gives_a_clean_start(tmp_path: Path) -> None:
    recs = await write(tmp_path, 150)
    cp = CheckpointFile(tmp_path / "checkpoint").load()
    assert cp is not None and cp.clean and cp.write_offset == recs[-1].end
    assert not (tmp_path / "abort").exists()
    store = open_store(tmp_path)
    try:
        assert store.clean_start and store.recovery is None
        assert (tmp_path / "abort").exists(), "a running store marks itself as not shut down"
        assert store.commitlog.max_offset == recs[-1].end
        assert served(store) == expected(recs)
    finally:
        store.shutdown()


async def test_crash_recovery_starts_at_the_checkpoint(tmp_path: Path) -> None:
    recs = await write(tmp_path, 150)
    crash(tmp_path, checkpoint_at=recs[100].physical_offset)
    store = open_store(tmp_path)
    try:
        assert not store.clean_start and store.recovery is not None
        assert store.recovery.start == recs[100].physical_offset and store.recovery.records == 50
        assert store.recovery.end == recs[-1].end and not store.recovery.corrupt_ranges
        assert served(store) == expected(recs)
    finally:
        store.shutdown()


def _cut_file(root: Path, last: Appended) -> None:
    seg = segment_path(root, last.physical_offset)
    with open(seg, "r+b") as f:
        f.truncate(last.physical_offset % SEGMENT + last.size // 2)


def _zero(root: Path, last: Appended) -> None:
    patch(root, last.physical_offset + 40, bytes(last.size - 40))


def _zero_all(root: Path, last: Appended) -> None:
    patch(root, last.physical_offset, bytes(last.size))


def _garble(root: Path, last: Appended) -> None:
    patch(root, last.physical_offset + 100, random.Random(7).randbytes(last.size - 100))


@pytest.mark.parametrize("tear", [_cut_file, _zero, _zero_all, _garble])
async def test_torn_tail_is_cut_exactly_and_its_offsets_reused(tmp_path: Path, tear) -> None:  # type: ignore[no-untyped-def]
    recs = await write(tmp_path, 30)
    last = recs[-1]
    tear(tmp_path, last)
    crash(tmp_path, checkpoint_at=recs[10].physical_offset)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None and store.recovery.end == last.physical_offset
        assert not store.recovery.corrupt_ranges and not (tmp_path / "corrupt").exists()
        assert store.commitlog.max_offset == last.physical_offset
        assert read(tmp_path, last.physical_offset, last.size) == bytes(last.size), "the tail is zeroed"
        assert store.max_offset("t", last.queue_id) == last.queue_offset
        assert served(store) == expected(recs, {len(recs) - 1})
        store.start(asyncio.get_running_loop())
        [again] = await store.put([Message("t", b"after", queue_id=last.queue_id)])
        assert (again.physical_offset, again.queue_offset) == (last.physical_offset, last.queue_offset)
    finally:
        store.shutdown()


async def test_torn_first_record_of_a_segment(tmp_path: Path) -> None:
    recs = await write(tmp_path, 80)
    first_of_seg = next(r for r in recs if r.physical_offset == SEGMENT)
    k = recs.index(first_of_seg)
    for r in recs[k:]:
        patch(tmp_path, r.physical_offset + 30, bytes(r.size - 30))
    crash(tmp_path)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None and store.recovery.end == SEGMENT
        assert served(store) == expected(recs[:k])
        store.start(asyncio.get_running_loop())
        [again] = await store.put([Message("t", b"after", queue_id=0)])
        assert again.physical_offset == SEGMENT
    finally:
        store.shutdown()


@pytest.mark.parametrize("where", ["body", "magic", "total_size", "body_length", "physical_offset"])
async def test_bit_flip_after_a_crash_is_fenced_and_the_rest_kept(tmp_path: Path, where: str) -> None:
    recs = await write(tmp_path, 60)
    k = 25
    bad = recs[k]
    at = {"body": bad.physical_offset + record.HEADER_SIZE + 4 + 300, "magic": bad.physical_offset + 5,
          "total_size": bad.physical_offset + 2, "body_length": bad.physical_offset + record.HEADER_SIZE + 2,
          "physical_offset": bad.physical_offset + record.OFF_PHYSICAL_OFFSET + 6}[where]
    original = read(tmp_path, bad.physical_offset, bad.size)
    flip(tmp_path, at)
    crash(tmp_path, checkpoint_at=recs[5].physical_offset)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None
        assert store.recovery.corrupt_ranges == [(bad.physical_offset, bad.end)]
        assert store.recovery.end == recs[-1].end, "the scan re-synchronised after the damage"
        kept = (tmp_path / "corrupt" / f"{bad.physical_offset:020d}.bin").read_bytes()
        assert len(kept) == bad.size and kept != original
        assert sum(a != b for a, b in zip(kept, original, strict=True)) == 1
        size, magic = struct.unpack(">ii", read(tmp_path, bad.physical_offset, 8))
        assert (size, magic) == (bad.size, record.CORRUPT_MAGIC_CODE)

        got = served(store)
        assert got == expected(recs, {k}), "exactly the damaged record is missing"
        assert store.read_message(bad.physical_offset) is None
        res = store.get_messages("t", bad.queue_id, bad.queue_offset, 5)
        assert res.skipped_corrupt == 1 and record.decode(res.records[0]).queue_offset == bad.queue_offset + 1

        store.start(asyncio.get_running_loop())
        [again] = await store.put([Message("t", b"after", queue_id=0)])
        assert again.physical_offset == recs[-1].end
    finally:
        store.shutdown()

    # A second crash: the fence is passed over, not reported again, and nothing else changes.
    crash(tmp_path)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None and not store.recovery.corrupt_ranges
        assert store.recovery.end == again.end
        assert served(store) == {**expected(recs, {k}), (0, again.queue_offset): b"after"}
    finally:
        store.shutdown()


@pytest.mark.parametrize("where", ["last_record", "end_of_file_blank"])
async def test_damage_at_a_segment_end_keeps_the_following_segments(tmp_path: Path, where: str) -> None:
    """Regression: damage running to a segment's end used to be taken for the end of the log, so
    recovery deleted every later segment with all their acknowledged messages."""
    recs = await write(tmp_path, 150)
    k = max(i for i, r in enumerate(recs) if r.end <= SEGMENT)
    last = recs[k]
    assert recs[k + 1].physical_offset == SEGMENT and recs[-1].end > 2 * SEGMENT
    if where == "last_record":
        flip(tmp_path, last.physical_offset + record.HEADER_SIZE + 10)
        skip, fence = {k}, (last.physical_offset, SEGMENT)
    else:
        flip(tmp_path, last.end + 5)  # the blank's magic code
        skip, fence = set(), (last.end, SEGMENT)
    crash(tmp_path)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None
        assert store.recovery.corrupt_ranges == [fence]
        assert store.recovery.end == recs[-1].end
        assert served(store) == expected(recs, skip)
    finally:
        store.shutdown()
    crash(tmp_path)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None and not store.recovery.corrupt_ranges
        assert store.recovery.end == recs[-1].end, "a fence that reaches the segment end leads to the next one"
        assert served(store) == expected(recs, skip)
    finally:
        store.shutdown()


async def test_zeroed_hole_in_the_middle_is_not_the_end_of_the_log(tmp_path: Path) -> None:
    recs = await write(tmp_path, 40)
    patch(tmp_path, recs[10].physical_offset, bytes(recs[12].end - recs[10].physical_offset))
    crash(tmp_path)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None
        assert store.recovery.corrupt_ranges == [(recs[10].physical_offset, recs[12].end)]
        assert store.recovery.end == recs[-1].end
        assert served(store) == expected(recs, {10, 11, 12})
    finally:
        store.shutdown()


async def test_bit_flip_before_the_checkpoint_is_caught_on_read(tmp_path: Path) -> None:
    recs = await write(tmp_path, 60)
    bad = recs[20]
    flip(tmp_path, bad.physical_offset + record.HEADER_SIZE + 4 + 10)
    store = open_store(tmp_path)  # clean start: recovery does not look at old records
    try:
        assert store.clean_start
        assert served(store) == expected(recs, {20})
        assert store.stats.corrupt_records_skipped >= 1
        assert store.read_message(bad.physical_offset) is None
        res = store.get_messages("t", bad.queue_id, bad.queue_offset, 1)
        assert res.skipped_corrupt == 1 and not res.records and res.next_offset == bad.queue_offset + 1
    finally:
        store.shutdown()


def _zero_entry(qdir: Path, queue_offset: int) -> None:
    pos = queue_offset * ENTRY_SIZE
    seg = qdir / f"{pos - pos % (16 * ENTRY_SIZE):020d}"
    if seg.exists():
        with open(seg, "r+b") as f:
            f.seek(pos % (16 * ENTRY_SIZE))
            f.write(bytes(ENTRY_SIZE))


async def test_consume_queues_are_rebuilt_past_the_checkpoint(tmp_path: Path) -> None:
    recs = await write(tmp_path, 120)
    cq_root = tmp_path / "consumequeue" / "t"
    before = {p: p.read_bytes() for p in cq_root.rglob("*") if p.is_file()}
    cut = 70
    # Entries of records from the checkpoint on never reached the disk.
    for r in recs[cut:]:
        _zero_entry(cq_root / str(r.queue_id), r.queue_offset)
    crash(tmp_path, checkpoint_at=recs[cut].physical_offset)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None and store.recovery.records == 120 - cut
        store.flush_queues_and_checkpoint()
        assert {p: p.read_bytes() for p in cq_root.rglob("*") if p.is_file()} == before
        assert served(store) == expected(recs)
    finally:
        store.shutdown()


async def test_queue_entries_past_the_recovered_end_are_dropped(tmp_path: Path) -> None:
    recs = await write(tmp_path, 50)
    for r in recs[-3:]:
        patch(tmp_path, r.physical_offset, bytes(r.size))  # the log lost its tail; the queues did not
    crash(tmp_path, checkpoint_at=recs[30].physical_offset)
    store = open_store(tmp_path)
    try:
        assert store.recovery is not None and store.recovery.end == recs[-3].physical_offset
        for q in (0, 1):
            assert store.max_offset("t", q) == 1 + max(r.queue_offset for r in recs[:-3] if r.queue_id == q)
        assert served(store) == expected(recs[:-3])
        store.start(asyncio.get_running_loop())
        again = await store.put([Message("t", b"x", queue_id=r.queue_id) for r in recs[-3:]])
        assert [a.queue_offset for a in again] == [r.queue_offset for r in recs[-3:]]
    finally:
        store.shutdown()


def _pull_all(broker: BrokerProcess, queue_id: int) -> list[dict[str, object]]:
    status, page = broker.call("GET", f"/v1/topics/t/queues/{queue_id}/messages?offset=0&maxMessages=100")
    assert status == 200, page
    return page["messages"]


def test_damaged_records_are_never_served_by_a_real_broker(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cfg = {"mappedFileSizeCommitLog": SEGMENT, "consumeQueueEntriesPerFile": 16}
    broker = BrokerProcess(data, flush="sync", config=cfg).start()
    try:
        assert broker.call("PUT", "/v1/topics/t", {"readQueueNums": 1, "writeQueueNums": 1})[0] == 200
        sent = [f"body-{i}-".encode() * 40 for i in range(30)]
        for b in sent:
            assert broker.call("POST", "/v1/topics/t/messages",
                               {"bodyBase64": base64.b64encode(b).decode()})[0] == 200
        msgs = _pull_all(broker, 0)
        phys = [m["commitLogOffset"] for m in msgs]
        assert broker.terminate() == 0

        # An old record (before the clean checkpoint): caught by its CRC on read.
        flip(data, phys[5] + record.HEADER_SIZE + 4 + 7)
        broker = BrokerProcess(data, flush="sync", config=cfg).start()
        msgs = _pull_all(broker, 0)
        assert [m["queueOffset"] for m in msgs] == [i for i in range(30) if i != 5]
        assert [base64.b64decode(m["bodyBase64"]) for m in msgs] == [b for i, b in enumerate(sent) if i != 5]
        metrics = broker.call("GET", "/metrics")[1]
        assert "ferrymq_corrupt_records_skipped 1.0" in metrics

        # kill -9, then a flip in a record recovery scans: fenced, never served, the rest kept.
        broker.kill9()
        flip(data, phys[20] + record.HEADER_SIZE + 4 + 3)
        (data / "checkpoint").unlink()
        broker = BrokerProcess(data, flush="sync", config=cfg).start()
        msgs = _pull_all(broker, 0)
        assert [m["queueOffset"] for m in msgs] == [i for i in range(30) if i not in (5, 20)]
        assert (data / "corrupt" / f"{phys[20]:020d}.bin").exists()
        msg_id = "7F000001" + format(broker.tcp_port, "08X") + format(phys[20], "016X")
        assert broker.call("GET", f"/v1/messages/{msg_id}")[0] == 404
        status, answer = broker.call("POST", "/v1/topics/t/messages", {"body": "after"})
        assert status == 200 and answer["results"][0]["queueOffset"] == 30
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.terminate()
