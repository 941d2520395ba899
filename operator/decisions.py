"""Pure reconciliation decisions: what the operator does next, from what it observed.

Nothing here performs I/O. Each reconcile pass observes the cluster and the controller,
asks these functions for ONE next step, performs it, and observes again; so the state of
a rolling update or a queue shrink lives in the cluster, and an operator restart resumes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

# --------------------------------------------------------------------------- observations


@dataclass(frozen=True)
class PodView:
    name: str
    revision: str | None
    ready: bool
    terminating: bool = False

    @property
    def ordinal(self) -> int:
        return pod_ordinal(self.name)


@dataclass(frozen=True)
class ReplicaView:
    broker_id: int
    name: str
    alive: bool
    role: str | None = None


@dataclass(frozen=True)
class GroupView:
    """The controller's view of a broker group (GET /v1/groups/{group})."""

    master: str | None
    master_epoch: int
    sync_state_set: frozenset[str]
    sync_state_set_epoch: int
    replicas: tuple[ReplicaView, ...] = ()

    def broker_id(self, name: str) -> int | None:
        return next((r.broker_id for r in self.replicas if r.name == name), None)

    def alive(self, name: str) -> bool:
        return any(r.name == name and r.alive for r in self.replicas)


def pod_ordinal(name: str) -> int:
    match = re.search(r"-(\d+)$", name)
    return int(match.group(1)) if match else -1


def parse_group(body: Mapping[str, Any]) -> GroupView:
    """Controller JSON -> GroupView; the SyncStateSet is given as brokerIds and mapped to pod names."""
    replicas = tuple(
        ReplicaView(
            broker_id=int(r["brokerId"]),
            name=str(r.get("name") or ""),
            alive=bool(r.get("alive", True)),
            role=r.get("role"),
        )
        for r in body.get("replicas") or []
    )
    by_id = {r.broker_id: r.name for r in replicas}
    master = body.get("master") or None
    master_name = None
    if master:
        master_name = master.get("name") or by_id.get(int(master.get("brokerId", -1)))
    sss = frozenset(by_id.get(int(i), str(i)) for i in body.get("syncStateSet") or [])
    return GroupView(
        master=master_name,
        master_epoch=int(body.get("masterEpoch") or 0),
        sync_state_set=sss,
        sync_state_set_epoch=int(body.get("syncStateSetEpoch") or 0),
        replicas=replicas,
    )


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class DeletePod:
    name: str
    reason: str


@dataclass(frozen=True)
class Handover:
    """Graceful master switch through the controller (designateElect)."""

    to_name: str
    to_broker_id: int
    reason: str


@dataclass(frozen=True)
class Done:
    reason: str = "up to date"


Action = Wait | DeletePod | Handover | Done


# --------------------------------------------------------------------------- rolling update


def _handover_target(
    pods: Iterable[PodView],
    group: GroupView,
    update_revision: str | None,
    exclude_ordinals_from: int | None = None,
) -> PodView | None:
    """The best slave to become master: in the SyncStateSet, ready, alive, preferably updated."""
    candidates = [
        p
        for p in pods
        if p.name != group.master
        and p.ready
        and not p.terminating
        and p.name in group.sync_state_set
        and group.broker_id(p.name) is not None
        and (exclude_ordinals_from is None or p.ordinal < exclude_ordinals_from)
    ]
    if not candidates:
        return None
    candidates.sort(key=lambda p: (p.revision != update_revision, p.ordinal))
    return candidates[0]


def _is_dead_weight(pod: PodView, group: GroupView) -> bool:
    """A pod that serves nothing, so restarting it cannot reduce the group's safety."""
    if pod.ready:
        return False
    return pod.name not in group.sync_state_set or group.master is None or not group.alive(pod.name)


def next_roll_step(
    pods: list[PodView],
    update_revision: str | None,
    group: GroupView | None,
    replicas: int,
    min_in_sync_replicas: int,
) -> Action:
    """One step of the rolling update, slaves first, master last after a graceful handover.

    Like Strimzi's KafkaRoller, a pod whose restart would leave the SyncStateSet below
    minInSyncReplicas is never restarted: the roll waits instead.
    """
    if update_revision is None:
        return Wait("StatefulSet has no update revision yet")
    members = [p for p in pods if 0 <= p.ordinal < replicas]
    outdated = [p for p in members if p.revision != update_revision]
    if not outdated:
        return Done()
    if group is None:
        return Wait("controller state unknown; not restarting anything blind")
    if any(p.terminating for p in members):
        return Wait("a pod is terminating")
    # A broken outdated pod (say, a bad image) is restarted first: it serves nothing anyway.
    for pod in sorted(outdated, key=lambda p: -p.ordinal):
        if _is_dead_weight(pod, group) and pod.name != group.master:
            return DeletePod(pod.name, "outdated and not serving")
    if len(members) < replicas:
        return Wait(f"{replicas - len(members)} pod(s) not created yet")
    not_ready = sorted(p.name for p in members if not p.ready)
    if not_ready:
        return Wait(f"pod(s) not ready: {', '.join(not_ready)}")
    if group.master is None:
        return Wait("group has no master")
    if replicas > 1:
        lagging = sorted(p.name for p in members if p.name not in group.sync_state_set)
        if lagging:
            return Wait(f"waiting for {', '.join(lagging)} to rejoin the SyncStateSet")
    slaves = sorted((p for p in outdated if p.name != group.master), key=lambda p: -p.ordinal)
    if slaves:
        pod = slaves[0]
        if pod.name in group.sync_state_set and len(group.sync_state_set) - 1 < min_in_sync_replicas:
            return Wait(
                f"restarting {pod.name} would drop the SyncStateSet below minInSyncReplicas={min_in_sync_replicas}"
            )
        return DeletePod(pod.name, "rolling slave")
    # Only the master is outdated.
    if replicas == 1:
        return DeletePod(group.master, "single replica: restart in place (unavailable meanwhile)")
    target = _handover_target(members, group, update_revision)
    if target is None:
        return Wait("no in-sync slave to hand mastership to")
    return Handover(target.name, group.broker_id(target.name) or 0, f"hand over before restarting {group.master}")


# --------------------------------------------------------------------------- scaling


@dataclass(frozen=True)
class ScalePlan:
    replicas: int
    action: Action | None = None


def plan_replicas(
    current: int, desired: int, pods: list[PodView], group: GroupView | None, min_in_sync_replicas: int
) -> ScalePlan:
    """StatefulSet replicas to apply now. Growing is immediate; shrinking removes one non-master at a time."""
    if desired >= current:
        return ScalePlan(desired)
    if group is None:
        return ScalePlan(current, Wait("controller state unknown; not scaling down"))
    victim = f"{_statefulset_prefix(pods, group)}-{current - 1}"
    if group.master == victim:
        target = _handover_target(pods, group, None, exclude_ordinals_from=desired)
        if target is None:
            return ScalePlan(
                current,
                Wait(f"master {victim} must hand over first, but no in-sync replica below ordinal {desired}"),
            )
        return ScalePlan(
            current, Handover(target.name, group.broker_id(target.name) or 0, f"{victim} is being removed")
        )
    remaining = [n for n in group.sync_state_set if pod_ordinal(n) < current - 1]
    if len(remaining) < min_in_sync_replicas:
        return ScalePlan(
            current,
            Wait(f"removing {victim} would leave the SyncStateSet below minInSyncReplicas={min_in_sync_replicas}"),
        )
    return ScalePlan(current - 1)


def _statefulset_prefix(pods: list[PodView], group: GroupView) -> str:
    for name in [p.name for p in pods] + [r.name for r in group.replicas]:
        if pod_ordinal(name) >= 0:
            return name.rsplit("-", 1)[0]
    return ""


# --------------------------------------------------------------------------- role labels


def role_label_changes(
    pods: list[PodView], current_labels: Mapping[str, str | None], group: GroupView | None
) -> dict[str, str]:
    """Pod name -> the ferrymq.io/role value it must carry so `<name>-master` selects the master only."""
    if group is None:
        return {}
    changes = {}
    for pod in pods:
        want = "master" if pod.name == group.master and not pod.terminating else "slave"
        if current_labels.get(pod.name) != want:
            changes[pod.name] = want
    return changes


# --------------------------------------------------------------------------- conditions and status


def condition(
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
    previous: Iterable[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Kubernetes condition; lastTransitionTime moves only when the status flips."""
    text = "Unknown" if status is None else ("True" if status else "False")
    since = now.isoformat().replace("+00:00", "Z")
    for old in previous or []:
        if old.get("type") == type_ and old.get("status") == text and old.get("lastTransitionTime"):
            since = old["lastTransitionTime"]
    out: dict[str, Any] = {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def broker_group_status(
    *,
    replicas: int,
    pods: list[PodView],
    update_revision: str | None,
    group: GroupView | None,
    step: Action,
    generation: int | None,
    now: datetime,
    previous_conditions: list[dict[str, Any]] | None = None,
    controller_error: str | None = None,
) -> dict[str, Any]:
    ready = sum(1 for p in pods if p.ready and not p.terminating)
    updated = sum(1 for p in pods if update_revision is not None and p.revision == update_revision)
    rolling = step if isinstance(step, Wait | DeletePod | Handover) else None
    has_master = group is not None and group.master is not None
    sss = sorted(group.sync_state_set) if group else []
    available = has_master and ready >= 1
    if not pods and ready == 0:
        phase = "Pending"
    elif rolling is not None and updated < len(pods):
        phase = "Rolling"
    elif len(pods) != replicas:
        phase = "Scaling"
    elif available and ready == replicas:
        phase = "Running"
    else:
        phase = "Degraded"
    if controller_error:
        avail_reason, avail_msg = "ControllerUnreachable", controller_error
    elif has_master:
        avail_reason, avail_msg = "MasterElected", f"master {group.master} at epoch {group.master_epoch}"
    else:
        avail_reason, avail_msg = "NoMaster", "the controller reports no master"
    conditions = [
        condition(
            "Available",
            available if not controller_error else None,
            avail_reason,
            avail_msg,
            now,
            generation,
            previous_conditions,
        ),
        condition(
            "Ready",
            available and ready == replicas and rolling is None,
            "AllReplicasReady" if ready == replicas else "ReplicasNotReady",
            f"{ready}/{replicas} replicas ready",
            now,
            generation,
            previous_conditions,
        ),
        condition(
            "Progressing",
            rolling is not None,
            type(step).__name__,
            getattr(step, "reason", ""),
            now,
            generation,
            previous_conditions,
        ),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "replicas": len(pods),
        "readyReplicas": ready,
        "updatedReplicas": updated,
        "updateRevision": update_revision,
        "master": group.master if group else None,
        "masterEpoch": group.master_epoch if group else None,
        "syncStateSet": sss,
        "syncStateSetEpoch": group.sync_state_set_epoch if group else None,
        "rolling": rolling.reason if rolling is not None else None,
        "conditions": conditions,
        "observedGeneration": generation,
    }
    return status


# --------------------------------------------------------------------------- topics


@dataclass(frozen=True)
class QueueView:
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class TopicStep:
    """What to PUT on the broker now (None: nothing) and what to report for this group."""

    put: dict[str, Any] | None
    phase: str
    read_queue_nums: int
    write_queue_nums: int
    draining_queues: list[int] = field(default_factory=list)
    remaining_messages: int = 0
    write_shrunk_at: str | None = None
    message: str = ""


def undrained_queues(
    queue_ids: Iterable[int], queues: Mapping[int, QueueView], offsets: Mapping[str, Mapping[int, int]]
) -> dict[int, int]:
    """queueId -> messages some consumer group still has to consume there.

    A queue is drained when every consumer group committed past its last message
    (or retention already removed everything the group had left).
    """
    out: dict[int, int] = {}
    for qid in queue_ids:
        q = queues.get(qid)
        if q is None or q.max_offset <= q.min_offset:
            continue
        behind = 0
        for committed in offsets.values():
            done = max(committed.get(qid, 0), q.min_offset)
            behind = max(behind, q.max_offset - done)
        if behind > 0:
            out[qid] = behind
    return out


def plan_topic_step(
    *,
    current: Mapping[str, Any] | None,
    read: int,
    write: int,
    perm: str,
    queues: Mapping[int, QueueView],
    offsets: Mapping[str, Mapping[int, int]] | None,
    write_shrunk_at: str | None,
    now: datetime,
    grace_seconds: float,
    extra: Mapping[str, Any] | None = None,
) -> TopicStep:
    """Next step towards (read, write, perm) on one broker group.

    Growing is immediate. Shrinking lowers writeQueueNums first (producers stop using the
    doomed queues), then lowers readQueueNums only once every consumer group has consumed
    those queues and producers had ``grace_seconds`` to refresh their routes, so nothing
    written to a removed queue is stranded.
    """
    body = {"readQueueNums": read, "writeQueueNums": write, "perm": perm, **(extra or {})}
    if current is None:
        return TopicStep(
            put=body, phase="Creating", read_queue_nums=read, write_queue_nums=write, message="creating topic"
        )
    cur_read = int(current.get("readQueueNums", 0))
    cur_write = int(current.get("writeQueueNums", 0))
    cur_perm = str(current.get("perm", perm))
    stamp = now.isoformat().replace("+00:00", "Z")
    if read >= cur_read:
        if (cur_read, cur_write, cur_perm) == (read, write, perm):
            return TopicStep(put=None, phase="Ready", read_queue_nums=read, write_queue_nums=write)
        return TopicStep(
            put=body,
            phase="Updating",
            read_queue_nums=read,
            write_queue_nums=write,
            message=f"updating to read={read} write={write}",
        )
    # Shrinking reads: step 1, stop writes to the doomed queues while still reading all of them.
    if cur_write > write or cur_perm != perm:
        return TopicStep(
            put={**body, "readQueueNums": cur_read},
            phase="Shrinking",
            read_queue_nums=cur_read,
            write_queue_nums=write,
            write_shrunk_at=stamp,
            message=f"writeQueueNums lowered to {write}; draining queues {write}..{cur_read - 1}",
        )
    since = write_shrunk_at or stamp
    doomed = range(read, cur_read)
    lag = undrained_queues(doomed, queues, offsets or {})
    elapsed = (now - _parse_time(since)).total_seconds()
    if lag or offsets is None or elapsed < grace_seconds:
        waiting = "consumer groups to drain" if lag or offsets is None else "producers to refresh routes"
        return TopicStep(
            put=None,
            phase="Shrinking",
            read_queue_nums=cur_read,
            write_queue_nums=cur_write,
            draining_queues=sorted(lag) if lag else list(doomed),
            remaining_messages=sum(lag.values()),
            write_shrunk_at=since,
            message=f"waiting for {waiting} before readQueueNums {cur_read} -> {read}",
        )
    return TopicStep(
        put=body,
        phase="Updating",
        read_queue_nums=read,
        write_queue_nums=write,
        message=f"queues {read}..{cur_read - 1} drained; readQueueNums lowered to {read}",
    )


def _parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def topic_ready_condition(
    group_phases: Mapping[str, str],
    errors: Mapping[str, str],
    now: datetime,
    generation: int | None,
    previous: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    if errors:
        name, message = sorted(errors.items())[0]
        reason = message.split(":", 1)[0] if ":" in message else "Error"
        return condition("Ready", False, reason, f"{name}: {message}", now, generation, previous)
    if not group_phases:
        return condition("Ready", False, "NoBrokerGroups", "no BrokerGroup selected", now, generation, previous)
    pending = sorted(n for n, phase in group_phases.items() if phase != "Ready")
    if pending:
        return condition(
            "Ready", False, "Reconciling", f"in progress on {', '.join(pending)}", now, generation, previous
        )
    return condition(
        "Ready", True, "Applied", f"applied on {', '.join(sorted(group_phases))}", now, generation, previous
    )
