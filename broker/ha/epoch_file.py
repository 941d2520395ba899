"""The epoch file: (epoch, startOffset) entries, one per master term, only ever growing.

RocketMQ 5's EpochFileCache (and Kafka's leader-epoch cache, KIP-101): when a replica joins a master
it finds the last epoch both logs share and truncates to where the two histories agree, so no replica
keeps (and serves) bytes the master does not have at that offset.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from ferrymq.common.durable import read_json, write_json_atomic


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


def end_of_epoch(entries: list[EpochEntry], epoch: int, max_offset: int) -> int | None:
    """Where ``epoch`` ends in a log with these entries: the next entry's start, or the log end."""
    for i, e in enumerate(entries):
        if e.epoch == epoch:
            return entries[i + 1].start_offset if i + 1 < len(entries) else max_offset
    return None


def consistent_offset(master: list[EpochEntry], master_max: int, replica: list[EpochEntry],
                      replica_max: int) -> int | None:
    """The offset up to which ``replica`` agrees with ``master``; None when they share no epoch.

    The newest epoch both know decides: its end in either log bounds what can be trusted. An epoch
    number is created by one master at one start offset, so a shared number means shared history up
    to where the shorter of the two copies of that epoch ends.
    """
    master_epochs = {e.epoch for e in master}
    for entry in reversed(replica):
        if entry.epoch in master_epochs:
            m_end = end_of_epoch(master, entry.epoch, master_max)
            r_end = end_of_epoch(replica, entry.epoch, replica_max)
            assert m_end is not None and r_end is not None
            return min(m_end, r_end)
    return None


class EpochFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[EpochEntry] = []
        self._lock = threading.Lock()

    def load(self) -> None:
        raw = read_json(self.path, {}) or {}
        self.entries = [EpochEntry(int(e), int(s)) for e, s in raw.get("entries", [])]

    def _save(self) -> None:
        write_json_atomic(self.path, {"entries": [[e.epoch, e.start_offset] for e in self.entries]})

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def append(self, epoch: int, start_offset: int) -> None:
        """Record a new term; epochs only grow, and a term never starts before the previous one."""
        with self._lock:
            if self.entries:
                last = self.entries[-1]
                if epoch < last.epoch or (epoch == last.epoch and start_offset != last.start_offset):
                    raise ValueError(f"epoch {epoch}@{start_offset} does not follow {last.epoch}@{last.start_offset}")
                if epoch == last.epoch:
                    return
                if start_offset < last.start_offset:
                    raise ValueError(f"epoch {epoch} would start at {start_offset}, before epoch {last.epoch}")
            self.entries.append(EpochEntry(epoch, start_offset))
            self._save()

    def truncate_suffix(self, offset: int) -> None:
        """Forget terms that start at or after ``offset`` (the log was cut there)."""
        with self._lock:
            keep = [e for e in self.entries if e.start_offset < offset]
            if keep != self.entries:
                self.entries = keep
                self._save()

    def replace(self, entries: list[EpochEntry]) -> None:
        with self._lock:
            self.entries = list(entries)
            self._save()
