"""The store checkpoint: how far the commit log and the consume queues are known to be durable.

``log_flushed``: every commit-log byte before it was fsync'd. ``dispatched``: every consume-queue
entry for a record before it was fsync'd. Crash recovery validates and re-dispatches the log from
``min(log_flushed, dispatched)``; a clean shutdown also records ``write_offset`` so that a clean start
skips validation.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ferrymq.common.durable import read_json, write_json_atomic


@dataclass
class Checkpoint:
    log_flushed: int = 0
    dispatched: int = 0
    write_offset: int = 0
    clean: bool = False
    timestamp_ms: int = 0

    @property
    def recover_from(self) -> int:
        return min(self.log_flushed, self.dispatched)


class CheckpointFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        # The flusher thread, shutdown and replication all save it; they share one temporary file.
        self._lock = threading.Lock()
        # Bumped when the log is cut back: a save computed before the cut must not land after it,
        # or recovery would start past the log's new end.
        self.generation = 0

    def load(self) -> Checkpoint | None:
        raw = read_json(self.path)
        if not isinstance(raw, dict):
            return None
        try:
            return Checkpoint(**{k: raw[k] for k in Checkpoint.__dataclass_fields__ if k in raw})
        except TypeError:
            return None

    def begin_cut(self) -> None:
        """Call before cutting the log back: saves computed before now are dropped."""
        with self._lock:
            self.generation += 1

    def save(self, cp: Checkpoint, *, generation: int | None = None) -> bool:
        """Write ``cp``; with ``generation`` (read before ``cp`` was computed) skip it if the log was
        cut meanwhile. Returns whether it was written."""
        cp.timestamp_ms = int(time.time() * 1000)
        with self._lock:
            if generation is not None and generation != self.generation:
                return False
            write_json_atomic(self.path, asdict(cp))
            return True
