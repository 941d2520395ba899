"""The replication link in one process: a master store streaming to a slave store over loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ferrymq.broker.ha.epoch_file import EpochFile
from ferrymq.broker.ha.ha_client import HAClient
from ferrymq.broker.ha.ha_server import HAServer
from ferrymq.broker.ha.sync_state import SyncStateTracker
from ferrymq.broker.store.message_store import MessageStore
from ferrymq.common.config import StoreConfig
from ferrymq.common.message import Message


def _store(path: Path, flush: str = "SYNC_FLUSH") -> MessageStore:
    s = MessageStore(StoreConfig(store_path_root_dir=str(path), mapped_file_size_commit_log=64 * 1024,
                                 consume_queue_entries_per_file=64, flush_disk_type=flush))
    s.load()
    s.start(asyncio.get_running_loop())
    return s


class Pair:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def __aenter__(self) -> Pair:
        self.master = _store(self.root / "m")
        self.slave = _store(self.root / "s")
        self.m_epochs = EpochFile(self.root / "m-epochs")
        self.s_epochs = EpochFile(self.root / "s-epochs")
        self.m_epochs.load()
        self.s_epochs.load()
        if not self.m_epochs.entries:
            self.m_epochs.append(1, 0)
        self.tracker = SyncStateTracker(1, 2, False, 15_000)
        self.tracker.master_offset = self.master.commitlog.files.flushed_offset
        self.acks: list[tuple[int, int]] = []

        def on_ack(bid: int, off: int) -> None:
            self.acks.append((bid, off))
            self.tracker.on_ack(bid, off, self.master.commitlog.max_offset)

        self.server = HAServer(self.master, self.m_epochs, "127.0.0.1", 0, 4096, on_ack, lambda b: None)
        self.server.tracker = self.tracker
        def on_log() -> None:  # what ReplicaManager does on a master
            self.tracker.master_offset = self.master.commitlog.files.flushed_offset
            self.server.notify_data()

        self.master.log_listeners.append(on_log)
        await self.server.start()
        self.client = HAClient(self.slave, self.s_epochs, 2, f"127.0.0.1:{self.server.port}", 1)
        self.slave.extra_visibility_limit = lambda: self.client.confirm_offset
        self.client.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.stop()
        await self.server.stop()
        self.master.shutdown()
        self.slave.shutdown()

    async def caught_up(self, within_s: float = 10) -> None:
        end = self.master.commitlog.max_offset
        for _ in range(int(within_s * 100)):
            if self.slave.commitlog.max_offset == end and self.acks and self.acks[-1][1] == end:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"slave at {self.slave.commitlog.max_offset}, master at {end}")


async def _send(store: MessageStore, n: int, prefix: str, queues: int = 3) -> None:
    for i in range(n):
        await store.put([Message(topic="t", body=f"{prefix}-{i}".encode() * 60, queue_id=i % queues)])


def _bodies(store: MessageStore, queues: int = 3) -> list[bytes]:
    from ferrymq.common import record

    out = []
    for q in range(queues):
        off = 0
        while True:
            r = store.get_messages("t", q, off, 100)
            out += [record.decode(raw).body for raw in r.records]
            if not r.records:
                break
            off = r.next_offset
    return sorted(out)


async def test_slave_copies_the_log_byte_for_byte_across_segments(tmp_path: Path) -> None:
    async with Pair(tmp_path) as p:
        await _send(p.master, 300, "a")  # ~180 KiB: several 64 KiB segments
        await p.caught_up()
        m, s = p.master.commitlog, p.slave.commitlog
        assert m.max_offset == s.max_offset
        for off in range(0, m.max_offset, 64 * 1024):
            assert m.files.pread(off, 64 * 1024) == s.files.pread(off, 64 * 1024)
        assert len(s.files.segments) == len(m.files.segments) >= 2
        # The slave serves what the master confirmed: the tracker's ISR is the master alone here,
        # so the confirm offset is the master's own durable offset.
        await asyncio.sleep(0.1)
        assert _bodies(p.slave) == _bodies(p.master)
        assert p.s_epochs.entries == p.m_epochs.entries


async def test_slave_exposes_nothing_past_the_confirm_offset(tmp_path: Path) -> None:
    async with Pair(tmp_path) as p:
        p.tracker.set_confirmed_set({1, 2, 3}, 1)  # broker 3 never acks: confirm stays at 0
        await _send(p.master, 20, "b")
        await p.caught_up()
        await asyncio.sleep(0.2)
        assert p.slave.get_messages("t", 0, 0, 10).records == []
        assert p.master.max_offset("t", 0) == 7  # indexed on the master
        p.tracker.set_confirmed_set({1, 2}, 2)
        p.server.notify_data()
        for _ in range(200):
            if p.slave.get_messages("t", 0, 0, 10).records:
                break
            await asyncio.sleep(0.01)
        assert len(p.slave.get_messages("t", 0, 0, 10).records) == 7


async def test_diverged_slave_truncates_to_the_shared_history(tmp_path: Path) -> None:
    async with Pair(tmp_path) as p:
        await _send(p.master, 30, "c")
        await p.caught_up()
    # The "slave" had been master in epoch 2 and wrote records no one else got.
    slave = _store(tmp_path / "s")
    s_epochs = EpochFile(tmp_path / "s-epochs")
    s_epochs.load()
    shared_end = slave.commitlog.max_offset
    s_epochs.append(2, shared_end)
    await _send(slave, 10, "lost")
    slave.shutdown()
    # Meanwhile the real master moved to epoch 3 and wrote on.
    master = _store(tmp_path / "m")
    m_epochs = EpochFile(tmp_path / "m-epochs")
    m_epochs.load()
    m_epochs.append(3, master.commitlog.max_offset)
    await _send(master, 10, "new")
    master.shutdown()
    async with Pair(tmp_path) as p:
        await p.caught_up()
        await asyncio.sleep(0.1)
        bodies = _bodies(p.slave)
        assert not any(b.startswith(b"lost") for b in bodies)
        assert bodies == _bodies(p.master)
        assert [e.epoch for e in p.s_epochs.entries] == [1, 3]
