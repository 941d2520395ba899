"""Committed consume offsets per (group, topic, queueId), as RocketMQ's ConsumerOffsetManager.

Commits land in memory at once and reach disk (write, fsync, rename) every
flushConsumerOffsetInterval and on shutdown. A crash may so lose the last few seconds of commits;
consumers then see those messages again — at-least-once, never a skipped message.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ferrymq.common.durable import read_json, write_json_atomic

log = logging.getLogger(__name__)


class OffsetManager:
    def __init__(self, path: Path, flush_interval_ms: int = 5000) -> None:
        self.path = path
        self.interval = flush_interval_ms / 1000
        # group -> topic -> queueId -> offset
        self.offsets: dict[str, dict[str, dict[int, int]]] = {}
        self._dirty = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        raw = read_json(self.path, {}) or {}
        for group, topics in raw.get("offsets", {}).items():
            self.offsets[group] = {t: {int(q): int(o) for q, o in qs.items()} for t, qs in topics.items()}

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="offset-persist", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.persist()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.persist()
            except OSError:  # pragma: no cover - a failing disk; retried next round
                log.exception("persisting consumer offsets failed")

    def persist(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            snapshot = {g: {t: {str(q): o for q, o in qs.items()} for t, qs in ts.items()}
                        for g, ts in self.offsets.items()}
            self._dirty = False
        try:
            write_json_atomic(self.path, {"offsets": snapshot})
        except OSError:
            self._dirty = True
            raise

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        with self._lock:
            self.offsets.setdefault(group, {}).setdefault(topic, {})[queue_id] = offset
            self._dirty = True

    def replace_all(self, snapshot: dict[str, dict[str, dict[str, int]]]) -> None:
        """Take the master's offsets as they are (a slave's periodic sync)."""
        new = {g: {t: {int(q): int(o) for q, o in qs.items()} for t, qs in ts.items()} for g, ts in snapshot.items()}
        with self._lock:
            if new != self.offsets:
                self.offsets = new
                self._dirty = True

    def snapshot(self) -> dict[str, dict[str, dict[str, int]]]:
        with self._lock:
            return {g: {t: {str(q): o for q, o in qs.items()} for t, qs in ts.items()}
                    for g, ts in self.offsets.items()}

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group has none for this queue."""
        return self.offsets.get(group, {}).get(topic, {}).get(queue_id, -1)

    def groups_of_topic(self, topic: str) -> dict[str, dict[int, int]]:
        return {g: dict(ts[topic]) for g, ts in self.offsets.items() if topic in ts}

    def forget_topic(self, topic: str) -> None:
        with self._lock:
            for ts in self.offsets.values():
                if ts.pop(topic, None) is not None:
                    self._dirty = True
