"""The master's view of its replicas: ack offsets, catch-up times, the SyncStateSet, the confirm offset.

Pure bookkeeping, driven by the replication server (acks) and the role manager (the set as the
controller last confirmed it). RocketMQ 5's AutoSwitchHAService rules:

* a slave leaves the SyncStateSet when it has not caught up for haMaxTimeSlaveNotCatchup;
* it re-enters once its ack offset reaches the confirm offset;
* the confirm offset is the smallest ack offset among the SyncStateSet (the master counts with its own
  durable offset) — no replica ever exposes bytes past it;
* a SYNC-replicated put is acknowledged when enough SyncStateSet members have it: all of them with
  allAckInSyncStateSet, otherwise min(inSyncReplicas, |SyncStateSet|) of them, master included.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class SlaveProgress:
    broker_id: int
    ack_offset: int = -1
    connected: bool = True
    last_catchup_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    # (the master's max offset, when) at each transfer: an ack that reaches a snapshot's offset proves
    # the slave had everything the master had at that time — RocketMQ's lastMasterMaxOffset /
    # lastTransferTimeMs, kept as a short history so that a slave trailing a busy master by a batch
    # or two still counts as caught up.
    snapshots: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=4096))


class SyncStateTracker:
    def __init__(self, master_id: int, in_sync_replicas: int, all_ack: bool, max_not_catchup_ms: int) -> None:
        self.master_id = master_id
        self.in_sync_replicas = in_sync_replicas
        self.all_ack = all_ack
        self.max_not_catchup_ms = max_not_catchup_ms
        self.sync_state_set: set[int] = {master_id}
        self.sync_state_set_epoch = 0
        self.slaves: dict[int, SlaveProgress] = {}
        self.master_offset = 0  # the master's own durable offset

    def set_confirmed_set(self, members: set[int], epoch: int) -> None:
        self.sync_state_set = set(members) | {self.master_id}
        self.sync_state_set_epoch = epoch

    def on_transfer(self, broker_id: int, master_max: int, now_ms: int | None = None) -> None:
        """The master sent the slave a frame (data or heartbeat) while its log ended at ``master_max``."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        self.slaves.setdefault(broker_id, SlaveProgress(broker_id)).snapshots.append((master_max, now_ms))

    def on_ack(self, broker_id: int, offset: int, master_max: int, now_ms: int | None = None) -> None:
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        p = self.slaves.setdefault(broker_id, SlaveProgress(broker_id))
        p.ack_offset = offset
        p.connected = True
        if offset >= master_max:
            p.last_catchup_ms = now_ms
            p.snapshots.clear()
            return
        snaps = p.snapshots
        while snaps and snaps[0][0] <= offset:
            p.last_catchup_ms = max(p.last_catchup_ms, snaps.popleft()[1])

    def on_disconnect(self, broker_id: int) -> None:
        p = self.slaves.get(broker_id)
        if p is not None:
            p.connected = False

    def _ack_of(self, broker_id: int) -> int:
        if broker_id == self.master_id:
            return self.master_offset
        p = self.slaves.get(broker_id)
        return p.ack_offset if p is not None else -1

    @property
    def confirm_offset(self) -> int:
        return min(self._ack_of(b) for b in self.sync_state_set)

    def needed_acks(self) -> int:
        n = len(self.sync_state_set)
        return n if self.all_ack else min(self.in_sync_replicas, n)

    def replicated_offset(self) -> int:
        """The highest offset that enough SyncStateSet members have for a SYNC put to complete."""
        acks = sorted((self._ack_of(b) for b in self.sync_state_set), reverse=True)
        return acks[self.needed_acks() - 1]

    def proposed_set(self, now_ms: int | None = None) -> set[int]:
        """The SyncStateSet the master should ask the controller for now (may equal the current one)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        new = {self.master_id}
        confirm = self.confirm_offset
        for b in self.sync_state_set - {self.master_id}:
            p = self.slaves.get(b)
            if p is not None and now_ms - p.last_catchup_ms <= self.max_not_catchup_ms:
                new.add(b)
        for b, p in self.slaves.items():
            if b not in new and p.connected and p.ack_offset >= confirm and \
                    now_ms - p.last_catchup_ms <= self.max_not_catchup_ms:
                new.add(b)
        return new
