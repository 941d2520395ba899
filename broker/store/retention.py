"""Retention: delete old commit-log segments and the consume-queue entries that pointed into them.

As RocketMQ's CleanCommitLogService: a segment goes once it is older than fileReservedTime hours,
at the deleteWhen hour, or at any time when disk use passes diskMaxUsedSpaceRatio. Past
diskSpaceCleanForciblyRatio segments go even before they expire (oldest first), and past
diskSpaceWarningLevelRatio the store refuses writes until space is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ferrymq.broker.store.message_store import MessageStore

log = logging.getLogger(__name__)
DELETE_FILES_BATCH_MAX = 10


class RetentionService:
    def __init__(self, store: MessageStore, disk_usage: Callable[[Path], float]) -> None:
        self.store = store
        self.disk_usage = disk_usage
        self._stop = threading.Event()
        self._manual = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)
        self.deleted_segments = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._manual.set()
        self._thread.join()

    def trigger(self) -> None:
        """Run a pass now, deleting expired segments whatever the hour (admin request)."""
        self._manual.set()

    def _run(self) -> None:
        interval = self.store.config.clean_resource_interval / 1000
        while not self._stop.is_set():
            manual = self._manual.wait(interval)
            self._manual.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once(manual=manual)
            except Exception:  # pragma: no cover - keep the service alive, loudly
                log.exception("retention pass failed")

    def run_once(self, *, manual: bool = False, now: float | None = None) -> int:
        """One pass; returns how many commit-log segments it deleted."""
        cfg = self.store.config
        now = time.time() if now is None else now
        ratio = self.disk_usage(self.store.root)
        self.store.last_disk_ratio = ratio
        was_full = self.store.disk_full
        self.store.disk_full = ratio >= cfg.disk_space_warning_level_ratio
        if self.store.disk_full and not was_full:
            log.error("disk use %.0f%% passed %.0f%%: refusing writes", ratio * 100,
                      cfg.disk_space_warning_level_ratio * 100)
        elif was_full and not self.store.disk_full:
            log.warning("disk use %.0f%%: taking writes again", ratio * 100)
        over = ratio * 100 >= cfg.disk_max_used_space_ratio
        forcibly = ratio >= cfg.disk_space_clean_forcibly_ratio
        at_hour = time.localtime(now).tm_hour in cfg.delete_hours()
        if not (manual or over or forcibly or at_hour):
            return 0
        reserved = cfg.file_reserved_time * 3600
        files = self.store.commitlog.files
        deleted = 0
        while deleted < DELETE_FILES_BATCH_MAX and len(files.segments) > 1:
            seg = files.segments[0]
            # Never delete what is not durable and indexed yet.
            if seg.end > min(files.flushed_offset, self.store.dispatched_offset):
                break
            try:
                age = now - seg.path.stat().st_mtime
            except FileNotFoundError:
                age = reserved
            if age < reserved and not forcibly:
                break
            files.delete_first()
            deleted += 1
            log.info("deleted commit-log segment %s (age %.0f s, disk %.0f%%)", seg.path.name, age, ratio * 100)
        if deleted:
            self.deleted_segments += deleted
            log_min = files.min_offset
            for cq in list(self.store.queues.values()):
                cq.correct_min_offset(log_min)
        return deleted
