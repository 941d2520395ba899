"""The pure replica rules: broker ids, SyncStateSet fencing, election policy, graceful switch, persistence."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.controller import replicas as r
from ferrymq.controller.errors import ControllerError
from ferrymq.controller.replicas import GroupState, ReplicaStatus, Switch


def reg(state: GroupState | None, name: str, broker_id: int | None = None, prio: int = 0) -> r.Registration:
    return r.register(state, "g", name, http_address=f"{name}:8080", tcp_address=f"{name}:10911",
                      ha_address=f"{name}:10912", broker_id=broker_id, election_priority=prio)


def group_of(*names: str) -> GroupState:
    state = None
    for n in names:
        state = reg(state, n).state
    assert state is not None
    return state


def alive(**facts: tuple[int, int]) -> dict[int, ReplicaStatus]:
    """alive(b1=(epoch, maxOffset), ...) -> statuses keyed by broker id."""
    return {int(k[1:]): ReplicaStatus(alive=True, epoch=e, max_offset=o) for k, (e, o) in facts.items()}


# ---- registration -------------------------------------------------------------------------------------
def test_first_replica_becomes_master_at_once() -> None:
    res = reg(None, "a")
    assert res.broker_id == 1
    s = res.state
    assert (s.master_id, s.master_epoch, s.sync_state_set, s.sync_state_set_epoch) == (1, 1, frozenset({1}), 1)


def test_ids_start_at_one_and_a_name_keeps_its_id() -> None:
    s = group_of("a", "b", "c")
    assert {rep.name: bid for bid, rep in s.replicas.items()} == {"a": 1, "b": 2, "c": 3}
    again = reg(s, "b", broker_id=None)
    assert again.broker_id == 2
    assert reg(s, "b", broker_id=7).broker_id == 2  # the name wins over a stale .broker.meta
    assert s.master_id == 1 and s.master_epoch == 1  # later replicas do not change the master


def test_reregistration_updates_addresses_only() -> None:
    s = group_of("a", "b")
    moved = r.register(s, "g", "b", http_address="new:1", tcp_address="new:2", ha_address="new:3",
                       broker_id=2).state
    assert moved.replicas[2].http_address == "new:1"
    assert (moved.master_id, moved.master_epoch, moved.sync_state_set_epoch) == (1, 1, 1)


def test_known_id_from_broker_meta_is_adopted_when_free() -> None:
    s = group_of("a")
    res = reg(s, "z", broker_id=5)
    assert res.broker_id == 5
    assert reg(res.state, "y").broker_id == 2  # the next free id fills the gap
    with pytest.raises(ControllerError) as exc:
        reg(res.state, "w", broker_id=5)
    assert exc.value.code == "BROKER_ID_CONFLICT" and exc.value.http_status == 409


@pytest.mark.parametrize("bad", [0, -1])
def test_broker_ids_below_one_are_refused(bad: int) -> None:
    with pytest.raises(ControllerError) as exc:
        reg(None, "a", broker_id=bad)
    assert exc.value.http_status == 400


def test_next_free_id() -> None:
    assert r.next_free_id([]) == 1
    assert r.next_free_id([1, 2, 4]) == 3
    assert r.next_free_id([2, 3]) == 1


# ---- SyncStateSet -------------------------------------------------------------------------------------
def alter(s: GroupState, new: list[int], statuses: dict[int, ReplicaStatus], *, master: int | None = None,
          epoch: int | None = None, sss_epoch: int | None = None) -> GroupState:
    return r.alter_sync_state_set(
        s, master_id=s.master_id if master is None else master, master_epoch=s.master_epoch if epoch is None else epoch,
        sync_state_set_epoch=s.sync_state_set_epoch if sss_epoch is None else sss_epoch, new_set=new,
        statuses=statuses)


def test_expand_and_shrink_bump_the_epoch() -> None:
    s = group_of("a", "b", "c")
    grown = alter(s, [1, 2, 3], alive(b1=(1, 0), b2=(1, 0), b3=(1, 0)))
    assert grown.sync_state_set == {1, 2, 3} and grown.sync_state_set_epoch == 2
    shrunk = alter(grown, [1, 3], alive(b1=(1, 0)))  # removing a dead member is what shrinking is for
    assert shrunk.sync_state_set == {1, 3} and shrunk.sync_state_set_epoch == 3
    assert alter(shrunk, [3, 1], {}) is shrunk  # unchanged: no new epoch


@pytest.mark.parametrize(("kw", "code"), [
    ({"master": 2}, "FENCED_MASTER_EPOCH"),
    ({"epoch": 0}, "FENCED_MASTER_EPOCH"),
    ({"epoch": 2}, "FENCED_MASTER_EPOCH"),
    ({"sss_epoch": 0}, "FENCED_SYNC_STATE_SET_EPOCH"),
])
def test_alter_is_fenced(kw: dict[str, int], code: str) -> None:
    s = group_of("a", "b")
    with pytest.raises(ControllerError) as exc:
        alter(s, [1, 2], alive(b1=(1, 0), b2=(1, 0)), **kw)
    assert exc.value.code == code and exc.value.http_status == 409


def test_alter_on_group_without_master_is_fenced() -> None:
    s = replace(group_of("a"), master_id=None)
    with pytest.raises(ControllerError) as exc:
        r.alter_sync_state_set(s, master_id=1, master_epoch=1, sync_state_set_epoch=1, new_set=[1], statuses={})
    assert exc.value.code == "FENCED_MASTER_EPOCH"


@pytest.mark.parametrize(("new", "statuses"), [
    ([2], alive(b1=(1, 0), b2=(1, 0))),          # leaves the master out
    ([1, 9], alive(b1=(1, 0), b9=(1, 0))),       # names an unknown broker
    ([1, 2], alive(b1=(1, 0))),                  # adds a dead broker
    ([1, 2], {2: ReplicaStatus(alive=False)}),   # ... expired
])
def test_alter_refuses_bad_sets(new: list[int], statuses: dict[int, ReplicaStatus]) -> None:
    s = group_of("a", "b")
    with pytest.raises(ControllerError) as exc:
        alter(s, new, statuses)
    assert exc.value.http_status == 400


# ---- election -----------------------------------------------------------------------------------------
def isr_group(n: int) -> GroupState:
    s = group_of(*[f"n{i}" for i in range(1, n + 1)])
    return replace(s, sync_state_set=frozenset(range(1, n + 1)), sync_state_set_epoch=2)


def test_alive_master_is_kept() -> None:
    s = isr_group(3)
    assert r.elect(s, alive(b1=(1, 0), b2=(1, 99)), unclean=False) is s


def test_order_epoch_then_offset_then_priority_then_id() -> None:
    s = isr_group(4)
    assert r.candidates(s, alive(b2=(1, 500), b3=(2, 10), b4=(1, 900)), unclean=False) == [3, 4, 2]
    assert r.candidates(s, alive(b2=(1, 500), b3=(1, 500), b4=(1, 400)), unclean=False) == [2, 3, 4]
    prio = {2: ReplicaStatus(True, 1, 500, election_priority=5), 3: ReplicaStatus(True, 1, 500, election_priority=1)}
    assert r.candidates(s, prio, unclean=False) == [3, 2]


def test_registered_priority_is_used_when_heartbeat_has_none() -> None:
    s = replace(isr_group(3), replicas={**isr_group(3).replicas,
                                        2: replace(isr_group(3).replicas[2], election_priority=9)})
    assert r.candidates(s, alive(b2=(1, 0), b3=(1, 0)), unclean=False) == [3, 2]


def test_election_promotes_and_bumps_both_epochs() -> None:
    s = isr_group(3)
    new = r.elect(s, alive(b2=(1, 5), b3=(1, 9)), unclean=False)
    assert new.master_id == 3
    assert new.master_epoch == s.master_epoch + 1
    assert new.sync_state_set == {3} and new.sync_state_set_epoch == s.sync_state_set_epoch + 1


def test_clean_election_ignores_replicas_outside_the_sync_state_set() -> None:
    s = group_of("a", "b", "c")  # SyncStateSet {1}: b and c never caught up
    statuses = alive(b2=(1, 0), b3=(1, 0))
    new = r.elect(s, statuses, unclean=False)
    assert new.master_id is None
    assert new.master_epoch == s.master_epoch + 1  # the deposed master is fenced
    assert new.sync_state_set == s.sync_state_set and new.sync_state_set_epoch == s.sync_state_set_epoch
    assert not r.electable(new, statuses, unclean=False)
    assert r.elect(new, statuses, unclean=False) is new  # nothing changes while nobody is electable


def test_unclean_election_takes_any_alive_replica() -> None:
    s = group_of("a", "b", "c")
    new = r.elect(s, alive(b2=(1, 3), b3=(1, 8)), unclean=True)
    assert new.master_id == 3 and new.sync_state_set == {3}


def test_returning_in_sync_replica_is_elected_later() -> None:
    s = r.elect(group_of("a", "b"), alive(b2=(1, 0)), unclean=False)
    assert s.master_id is None
    back = r.elect(s, alive(b1=(1, 0), b2=(1, 0)), unclean=False)
    assert back.master_id == 1 and back.master_epoch == s.master_epoch + 1


def test_dead_replicas_are_never_candidates() -> None:
    s = isr_group(3)
    statuses = {2: ReplicaStatus(alive=False, epoch=9, max_offset=999), 3: ReplicaStatus(alive=True)}
    assert r.candidates(s, statuses, unclean=True) == [3]


status_st = st.builds(ReplicaStatus, alive=st.booleans(), epoch=st.integers(-1, 4), max_offset=st.integers(-1, 50),
                      election_priority=st.one_of(st.none(), st.integers(0, 3)))


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 6), statuses=st.dictionaries(st.integers(1, 7), status_st, max_size=7),
       sss=st.sets(st.integers(1, 6), min_size=1), master=st.one_of(st.none(), st.integers(1, 6)),
       unclean=st.booleans())
def test_election_properties(n: int, statuses: dict[int, ReplicaStatus], sss: set[int], master: int | None,
                             unclean: bool) -> None:
    base = group_of(*[f"n{i}" for i in range(1, n + 1)])
    s = replace(base, master_id=master if master is None or master <= n else None,
                sync_state_set=frozenset(b for b in sss if b <= n) or frozenset({1}), master_epoch=3,
                sync_state_set_epoch=5)
    new = r.elect(s, statuses, unclean=unclean)
    if r.is_alive(statuses, s.master_id):
        assert new is s
        return
    pool = set(s.replicas) if unclean else set(s.sync_state_set)
    eligible = [b for b in pool if b != s.master_id and r.is_alive(statuses, b)]
    if not eligible:
        assert new.master_id is None and new.sync_state_set == s.sync_state_set
        assert new.master_epoch == s.master_epoch + (1 if s.master_id is not None else 0)
        return
    winner = new.master_id
    assert winner in eligible
    w = statuses[winner]
    for b in eligible:  # nobody eligible is strictly better than the winner
        o = statuses[b]
        assert (o.epoch, o.max_offset) <= (w.epoch, w.max_offset)
    assert new.sync_state_set == {winner}
    assert (new.master_epoch, new.sync_state_set_epoch) == (4, 6)


# ---- graceful switch ----------------------------------------------------------------------------------
def test_designate_refuses_targets_outside_the_set_or_dead() -> None:
    s = isr_group(2)
    s3 = reg(s, "n3").state
    for target, statuses in ((3, alive(b1=(1, 0), b3=(1, 0))), (2, alive(b1=(1, 0))), (9, alive(b1=(1, 0)))):
        with pytest.raises(ControllerError) as exc:
            r.designate(s3, target, statuses, now_ms=0, timeout_ms=100)
        assert exc.value.code == "NOT_IN_SYNC_STATE_SET"


def test_designate_records_the_switch_and_refuses_a_second_one() -> None:
    s = isr_group(3)
    statuses = alive(b1=(1, 10), b2=(1, 10), b3=(1, 10))
    sw = r.designate(s, 2, statuses, now_ms=1000, timeout_ms=500)
    assert sw.switching == Switch(1, 2, 1000, 1500) and sw.master_id == 1
    assert r.designate(sw, 2, statuses, now_ms=1100, timeout_ms=500) is sw
    with pytest.raises(ControllerError) as exc:
        r.designate(sw, 3, statuses, now_ms=1100, timeout_ms=500)
    assert exc.value.code == "SWITCH_IN_PROGRESS"
    assert r.designate(s, 1, statuses, now_ms=0, timeout_ms=1) is s  # already master


def test_designate_without_live_master_promotes_at_once() -> None:
    s = isr_group(2)
    new = r.designate(s, 2, alive(b2=(1, 0)), now_ms=0, timeout_ms=100)
    assert new.master_id == 2 and new.switching is None and new.master_epoch == 2


def test_switch_completes_only_after_master_stopped_and_target_caught_up() -> None:
    s = r.designate(isr_group(2), 2, alive(b1=(1, 100), b2=(1, 90)), now_ms=0, timeout_ms=1000)

    def at(old_writable: bool | None, old_off: int, new_off: int) -> GroupState:
        statuses = {1: ReplicaStatus(True, 1, old_off, writable=old_writable), 2: ReplicaStatus(True, 1, new_off)}
        return r.progress_switch(s, statuses, now_ms=10)

    assert at(None, 100, 100) is s      # the old master has not said it stopped
    assert at(True, 100, 100) is s      # ... still writing
    assert at(False, 100, 99) is s      # the target is behind
    done = at(False, 100, 100)
    assert done.master_id == 2 and done.switching is None
    assert (done.master_epoch, done.sync_state_set, done.sync_state_set_epoch) == (2, {2}, 3)


@pytest.mark.parametrize("why", ["deadline", "target-dead", "target-left-set", "master-changed"])
def test_switch_is_abandoned(why: str) -> None:
    s = r.designate(isr_group(2), 2, alive(b1=(1, 100), b2=(1, 90)), now_ms=0, timeout_ms=1000)
    statuses = {1: ReplicaStatus(True, 1, 100, writable=False), 2: ReplicaStatus(True, 1, 50)}
    now = 10
    if why == "deadline":
        now = 1000
    elif why == "target-dead":
        statuses[2] = ReplicaStatus(False, 1, 100)
    elif why == "target-left-set":
        s = replace(s, sync_state_set=frozenset({1}))
    else:
        s = replace(s, master_id=None)
    new = r.progress_switch(s, statuses, now_ms=now)
    assert new.switching is None
    assert new.master_id == s.master_id  # nothing else moves


def test_election_after_dead_master_clears_a_switch() -> None:
    s = r.designate(isr_group(3), 2, alive(b1=(1, 100), b2=(1, 90), b3=(1, 95)), now_ms=0, timeout_ms=1000)
    new = r.elect(s, alive(b2=(1, 90), b3=(1, 95)), unclean=False)
    assert new.master_id == 3 and new.switching is None


# ---- persistence --------------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(names=st.lists(st.text("abcxyz", min_size=1, max_size=4), min_size=1, max_size=5, unique=True),
       switching=st.booleans(), topics=st.dictionaries(st.text("tq", min_size=1, max_size=3),
                                                       st.integers(0, 16), max_size=3))
def test_state_json_round_trip(names: list[str], switching: bool, topics: dict[str, int]) -> None:
    s = group_of(*names)
    s = replace(s, switching=Switch(1, 1, 5, 9) if switching else None,
                topics={t: {"readQueueNums": q, "writeQueueNums": q, "perm": "RW"} for t, q in topics.items()})
    other = replace(group_of("q"), group="h")
    raw = r.state_to_json({"g": s, "h": other})
    assert r.state_from_json(raw) == {"g": s, "h": other}
    assert r.state_from_json(None) == {}
