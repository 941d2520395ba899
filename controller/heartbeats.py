"""Broker liveness, as RocketMQ's BrokerHeartbeatManager keeps it: in memory, on the leading controller only.

Each replica's last heartbeat (monotonic clock) and what it reported: epoch, max offset, confirm offset,
election priority and whether it is taking writes. A replica is alive while its last heartbeat is younger
than ``controllerBrokerHeartbeatTimeout``. Nothing here is persisted: a controller that becomes leader
``seed``s every known replica as just seen, which gives live brokers one timeout to reach it before anyone
is declared dead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ferrymq.controller.replicas import ReplicaStatus


@dataclass
class _Beat:
    last_seen: float
    status: ReplicaStatus


class HeartbeatTable:
    def __init__(self, timeout_ms: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_ms / 1000
        self.clock = clock
        self._beats: dict[tuple[str, int], _Beat] = {}

    def beat(self, group: str, broker_id: int, *, epoch: int, max_offset: int, confirm_offset: int = -1,
             election_priority: int | None = None, writable: bool | None = None) -> None:
        self._beats[(group, broker_id)] = _Beat(self.clock(), ReplicaStatus(
            alive=True, epoch=epoch, max_offset=max_offset, confirm_offset=confirm_offset,
            election_priority=election_priority, writable=writable))

    def touch(self, group: str, broker_id: int) -> None:
        """Seen (a registration), keeping whatever it reported before."""
        old = self._beats.get((group, broker_id))
        self._beats[(group, broker_id)] = _Beat(self.clock(), old.status if old else ReplicaStatus(alive=True))

    def seed(self, group: str, broker_ids: Iterable[int]) -> None:
        now = self.clock()
        for b in broker_ids:
            self._beats.setdefault((group, b), _Beat(now, ReplicaStatus(alive=True)))

    def forget_writable(self, group: str, broker_id: int) -> None:
        """Drop the replica's last ``writable`` report, so only a heartbeat from now on can answer it."""
        beat = self._beats.get((group, broker_id))
        if beat is not None:
            beat.status = replace(beat.status, writable=None)

    def alive(self, group: str, broker_id: int) -> bool:
        beat = self._beats.get((group, broker_id))
        return beat is not None and self.clock() - beat.last_seen < self.timeout_s

    def statuses(self, group: str) -> dict[int, ReplicaStatus]:
        now = self.clock()
        return {b: replace(beat.status, alive=now - beat.last_seen < self.timeout_s)
                for (g, b), beat in self._beats.items() if g == group}

    def age_s(self, group: str, broker_id: int) -> float | None:
        beat = self._beats.get((group, broker_id))
        return None if beat is None else self.clock() - beat.last_seen

    def clear(self) -> None:
        self._beats.clear()
