"""The message store on real files: segments, records, consume queues, dispatch, flush modes."""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ferrymq.broker.store import message_store as ms
from ferrymq.broker.store.consume_queue import ENTRY_SIZE
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common import record
from ferrymq.common.config import FlushDiskType, StoreConfig
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import PROPERTIES_MAX_LENGTH
from ferrymq.common.message import PROPERTY_TAGS, Message

SEGMENT = 64 * 1024


def config(root: Path, **overrides: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path_root_dir": str(root),
        "mapped_file_size_commit_log": SEGMENT,
        "consume_queue_entries_per_file": 16,
        "flush_disk_type": FlushDiskType.SYNC_FLUSH,
        "preallocate_commit_log": False,
        "flush_interval_consume_queue": 50,
    }
    base.update(overrides)
    return StoreConfig(**base)  # type: ignore[arg-type]


def msg(body: bytes, queue_id: int = 0, topic: str = "t", tags: str | None = None, **props: str) -> Message:
    properties = dict(props)
    if tags is not None:
        properties[PROPERTY_TAGS] = tags
    return Message(topic=topic, body=body, queue_id=queue_id, properties=properties)


def pull_all(store: MessageStore, topic: str, queue_id: int) -> list[record.StoredMessage]:
    out = []
    offset = store.min_offset(topic, queue_id)
    while offset < store.max_offset(topic, queue_id):
        res = store.get_messages(topic, queue_id, offset, 100)
        out += [record.decode(r) for r in res.records]
        offset = res.next_offset
    return out


@pytest.fixture
async def open_store(tmp_path: Path) -> AsyncIterator[Callable[..., MessageStore]]:
    """Opens (load + start) stores on ``tmp_path/store``; every store left open is shut down."""
    opened: list[MessageStore] = []

    def _open(**overrides: object) -> MessageStore:
        store = MessageStore(config(tmp_path / "store", **overrides))
        store.load()
        store.start(asyncio.get_running_loop())
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.shutdown()


async def test_put_then_get_returns_the_same_message(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    m = msg(b"hello", queue_id=2, tags="paid", KEYS="k1 k2", custom="v")
    [a] = await store.put([m])
    assert (a.topic, a.queue_id, a.queue_offset, a.physical_offset) == ("t", 2, 0, 0)
    assert store.max_offset("t", 2) == 1 and store.min_offset("t", 2) == 0
    res = store.get_messages("t", 2, 0, 10)
    assert res.status == ms.FOUND and res.next_offset == 1 and len(res.records) == 1
    got = record.decode(res.records[0])
    assert got.body == b"hello" and got.topic == "t" and got.queue_id == 2 and got.queue_offset == 0
    assert got.tags == "paid" and got.keys == ["k1", "k2"] and got.properties["custom"] == "v"
    assert got.physical_offset == 0 and got.size == a.size and got.store_timestamp == a.store_timestamp
    assert store.read_message(0) == res.records[0]


async def test_queue_offsets_are_per_queue_and_a_batch_is_contiguous(
        open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    await store.put([msg(b"a", 0), msg(b"b", 1), msg(b"c", 0)])
    recs = await store.put([msg(f"x{i}".encode(), 1) for i in range(5)])
    assert [r.queue_offset for r in recs] == [1, 2, 3, 4, 5]
    assert all(recs[i].end == recs[i + 1].physical_offset for i in range(4))
    assert [m.body for m in pull_all(store, "t", 0)] == [b"a", b"c"]
    assert [m.queue_offset for m in pull_all(store, "t", 1)] == list(range(6))


async def test_rollover_pads_with_an_end_of_file_blank(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    recs = []
    for i in range(40):  # ~5000-byte records: about 13 per 64 KiB segment
        recs += await store.put([msg(bytes([i]) * 5000, queue_id=i % 3)])
    root = Path(store.config.store_path_root_dir) / "commitlog"
    names = sorted(p.name for p in root.iterdir())
    assert len(names) >= 3
    for n, name in enumerate(names):
        assert name == f"{n * SEGMENT:020d}"
        assert (root / name).stat().st_size == SEGMENT
    for r in recs:
        assert r.physical_offset // SEGMENT == (r.end - 1) // SEGMENT, "a record never spans two segments"
    # The gap between the last record of a segment and the segment end is one END_OF_FILE blank.
    for prev, nxt in itertools.pairwise(recs):
        if nxt.physical_offset != prev.end:
            assert nxt.physical_offset % SEGMENT == 0
            raw = store.commitlog.read(prev.end, 8)
            size, magic = struct.unpack(">ii", raw)
            assert magic == record.BLANK_MAGIC_CODE and size == nxt.physical_offset - prev.end
    for q in range(3):
        bodies = [m.body for m in pull_all(store, "t", q)]
        assert bodies == [bytes([i]) * 5000 for i in range(q, 40, 3)]


async def test_a_batch_crossing_a_segment_end_lands_whole(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    await store.put([msg(b"f" * 60_000)])
    recs = await store.put([msg(b"x" * 3000), msg(b"y" * 3000), msg(b"z" * 3000)])
    assert recs[0].physical_offset < SEGMENT <= recs[-1].physical_offset
    assert [m.body[:1] for m in pull_all(store, "t", 0)] == [b"f", b"x", b"y", b"z"]


async def test_consume_queue_entries_are_20_bytes_in_segment_files(
        open_store: Callable[..., MessageStore]) -> None:
    store = open_store(consume_queue_entries_per_file=16)
    recs = []
    for i in range(40):
        recs += await store.put([msg(f"m{i}".encode(), queue_id=3, tags="hello" if i % 2 else None)])
    store.flush_queues_and_checkpoint()
    qdir = Path(store.config.store_path_root_dir) / "consumequeue" / "t" / "3"
    names = sorted(p.name for p in qdir.iterdir())
    assert names == [f"{n * 16 * ENTRY_SIZE:020d}" for n in range(3)]
    raw = b"".join((qdir / n).read_bytes() for n in names)
    assert all((qdir / n).stat().st_size == 16 * ENTRY_SIZE for n in names)
    for i, r in enumerate(recs):
        phys, size, code = struct.unpack_from(">qiq", raw, i * ENTRY_SIZE)
        assert (phys, size) == (r.physical_offset, r.size)
        # Java's "hello".hashCode(), as RocketMQ stores the tag hash
        assert code == (99162322 if i % 2 else 0)
    assert raw[40 * ENTRY_SIZE:] == bytes(len(raw) - 40 * ENTRY_SIZE)


async def test_tag_filter(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    for i, tag in enumerate(["a", "b", None, "c", "a"]):
        await store.put([msg(f"{i}".encode(), tags=tag)])
    res = store.get_messages("t", 0, 0, 10, frozenset({"a", "c"}))
    assert [record.decode(r).body for r in res.records] == [b"0", b"3", b"4"]
    assert res.next_offset == 5
    res = store.get_messages("t", 0, 0, 10, frozenset({"zzz"}))
    assert res.status == ms.NO_MATCHED_MSG and not res.records and res.next_offset == 5


async def test_get_statuses_at_the_edges(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    await store.put([msg(b"1"), msg(b"2")])
    assert store.get_messages("t", 0, 2, 10).status == ms.NO_NEW_MSG
    assert store.get_messages("t", 0, 3, 10).status == ms.OFFSET_OVERFLOW_ONE
    res = store.get_messages("t", 0, 9, 10)
    assert res.status == ms.OFFSET_OVERFLOW_BADLY and res.next_offset == 2
    assert store.get_messages("nope", 0, 0, 10).status == ms.NO_NEW_MSG
    res = store.get_messages("t", 0, 0, 1)
    assert len(res.records) == 1 and res.next_offset == 1


async def test_rejected_messages_leave_no_trace(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    await store.put([msg(b"ok")])
    end = store.commitlog.max_offset
    with pytest.raises(FerryError) as too_big:
        await store.put([msg(b"small"), msg(b"x" * SEGMENT)])
    assert too_big.value.code == "MESSAGE_ILLEGAL"
    with pytest.raises(FerryError) as props:
        await store.put([msg(b"p", big="v" * PROPERTIES_MAX_LENGTH)])
    assert props.value.code == "PROPERTIES_SIZE_EXCEEDED"
    with pytest.raises(FerryError) as ctrl:
        await store.put([msg(b"p", bad="a\x01b")])
    assert ctrl.value.code == "MESSAGE_ILLEGAL"
    assert store.commitlog.max_offset == end and store.max_offset("t", 0) == 1
    [a] = await store.put([msg(b"next")])
    assert a.physical_offset == end and a.queue_offset == 1


async def test_properties_at_the_limit_are_accepted(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    value = "v" * (PROPERTIES_MAX_LENGTH - len("k") - 2)  # name, \x01, value, \x02
    [a] = await store.put([msg(b"p", k=value)])
    assert record.decode(store.read_message(a.physical_offset) or b"").properties["k"] == value


async def test_sync_flush_acknowledges_after_an_fsync_and_shares_it(
        open_store: Callable[..., MessageStore], tmp_path: Path) -> None:
    fsyncs: list[float] = []
    store = MessageStore(config(tmp_path / "gc"), on_flush_latency=fsyncs.append)
    store.load()
    store.start(asyncio.get_running_loop())
    try:
        async def one(i: int) -> None:
            [a] = await store.put([msg(f"m{i}".encode(), queue_id=i % 4)])
            assert store.commitlog.files.flushed_offset >= a.end, "acknowledged before its fsync"
            # Under SYNC_FLUSH a message becomes pullable only once durable.
            assert store.max_offset("t", a.queue_id) > a.queue_offset

        await asyncio.gather(*(one(i) for i in range(200)))
        assert 1 <= len(fsyncs) < 100, f"{len(fsyncs)} fsyncs for 200 concurrent puts: no group commit"
    finally:
        store.shutdown()


async def test_flush_disk_timeout_when_the_fsync_is_late(open_store: Callable[..., MessageStore]) -> None:
    store = open_store(sync_flush_timeout=50)
    await store.put([msg(b"first")])  # creates the segment, so the next put needs no lock
    files = store.commitlog.files
    # The flush thread needs this lock to fsync; holding it stands for a disk that does not answer.
    files.lock.acquire()
    try:
        with pytest.raises(FerryError) as err:
            await store.put([msg(b"late")])
        assert err.value.code == "FLUSH_DISK_TIMEOUT" and err.value.http_status == 504
        assert store.max_offset("t", 0) == 1, "not visible before its fsync"
    finally:
        files.lock.release()
    # The write itself stayed: once the disk answers it is flushed and becomes visible.
    for _ in range(200):
        if store.max_offset("t", 0) == 2:
            break
        await asyncio.sleep(0.01)
    assert [m.body for m in pull_all(store, "t", 0)] == [b"first", b"late"]


async def test_async_flush_answers_at_once_and_flushes_behind(
        open_store: Callable[..., MessageStore]) -> None:
    store = open_store(flush_disk_type=FlushDiskType.ASYNC_FLUSH, flush_interval_commit_log=20,
                       flush_commit_log_least_pages=0)
    recs = await store.put([msg(b"a"), msg(b"b")])
    assert store.max_offset("t", 0) == 2, "ASYNC_FLUSH makes messages visible at once"
    for _ in range(300):
        if store.commitlog.files.flushed_offset >= recs[-1].end:
            break
        await asyncio.sleep(0.01)
    assert store.commitlog.files.flushed_offset >= recs[-1].end


async def test_concurrent_reads_during_writes_see_only_whole_messages(
        open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    errors: list[str] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for m in pull_all(store, "t", 0):
                if m.body != f"m{m.queue_offset}".encode() * 100:
                    errors.append(f"offset {m.queue_offset} has a wrong body")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(150):
            await store.put([msg(f"m{i}".encode() * 100)])
    finally:
        stop.set()
        t.join()
    assert not errors
    assert len(pull_all(store, "t", 0)) == 150


async def test_lookup_offset_by_time_and_read_message(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    first = await store.put([msg(b"a"), msg(b"b")])
    await asyncio.sleep(0.02)
    second = await store.put([msg(b"c")])
    assert store.lookup_offset_by_time("t", 0, 0) == 0
    assert store.lookup_offset_by_time("t", 0, second[0].store_timestamp) == 2
    assert store.lookup_offset_by_time("t", 0, second[0].store_timestamp + 10_000) == 3
    assert record.decode(store.read_message(first[1].physical_offset) or b"").body == b"b"
    assert store.read_message(first[1].physical_offset + 1) is None  # not a record boundary
    assert store.read_message(10**12) is None


async def test_delete_topic_removes_its_queues(open_store: Callable[..., MessageStore]) -> None:
    store = open_store()
    await store.put([msg(b"a", topic="gone"), msg(b"b", topic="kept")])
    store.delete_topic("gone")
    root = Path(store.config.store_path_root_dir) / "consumequeue"
    assert not (root / "gone").exists() and (root / "kept").exists()
    assert store.max_offset("gone", 0) == 0
    [a] = await store.put([msg(b"again", topic="gone")])
    assert a.queue_offset == 0


async def test_consume_queues_are_rebuilt_from_the_commit_log_alone(tmp_path: Path) -> None:
    cfg = config(tmp_path / "store")
    store = MessageStore(cfg)
    store.load()
    store.start(asyncio.get_running_loop())
    sent = {}
    for i in range(120):
        [a] = await store.put([msg(f"m{i}".encode() * 200, queue_id=i % 5, topic=f"t{i % 2}",
                                   tags=f"g{i % 3}")])
        sent[(a.topic, a.queue_id, a.queue_offset)] = f"m{i}".encode() * 200
    store.shutdown()
    root = Path(cfg.store_path_root_dir)
    before = {p.relative_to(root): p.read_bytes() for p in (root / "consumequeue").rglob("*") if p.is_file()}
    for p in sorted((root / "consumequeue").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (root / "checkpoint").unlink()

    store = MessageStore(cfg)
    store.load()
    try:
        assert not store.clean_start and store.recovery is not None and store.recovery.records == 120
        after = {p.relative_to(root): p.read_bytes() for p in (root / "consumequeue").rglob("*") if p.is_file()}
        assert after == before, "rebuilt consume queues differ from the originals"
        got = {(m.topic, m.queue_id, m.queue_offset): m.body
               for topic in ("t0", "t1") for q in range(5) for m in pull_all(store, topic, q)}
        assert got == sent
    finally:
        store.shutdown()


def test_commit_log_segment_of_a_foreign_size_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    with open(root / "commitlog" / f"{0:020d}", "wb") as f:
        f.truncate(SEGMENT * 2)
    with open(root / "commitlog" / f"{SEGMENT * 2:020d}", "wb") as f:
        f.truncate(SEGMENT * 2)
    store = MessageStore(config(root))
    with pytest.raises(RuntimeError, match="segment size"):
        store.load()
    store.shutdown()
    assert os.path.getsize(root / "commitlog" / f"{0:020d}") == SEGMENT * 2, "never rewritten"
