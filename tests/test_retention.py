"""Retention on real files: expired commit-log segments go, consume queues follow, disk pressure
forces deletion and finally refuses writes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ferrymq.broker.store import message_store as ms
from ferrymq.broker.store.commitlog import Appended
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.broker.store.retention import RetentionService
from ferrymq.common import record
from ferrymq.common.config import FlushDiskType, StoreConfig
from ferrymq.common.errors import FerryError
from ferrymq.common.message import Message

SEGMENT = 64 * 1024
HOUR = 3600.0


class Disk:
    """The disk_usage callable the store takes: a used ratio the test sets."""

    def __init__(self, ratio: float = 0.10) -> None:
        self.ratio = ratio

    def __call__(self, path: Path) -> float:
        assert path.is_dir()
        return self.ratio


def config(root: Path, **overrides: object) -> StoreConfig:
    base: dict[str, object] = {
        "store_path_root_dir": str(root), "mapped_file_size_commit_log": SEGMENT,
        "consume_queue_entries_per_file": 16, "flush_disk_type": FlushDiskType.SYNC_FLUSH,
        "preallocate_commit_log": False, "file_reserved_time": 1,
        # never the current hour, so only age, disk pressure or a manual trigger delete
        "delete_when": str((time.localtime().tm_hour + 12) % 24),
    }
    base.update(overrides)
    return StoreConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
async def store_with_disk(tmp_path: Path) -> AsyncIterator[Callable[..., tuple[MessageStore, Disk]]]:
    opened: list[MessageStore] = []

    def _open(**overrides: object) -> tuple[MessageStore, Disk]:
        disk = Disk()
        store = MessageStore(config(tmp_path / "store", **overrides), disk_usage=disk)
        store.load()
        store.start(asyncio.get_running_loop())
        opened.append(store)
        return store, disk

    yield _open
    for s in opened:
        s.shutdown()


async def fill(store: MessageStore, n: int = 60, queues: int = 2) -> list[Appended]:
    recs = []
    for i in range(n):  # ~4 KiB records: about 16 per segment
        recs += await store.put([Message("t", f"{i:06d}".encode() * 680, queue_id=i % queues)])
    return recs


def age_segments(store: MessageStore, hours: float, count: int | None = None) -> None:
    then = time.time() - hours * HOUR
    for seg in store.commitlog.files.segments[:count]:
        os.utime(seg.path, (then, then))


def first_readable(store: MessageStore, queue_id: int) -> int:
    res = store.get_messages("t", queue_id, store.min_offset("t", queue_id), 1)
    assert res.status == ms.FOUND, res.status
    return record.decode(res.records[0]).queue_offset


async def test_expired_segments_go_and_queues_follow(store_with_disk) -> None:  # type: ignore[no-untyped-def]
    store, disk = store_with_disk()
    recs = await fill(store, 80)
    files = store.commitlog.files
    n_before = len(files.segments)
    assert n_before >= 5
    age_segments(store, hours=2, count=3)
    retention = RetentionService(store, disk)

    assert retention.run_once() == 0, "not the deleteWhen hour and no disk pressure: nothing goes"
    assert retention.run_once(manual=True) == 3, "only the three expired segments go"
    log_min = files.min_offset
    assert log_min == 3 * SEGMENT and len(files.segments) == n_before - 3
    assert not (Path(store.config.store_path_root_dir) / "commitlog" / f"{0:020d}").exists()

    for q in (0, 1):
        gone = [r for r in recs if r.queue_id == q and r.physical_offset < log_min]
        kept = [r for r in recs if r.queue_id == q and r.physical_offset >= log_min]
        assert store.min_offset("t", q) == kept[0].queue_offset == gone[-1].queue_offset + 1
        res = store.get_messages("t", q, 0, 10)
        assert res.status == ms.OFFSET_TOO_SMALL and res.next_offset == kept[0].queue_offset
        assert first_readable(store, q) == kept[0].queue_offset
        assert store.max_offset("t", q) == kept[-1].queue_offset + 1
    # Consume-queue files holding only entries into deleted segments are gone too (16 entries a file).
    q0 = Path(store.config.store_path_root_dir) / "consumequeue" / "t" / "0"
    assert store.min_offset("t", 0) > 16
    assert f"{0:020d}" not in {p.name for p in q0.iterdir()}


async def test_delete_hour_deletes_expired_segments(store_with_disk) -> None:  # type: ignore[no-untyped-def]
    store, disk = store_with_disk(delete_when=str(time.localtime().tm_hour))
    await fill(store)
    age_segments(store, hours=2, count=1)
    assert RetentionService(store, disk).run_once() == 1


async def test_disk_pressure_expires_at_any_hour_and_forcibly_even_young_files(  # type: ignore[no-untyped-def]
        store_with_disk) -> None:
    store, disk = store_with_disk()
    await fill(store)
    files = store.commitlog.files
    age_segments(store, hours=2, count=1)
    retention = RetentionService(store, disk)
    disk.ratio = 0.80  # over diskMaxUsedSpaceRatio (75%): expired files go whatever the hour
    assert retention.run_once() == 1
    assert retention.run_once() == 0, "young files stay below the forcible ratio"
    disk.ratio = 0.86  # over diskSpaceCleanForciblyRatio: oldest files go even unexpired
    n = len(files.segments)
    assert retention.run_once() == n - 1
    assert len(files.segments) == 1, "the segment being written is never deleted"
    assert not store.disk_full


async def test_retention_never_deletes_what_is_not_durable_and_indexed(  # type: ignore[no-untyped-def]
        store_with_disk) -> None:
    store, disk = store_with_disk()
    await fill(store)
    age_segments(store, hours=2)
    files = store.commitlog.files
    store.dispatched_offset = SEGMENT  # as if dispatch lagged behind the first segment's end
    try:
        assert RetentionService(store, disk).run_once(manual=True) == 1
        assert files.min_offset == SEGMENT
    finally:
        store.dispatched_offset = store.commitlog.max_offset


async def test_nearly_full_disk_refuses_writes_until_space_is_back(store_with_disk) -> None:  # type: ignore[no-untyped-def]
    store, disk = store_with_disk(clean_resource_interval=10)  # the real retention thread, every 10 ms
    await store.put([Message("t", b"before", queue_id=0)])
    disk.ratio = 0.95
    for _ in range(500):
        if store.disk_full:
            break
        await asyncio.sleep(0.01)
    assert store.disk_full
    end = store.commitlog.max_offset
    with pytest.raises(FerryError) as err:
        await store.put([Message("t", b"refused", queue_id=0)])
    assert err.value.code == "SERVICE_NOT_AVAILABLE" and err.value.http_status == 503
    assert err.value.details.get("reason") == "DISK_FULL" and "disk" in err.value.message
    assert store.commitlog.max_offset == end, "a refused write leaves nothing behind"
    assert store.get_messages("t", 0, 0, 10).status == ms.FOUND, "reads go on"
    disk.ratio = 0.5
    for _ in range(500):
        if not store.disk_full:
            break
        await asyncio.sleep(0.01)
    [a] = await store.put([Message("t", b"after", queue_id=0)])
    assert a.queue_offset == 1


async def test_retention_survives_restart_and_crash_recovery(tmp_path: Path) -> None:
    cfg = config(tmp_path / "store")
    disk = Disk()
    store = MessageStore(cfg, disk_usage=disk)
    store.load()
    store.start(asyncio.get_running_loop())
    recs = await fill(store)
    age_segments(store, hours=2, count=3)
    assert RetentionService(store, disk).run_once(manual=True) == 3
    mins = {q: store.min_offset("t", q) for q in (0, 1)}
    store.shutdown()

    for crashed in (False, True):
        if crashed:
            (tmp_path / "store" / "abort").touch()
            (tmp_path / "store" / "checkpoint").unlink()  # recovery from the log's first offset
        store = MessageStore(cfg, disk_usage=disk)
        store.load()
        try:
            assert store.clean_start is not crashed
            assert store.commitlog.min_offset == 3 * SEGMENT
            assert {q: store.min_offset("t", q) for q in (0, 1)} == mins
            assert {q: first_readable(store, q) for q in (0, 1)} == mins
            assert store.commitlog.max_offset == recs[-1].end
        finally:
            store.shutdown()
