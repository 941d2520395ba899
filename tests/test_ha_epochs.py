"""Epoch entries and the consistent point between a master's and a replica's history (KIP-101)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.broker.ha.epoch_file import EpochEntry, EpochFile, consistent_offset, end_of_epoch

E = EpochEntry


def test_same_history_agrees_on_the_shorter_log() -> None:
    h = [E(1, 0), E(2, 100)]
    assert consistent_offset(h, 300, h, 250) == 250
    assert consistent_offset(h, 250, h, 300) == 250


def test_diverged_tail_is_cut_at_the_epoch_boundary() -> None:
    # The replica was master in epoch 2 and wrote 100..180 that nobody else got; the new master
    # (epoch 3) started at 150 after taking only 100..150 of epoch 2.
    master = [E(1, 0), E(2, 100), E(3, 150)]
    replica = [E(1, 0), E(2, 100)]
    assert consistent_offset(master, 400, replica, 180) == 150


def test_replica_with_a_term_the_master_never_saw() -> None:
    master = [E(1, 0), E(3, 120)]
    replica = [E(1, 0), E(2, 120)]  # epoch 2 was a master that wrote nothing the new master kept
    assert consistent_offset(master, 500, replica, 200) == 120


def test_no_shared_epoch_means_full_resync() -> None:
    assert consistent_offset([E(5, 0)], 10, [E(4, 0)], 10) is None


def test_end_of_epoch() -> None:
    h = [E(1, 0), E(2, 100), E(3, 100)]
    assert end_of_epoch(h, 2, 500) == 100
    assert end_of_epoch(h, 3, 500) == 500
    assert end_of_epoch(h, 9, 500) is None


def test_epoch_file_only_grows(tmp_path: Path) -> None:
    f = EpochFile(tmp_path / "epochs")
    f.append(1, 0)
    f.append(2, 50)
    with pytest.raises(ValueError):
        f.append(1, 60)
    with pytest.raises(ValueError):
        f.append(3, 10)
    f.append(2, 50)  # idempotent
    g = EpochFile(tmp_path / "epochs")
    g.load()
    assert g.entries == [E(1, 0), E(2, 50)]
    g.truncate_suffix(50)
    assert g.entries == [E(1, 0)]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[EpochEntry], int, list[EpochEntry], int, int]:
    """A shared history, then each side's own continuation; returns both and the true common end."""
    shared_len = draw(st.integers(1, 4))
    starts = sorted(draw(st.lists(st.integers(0, 1000), min_size=shared_len, max_size=shared_len)))
    shared = [E(i + 1, s) for i, s in enumerate(starts)]
    common_end = draw(st.integers(starts[-1], starts[-1] + 500))
    m_extra = draw(st.integers(0, 300))
    r_extra = draw(st.integers(0, 300))
    # The master continues epoch `last` then may start newer epochs; the replica's tail beyond the
    # common end happened in a term the master never saw.
    master = list(shared)
    m_max = common_end + m_extra
    if m_extra and draw(st.booleans()):
        master.append(E(shared[-1].epoch + 2, common_end))
    replica = list(shared)
    r_max = common_end + r_extra
    if r_extra:
        replica.append(E(shared[-1].epoch + 1, common_end))
    return master, m_max, replica, r_max, common_end


@given(histories())
def test_consistent_point_never_keeps_foreign_bytes(h: tuple) -> None:
    master, m_max, replica, r_max, common_end = h
    # Everything the replica wrote past the common end came from a term the master never saw.
    assert consistent_offset(master, m_max, replica, r_max) == common_end
