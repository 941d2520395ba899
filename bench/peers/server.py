"""What every peer server looks like to the orchestrator: started on 127.0.0.1 on free ports with a
temporary data directory and its own config, stopped by PID, and described by one or more
*systems under test* (one per client/protocol it is driven through)."""

from __future__ import annotations

import abc
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.peers.procs import process_tree, stop_tree


@dataclass
class System:
    """One column of the comparison: a server setting driven through one client."""

    key: str  # e.g. "redis-always", "ferrymq-sync-tcp"
    label: str  # what the table shows
    durability: str  # the stated setting, short: "AOF always", "file, acks before fsync", "SYNC_FLUSH"
    fsync_before_ack: bool  # is an acknowledged message on disk (fsync'd) before the ack?
    module: str  # bench.peers module with the driver
    target: dict[str, Any] = field(default_factory=dict)  # passed to the driver process
    is_ferrymq: bool = False
    protocol: str = ""  # FerryMQ only: "tcp" or "http"


class PeerServer(abc.ABC):
    name: str = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_pids: list[int] = []  # processes that leave the tree (daemons) but are ours
        self.version = "?"

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def systems(self) -> list[System]: ...

    def server_pids(self) -> list[int]:
        return (process_tree(self.proc.pid) if self.proc else []) + self.extra_pids

    def stop(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc, self.extra_pids)
            self.proc = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def log_path(self) -> Path:
        return self.workdir.parent / f"{self.workdir.name}.log"
