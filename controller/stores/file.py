"""The embedded default: one controller, state in a fsync'd JSON file.

The directory is locked (``flock``) for the life of the process, so a second controller pointed at the same
directory refuses to start instead of silently forking the state; the lock holder is always the leader.
Every write is write-fsync-rename-fsync(dir), done on a worker thread.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path
from typing import Any

from ferrymq.common.durable import read_json, write_json_atomic
from ferrymq.controller.stores.base import ControllerStore, StoreConflict, StoreUnavailable, Versioned

STATE_FILE = "controller-state.json"
LOCK_FILE = ".lock"


class FileStore(ControllerStore):
    def __init__(self, directory: str | os.PathLike[str], identity: str) -> None:
        super().__init__(identity)
        self.directory = Path(directory)
        self._lock_fd: int | None = None
        self._version: int | None = None

    async def open(self) -> None:
        await asyncio.to_thread(self._open)

    def _open(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreUnavailable(f"cannot use {self.directory}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise StoreUnavailable(f"{self.directory} is in use by another controller; the file store "
                                   "serves exactly one (use etcd or kubernetes for several)") from exc
        self._lock_fd = fd

    async def load(self) -> Versioned:
        raw = await asyncio.to_thread(read_json, self.directory / STATE_FILE)
        if raw is None:
            self._version = 0
            return Versioned(None, 0)
        self._version = int(raw["version"])
        return Versioned(raw["state"], self._version)

    async def compare_and_swap(self, expected_version: Any, data: dict[str, Any]) -> Any:
        if self._version is None:
            await self.load()
        if expected_version != self._version:
            raise StoreConflict(f"state version is {self._version}, not {expected_version}")
        new_version = int(expected_version) + 1
        try:
            await asyncio.to_thread(write_json_atomic, self.directory / STATE_FILE,
                                    {"version": new_version, "state": data})
        except OSError as exc:
            self._version = None  # the rename may or may not have happened: re-read before the next write
            raise StoreUnavailable(f"cannot write {self.directory / STATE_FILE}: {exc.strerror}") from exc
        self._version = new_version
        return new_version

    async def campaign(self) -> bool:
        return self._lock_fd is not None

    def is_leader(self) -> bool:
        return self._lock_fd is not None

    def leader_address(self) -> str | None:
        return self.identity

    async def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    @property
    def campaign_interval_s(self) -> float:
        return 5.0
