"""Replica state and the rules that change it — RocketMQ 5 controller mode (RIP-44), without I/O.

Per broker group the controller keeps what RocketMQ's ReplicasInfoManager keeps in BrokerReplicaInfo and
SyncStateInfo: the replicas (brokerId -> name and addresses), the master, its masterEpoch, the SyncStateSet
and its syncStateSetEpoch. Every function here takes the current ``GroupState`` (immutable) plus the
liveness facts the heartbeats gave (``ReplicaStatus``) and returns a new ``GroupState`` or raises a
``ControllerError``; the service persists the result with a compare-and-swap. Keeping the rules pure makes
them testable exhaustively and lets a new controller leader re-run a decision its predecessor did not
finish persisting.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ferrymq.controller.errors import ControllerError, invalid

FIRST_BROKER_ID = 1  # controller-mode brokerIds start at 1 (0 was the master's id in master/slave mode)


@dataclass(frozen=True)
class Replica:
    broker_id: int
    name: str
    http_address: str
    tcp_address: str
    ha_address: str
    election_priority: int = 0  # smaller wins, as RocketMQ's brokerElectionPriority


@dataclass(frozen=True)
class Switch:
    """A graceful master switch (designateElect) in progress: ``from_id`` stops writes, ``to_id`` catches up."""

    from_id: int
    to_id: int
    started_ms: int
    deadline_ms: int


@dataclass(frozen=True)
class GroupState:
    group: str
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set: frozenset[int] = frozenset()
    sync_state_set_epoch: int = 0
    replicas: Mapping[int, Replica] = field(default_factory=dict)
    switching: Switch | None = None
    # topic -> {"readQueueNums", "writeQueueNums", "perm"}: what the master reported last (routes)
    topics: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def id_of(self, name: str) -> int | None:
        return next((r.broker_id for r in self.replicas.values() if r.name == name), None)


@dataclass(frozen=True)
class ReplicaStatus:
    """What the heartbeats say about one replica (RocketMQ's BrokerLiveInfo)."""

    alive: bool
    epoch: int = -1
    max_offset: int = -1
    confirm_offset: int = -1
    election_priority: int | None = None
    writable: bool | None = None  # None: not reported since the controller last asked


Statuses = Mapping[int, ReplicaStatus]


def is_alive(statuses: Statuses, broker_id: int | None) -> bool:
    return broker_id is not None and broker_id in statuses and statuses[broker_id].alive


# ---- registration -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Registration:
    state: GroupState
    broker_id: int


def register(state: GroupState | None, group: str, name: str, *, http_address: str, tcp_address: str,
             ha_address: str, broker_id: int | None, election_priority: int = 0) -> Registration:
    """Give ``name`` its brokerId in ``group`` and record its addresses.

    A name always maps to the same id. A broker that restarts with an id in its .broker.meta keeps it; if
    the controller has never heard of that id (its state was lost) the id is adopted when free. The first
    replica of a new group becomes master at once, as RocketMQ's first registration elects.
    """
    if not name:
        raise invalid("name is required")
    if broker_id is not None and broker_id < FIRST_BROKER_ID:
        raise invalid(f"brokerId must be >= {FIRST_BROKER_ID}, got {broker_id}")
    state = state or GroupState(group=group)
    known = state.id_of(name)
    if known is not None:
        assigned = known
    elif broker_id is not None:
        holder = state.replicas.get(broker_id)
        if holder is not None:
            raise ControllerError("BROKER_ID_CONFLICT",
                                  f"brokerId {broker_id} of group {group!r} belongs to {holder.name!r}, "
                                  f"not {name!r}")
        assigned = broker_id
    else:
        assigned = next_free_id(state.replicas)
    replica = Replica(assigned, name, http_address, tcp_address, ha_address, election_priority)
    replicas = {**state.replicas, assigned: replica}
    new = replace(state, replicas=replicas)
    if state.master_id is None and not state.replicas:
        new = replace(new, master_id=assigned, master_epoch=state.master_epoch + 1,
                      sync_state_set=frozenset({assigned}), sync_state_set_epoch=state.sync_state_set_epoch + 1)
    return Registration(new, assigned)


def next_free_id(replicas: Iterable[int]) -> int:
    taken = set(replicas)
    candidate = FIRST_BROKER_ID
    while candidate in taken:
        candidate += 1
    return candidate


# ---- SyncStateSet ---------------------------------------------------------------------------------------
def alter_sync_state_set(state: GroupState, *, master_id: int, master_epoch: int, sync_state_set_epoch: int,
                         new_set: Iterable[int], statuses: Statuses) -> GroupState:
    """The master's request to shrink or expand its SyncStateSet, fenced by both epochs.

    Only the current master at the current masterEpoch may alter the set (a deposed master is fenced off),
    and only against the set it last saw (syncStateSetEpoch). Replicas being added must be registered and
    alive; dropping dead ones is what shrinking is for. An unchanged set changes nothing (no new epoch).
    """
    if state.master_id is None or master_id != state.master_id or master_epoch != state.master_epoch:
        raise ControllerError("FENCED_MASTER_EPOCH",
                              f"group {state.group!r}: master is {state.master_id} at masterEpoch "
                              f"{state.master_epoch}; the request came from {master_id} at {master_epoch}",
                              masterId=state.master_id, masterEpoch=state.master_epoch)
    if sync_state_set_epoch != state.sync_state_set_epoch:
        raise ControllerError("FENCED_SYNC_STATE_SET_EPOCH",
                              f"group {state.group!r}: syncStateSetEpoch is {state.sync_state_set_epoch}, "
                              f"the request was based on {sync_state_set_epoch}",
                              syncStateSetEpoch=state.sync_state_set_epoch)
    wanted = frozenset(new_set)
    if state.master_id not in wanted:
        raise invalid(f"the SyncStateSet must contain the master {state.master_id}")
    for added in sorted(wanted - state.sync_state_set):
        if added not in state.replicas:
            raise invalid(f"broker {added} is not a registered replica of group {state.group!r}")
        if not is_alive(statuses, added):
            raise invalid(f"broker {added} of group {state.group!r} is not alive; it cannot join the SyncStateSet")
    if wanted == state.sync_state_set:
        return state
    return replace(state, sync_state_set=wanted, sync_state_set_epoch=state.sync_state_set_epoch + 1)


# ---- election -------------------------------------------------------------------------------------------
def candidates(state: GroupState, statuses: Statuses, *, unclean: bool) -> list[int]:
    """Electable replicas, best first (DefaultElectPolicy).

    Alive members of the SyncStateSet — or, with enableElectUncleanMaster, every alive replica — other than
    the master being replaced; ordered by epoch (newest data lineage) desc, max offset desc, election
    priority asc, then brokerId so the choice is deterministic.
    """
    pool = state.replicas.keys() if unclean else state.sync_state_set
    ids = [b for b in pool if b != state.master_id and b in state.replicas and is_alive(statuses, b)]

    def key(b: int) -> tuple[int, int, int, int]:
        st = statuses[b]
        prio = st.election_priority if st.election_priority is not None else state.replicas[b].election_priority
        return (-st.epoch, -st.max_offset, prio, b)

    return sorted(ids, key=key)


def electable(state: GroupState, statuses: Statuses, *, unclean: bool) -> bool:
    """Whether the group has, or could get right now, a master."""
    return is_alive(statuses, state.master_id) or bool(candidates(state, statuses, unclean=unclean))


def promote(state: GroupState, winner: int) -> GroupState:
    """``winner`` becomes master; both epochs move on and the SyncStateSet restarts as just the winner."""
    return replace(state, master_id=winner, master_epoch=state.master_epoch + 1,
                   sync_state_set=frozenset({winner}), sync_state_set_epoch=state.sync_state_set_epoch + 1,
                   switching=None)


def elect(state: GroupState, statuses: Statuses, *, unclean: bool) -> GroupState:
    """Elect a master unless the current one is alive.

    With no candidate the group is left without a master: masterEpoch still moves on (as RocketMQ's
    ElectMasterEvent does when no master is elected) so a deposed master that is only partitioned is fenced,
    and the SyncStateSet is kept so that a returning in-sync replica can be elected later.
    """
    if is_alive(statuses, state.master_id):
        return state
    ranked = candidates(state, statuses, unclean=unclean)
    if ranked:
        return promote(state, ranked[0])
    if state.master_id is None:
        return state
    return replace(state, master_id=None, master_epoch=state.master_epoch + 1, switching=None)


# ---- graceful switch (designateElect) -------------------------------------------------------------------
def designate(state: GroupState, target: int, statuses: Statuses, *, now_ms: int, timeout_ms: int) -> GroupState:
    """Start a graceful switch to ``target``; a group without master gets ``target`` at once."""
    if target not in state.replicas:
        raise ControllerError("NOT_IN_SYNC_STATE_SET", f"broker {target} is not a replica of group {state.group!r}")
    if target not in state.sync_state_set or not is_alive(statuses, target):
        raise ControllerError("NOT_IN_SYNC_STATE_SET",
                              f"broker {target} of group {state.group!r} must be alive and in the SyncStateSet "
                              f"{sorted(state.sync_state_set)} to become master")
    if state.master_id == target:
        return state
    if state.switching is not None:
        if state.switching.to_id == target:
            return state
        raise ControllerError("SWITCH_IN_PROGRESS",
                              f"group {state.group!r} is already switching from {state.switching.from_id} "
                              f"to {state.switching.to_id}")
    if state.master_id is None or not is_alive(statuses, state.master_id):
        return promote(state, target)
    return replace(state, switching=Switch(state.master_id, target, now_ms, now_ms + timeout_ms))


def progress_switch(state: GroupState, statuses: Statuses, *, now_ms: int) -> GroupState:
    """Finish or abandon a graceful switch.

    It completes once the old master has said it stopped taking writes (``writable`` false in a heartbeat
    since the switch began) and the target has caught up with the old master's last offset; it is abandoned
    when the deadline passes, the target dies or leaves the SyncStateSet, or the master changed meanwhile.
    """
    sw = state.switching
    if sw is None:
        return state
    if (state.master_id != sw.from_id or now_ms >= sw.deadline_ms or sw.to_id not in state.sync_state_set
            or not is_alive(statuses, sw.to_id)):
        return replace(state, switching=None)
    old = statuses.get(sw.from_id)
    new = statuses[sw.to_id]
    if old is not None and old.writable is False and new.max_offset >= old.max_offset >= 0:
        return promote(state, sw.to_id)
    return state


# ---- persistence format ---------------------------------------------------------------------------------
def group_to_json(state: GroupState) -> dict[str, Any]:
    return {
        "group": state.group,
        "masterId": state.master_id,
        "masterEpoch": state.master_epoch,
        "syncStateSet": sorted(state.sync_state_set),
        "syncStateSetEpoch": state.sync_state_set_epoch,
        "replicas": [{"brokerId": r.broker_id, "name": r.name, "httpAddress": r.http_address,
                      "tcpAddress": r.tcp_address, "haAddress": r.ha_address,
                      "electionPriority": r.election_priority}
                     for _, r in sorted(state.replicas.items())],
        "switching": None if state.switching is None else {
            "from": state.switching.from_id, "to": state.switching.to_id,
            "startedMs": state.switching.started_ms, "deadlineMs": state.switching.deadline_ms},
        "topics": {t: dict(cfg) for t, cfg in sorted(state.topics.items())},
    }


def group_from_json(raw: Mapping[str, Any]) -> GroupState:
    sw = raw.get("switching")
    return GroupState(
        group=raw["group"],
        master_id=raw.get("masterId"),
        master_epoch=int(raw.get("masterEpoch", 0)),
        sync_state_set=frozenset(int(b) for b in raw.get("syncStateSet", [])),
        sync_state_set_epoch=int(raw.get("syncStateSetEpoch", 0)),
        replicas={int(r["brokerId"]): Replica(int(r["brokerId"]), r["name"], r["httpAddress"], r["tcpAddress"],
                                              r["haAddress"], int(r.get("electionPriority", 0)))
                  for r in raw.get("replicas", [])},
        switching=None if not sw else Switch(int(sw["from"]), int(sw["to"]), int(sw["startedMs"]),
                                             int(sw["deadlineMs"])),
        topics={t: dict(cfg) for t, cfg in (raw.get("topics") or {}).items()},
    )


def state_to_json(groups: Mapping[str, GroupState]) -> dict[str, Any]:
    return {"formatVersion": 1, "groups": [group_to_json(g) for _, g in sorted(groups.items())]}


def state_from_json(raw: Mapping[str, Any] | None) -> dict[str, GroupState]:
    if not raw:
        return {}
    return {g["group"]: group_from_json(g) for g in raw.get("groups", [])}
