"""The master's in-sync bookkeeping (pure): catch-up credit, the confirm offset, what SYNC waits for."""

from __future__ import annotations

import time

from ferrymq.broker.ha.sync_state import SyncStateTracker

T0 = int(time.time() * 1000) + 86_400_000  # a day ahead: later than any progress record this run creates


def _tracker(isr: int = 2, all_ack: bool = False) -> SyncStateTracker:
    t = SyncStateTracker(1, isr, all_ack, max_not_catchup_ms=15_000)
    t.set_confirmed_set({1, 2, 3}, 1)
    return t


def test_a_slave_trailing_a_busy_master_still_counts_as_caught_up() -> None:
    t = _tracker()
    t.slaves.clear()
    t.on_transfer(2, master_max=1000, now_ms=T0 + 10_000)
    t.on_transfer(2, master_max=2000, now_ms=T0 + 11_000)
    t.on_ack(2, 1500, master_max=3000, now_ms=T0 + 12_000)  # behind the master, but past the first snapshot
    assert t.slaves[2].last_catchup_ms == T0 + 10_000
    t.on_ack(2, 2000, master_max=3000, now_ms=T0 + 12_500)
    assert t.slaves[2].last_catchup_ms == T0 + 11_000


def test_idle_heartbeat_acks_keep_slaves_in_sync() -> None:
    t = _tracker()
    t.on_transfer(2, master_max=500, now_ms=T0 + 100_000)
    t.on_ack(2, 500, master_max=500, now_ms=T0 + 100_001)
    t.on_transfer(3, master_max=500, now_ms=T0 + 100_000)
    t.on_ack(3, 500, master_max=500, now_ms=T0 + 100_001)
    assert t.proposed_set(now_ms=T0 + 110_000) == {1, 2, 3}


def test_a_slave_that_stops_catching_up_leaves_and_returns_at_the_confirm_offset() -> None:
    t = _tracker()
    t.master_offset = 900
    t.on_ack(2, 900, master_max=900, now_ms=T0)
    t.on_ack(3, 400, master_max=900, now_ms=T0)
    assert t.confirm_offset == 400
    assert t.proposed_set(now_ms=T0 + 20_000) == {1}  # neither caught up within 15 s
    t.set_confirmed_set({1}, 2)
    assert t.confirm_offset == 900
    t.on_ack(3, 900, master_max=900, now_ms=T0 + 20_001)
    assert t.proposed_set(now_ms=T0 + 20_002) == {1, 3}


def test_sync_waits_for_enough_in_sync_replicas() -> None:
    t = _tracker(isr=2)
    t.master_offset = 1000
    t.on_ack(2, 600, master_max=1000)
    t.on_ack(3, 800, master_max=1000)
    assert t.replicated_offset() == 800  # master + the best slave
    assert _tracker(isr=2, all_ack=True).needed_acks() == 3
    t.all_ack = True
    assert t.replicated_offset() == 600
