"""Pure reconciliation decisions: rolling order, handover, scaling, role labels, status, topic shrink."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ferrymq.operator import decisions as d

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def pods(*specs: str, revision: str = "new", **overrides: dict[str, object]) -> list[d.PodView]:
    """pods("bg-0:old", "bg-1", ...): name[:revision][:notready][:terminating]."""
    out = []
    for spec in specs:
        name, *flags = spec.split(":")
        rev = next((f for f in flags if f not in ("notready", "terminating")), revision)
        out.append(
            d.PodView(name=name, revision=rev, ready="notready" not in flags, terminating="terminating" in flags)
        )
    return out


def group(
    master: str | None,
    sss: set[str],
    names: tuple[str, ...] = ("bg-0", "bg-1", "bg-2"),
    dead: tuple[str, ...] = (),
    epoch: int = 3,
) -> d.GroupView:
    replicas = tuple(d.ReplicaView(broker_id=i + 1, name=n, alive=n not in dead) for i, n in enumerate(names))
    return d.GroupView(
        master=master, master_epoch=epoch, sync_state_set=frozenset(sss), sync_state_set_epoch=7, replicas=replicas
    )


ALL = {"bg-0", "bg-1", "bg-2"}


# --------------------------------------------------------------------------- parsing


def test_parse_group_maps_broker_ids_to_pod_names() -> None:
    body = {
        "group": "bg",
        "master": {"brokerId": 2, "name": "bg-1", "httpAddress": "x:8080"},
        "masterEpoch": 4,
        "syncStateSet": [2, 1],
        "syncStateSetEpoch": 9,
        "replicas": [
            {"brokerId": 1, "name": "bg-0", "alive": True, "role": "slave"},
            {"brokerId": 2, "name": "bg-1", "alive": True, "role": "master"},
        ],
        "electable": True,
    }
    g = d.parse_group(body)
    assert g.master == "bg-1" and g.master_epoch == 4 and g.sync_state_set_epoch == 9
    assert g.sync_state_set == {"bg-0", "bg-1"}
    assert g.broker_id("bg-0") == 1 and g.broker_id("nope") is None


def test_parse_group_without_master() -> None:
    g = d.parse_group({"group": "bg", "master": None, "masterEpoch": 0, "syncStateSet": []})
    assert g.master is None and g.sync_state_set == frozenset() and g.replicas == ()


def test_pod_ordinal() -> None:
    assert d.pod_ordinal("broker-a-12") == 12 and d.pod_ordinal("nodigits") == -1


# --------------------------------------------------------------------------- rolling order


def test_nothing_outdated_is_done() -> None:
    assert isinstance(d.next_roll_step(pods("bg-0", "bg-1", "bg-2"), "new", group("bg-0", ALL), 3, 2), d.Done)


def test_slaves_roll_first_highest_ordinal_first() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1:old", "bg-2:old"), "new", group("bg-0", ALL), 3, 2)
    assert step == d.DeletePod("bg-2", "rolling slave")


def test_master_is_never_deleted_while_slaves_are_outdated_even_at_highest_ordinal() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1:old", "bg-2:old"), "new", group("bg-2", ALL), 3, 2)
    assert step == d.DeletePod("bg-1", "rolling slave")


def test_waits_for_restarted_slave_to_rejoin_sync_state_set() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1:old", "bg-2"), "new", group("bg-0", {"bg-0", "bg-1"}), 3, 1)
    assert isinstance(step, d.Wait) and "bg-2" in step.reason and "SyncStateSet" in step.reason


def test_waits_for_restarted_pod_to_be_ready() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1:old", "bg-2:notready"), "new", group("bg-0", {"bg-0", "bg-1"}), 3, 1)
    assert isinstance(step, d.Wait) and "not ready" in step.reason


def test_waits_while_a_pod_terminates() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1:old", "bg-2:old:terminating"), "new", group("bg-0", ALL), 3, 1)
    assert isinstance(step, d.Wait) and "terminating" in step.reason


def test_refuses_to_drop_sync_state_set_below_min_in_sync() -> None:
    # minInSyncReplicas == SyncStateSet size: removing any in-sync slave breaks the guarantee.
    step = d.next_roll_step(
        pods("bg-0:old", "bg-1:old"), "new", group("bg-0", {"bg-0", "bg-1"}, names=("bg-0", "bg-1")), 2, 2
    )
    assert isinstance(step, d.Wait) and "minInSyncReplicas=2" in step.reason


def test_hands_over_when_only_the_master_is_outdated() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1", "bg-2"), "new", group("bg-0", ALL), 3, 2)
    assert step == d.Handover("bg-1", 2, "hand over before restarting bg-0")


def test_handover_target_must_be_in_sync_state_set() -> None:
    # bg-1 is ready but out of the SyncStateSet: the master is not handed over until every member is in sync.
    step = d.next_roll_step(pods("bg-0:old", "bg-1", "bg-2"), "new", group("bg-0", {"bg-0", "bg-2"}), 3, 1)
    assert isinstance(step, d.Wait)


def test_old_master_rolls_after_handover_as_a_slave() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1", "bg-2"), "new", group("bg-1", ALL), 3, 2)
    assert step == d.DeletePod("bg-0", "rolling slave")


def test_no_handover_target_waits() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1"), "new", group("bg-0", {"bg-0", "bg-1"}, names=("bg-0",)), 2, 1)
    assert isinstance(step, d.Wait) and "hand mastership" in step.reason


def test_single_replica_restarts_in_place() -> None:
    step = d.next_roll_step(pods("bg-0:old"), "new", group("bg-0", {"bg-0"}, names=("bg-0",)), 1, 1)
    assert isinstance(step, d.DeletePod) and step.name == "bg-0"


def test_unknown_controller_state_never_restarts_a_serving_pod() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1:old", "bg-2:old"), "new", None, 3, 1)
    assert isinstance(step, d.Wait) and "controller" in step.reason


def test_broken_outdated_pod_is_restarted_first() -> None:
    # A crash-looping slave out of the SyncStateSet serves nothing: restart it with the new template at once.
    step = d.next_roll_step(
        pods("bg-0:old", "bg-1:old:notready", "bg-2:old"), "new", group("bg-0", {"bg-0", "bg-2"}), 3, 2
    )
    assert step == d.DeletePod("bg-1", "outdated and not serving")


def test_whole_group_down_with_bad_image_is_recovered() -> None:
    step = d.next_roll_step(
        pods("bg-0:old:notready", "bg-1:old:notready"),
        "new",
        group(None, {"bg-0"}, names=("bg-0", "bg-1"), dead=("bg-0", "bg-1")),
        2,
        1,
    )
    assert isinstance(step, d.DeletePod)


def test_waits_for_the_statefulset_to_publish_a_revision() -> None:
    assert isinstance(d.next_roll_step(pods("bg-0:old"), None, group("bg-0", {"bg-0"}), 1, 1), d.Wait)


def test_waits_for_missing_pods() -> None:
    step = d.next_roll_step(pods("bg-0:old", "bg-1"), "new", group("bg-0", ALL), 3, 1)
    assert isinstance(step, d.Wait) and "not created" in step.reason


# --------------------------------------------------------------------------- scaling


def test_scale_up_is_immediate() -> None:
    assert d.plan_replicas(3, 5, pods("bg-0", "bg-1", "bg-2"), group("bg-0", ALL), 2) == d.ScalePlan(5)


def test_scale_down_one_at_a_time() -> None:
    names = ("bg-0", "bg-1", "bg-2", "bg-3")
    plan = d.plan_replicas(4, 2, pods(*names), group("bg-0", set(names), names=names), 1)
    assert plan == d.ScalePlan(3)


def test_scale_down_hands_over_first_when_master_is_highest_ordinal() -> None:
    plan = d.plan_replicas(3, 2, pods("bg-0", "bg-1", "bg-2"), group("bg-2", ALL), 1)
    assert plan.replicas == 3
    assert plan.action == d.Handover("bg-0", 1, "bg-2 is being removed")


def test_scale_down_handover_target_must_survive_the_scale_down() -> None:
    plan = d.plan_replicas(3, 1, pods("bg-0", "bg-1", "bg-2"), group("bg-2", {"bg-1", "bg-2"}), 1)
    assert plan.replicas == 3 and isinstance(plan.action, d.Wait)


def test_scale_down_respects_min_in_sync() -> None:
    plan = d.plan_replicas(3, 2, pods("bg-0", "bg-1", "bg-2"), group("bg-0", {"bg-0", "bg-2"}), 2)
    assert plan.replicas == 3 and isinstance(plan.action, d.Wait)


def test_scale_down_waits_for_controller() -> None:
    plan = d.plan_replicas(3, 2, pods("bg-0", "bg-1", "bg-2"), None, 1)
    assert plan.replicas == 3 and isinstance(plan.action, d.Wait)


# --------------------------------------------------------------------------- role labels


def test_role_labels_follow_the_controller() -> None:
    changes = d.role_label_changes(
        pods("bg-0", "bg-1", "bg-2"), {"bg-0": "master", "bg-1": "slave", "bg-2": None}, group("bg-1", ALL)
    )
    assert changes == {"bg-0": "slave", "bg-1": "master", "bg-2": "slave"}


def test_terminating_master_loses_master_label() -> None:
    changes = d.role_label_changes(pods("bg-0:new:terminating"), {"bg-0": "master"}, group("bg-0", ALL))
    assert changes == {"bg-0": "slave"}


def test_role_labels_untouched_without_controller() -> None:
    assert d.role_label_changes(pods("bg-0"), {"bg-0": "master"}, None) == {}


# --------------------------------------------------------------------------- status mapping


def test_status_mirrors_the_controller() -> None:
    status = d.broker_group_status(
        replicas=3,
        pods=pods("bg-0", "bg-1", "bg-2"),
        update_revision="new",
        group=group("bg-1", ALL, epoch=5),
        step=d.Done(),
        generation=4,
        now=NOW,
    )
    assert status["phase"] == "Running"
    assert status["readyReplicas"] == 3 and status["updatedReplicas"] == 3
    assert status["master"] == "bg-1" and status["masterEpoch"] == 5
    assert status["syncStateSet"] == ["bg-0", "bg-1", "bg-2"] and status["syncStateSetEpoch"] == 7
    assert status["observedGeneration"] == 4
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Ready"]["status"] == "True" and conds["Available"]["status"] == "True"
    assert conds["Progressing"]["status"] == "False"
    assert all(c["observedGeneration"] == 4 for c in conds.values())


def test_status_while_rolling() -> None:
    step = d.DeletePod("bg-2", "rolling slave")
    status = d.broker_group_status(
        replicas=3,
        pods=pods("bg-0:old", "bg-1:old", "bg-2"),
        update_revision="new",
        group=group("bg-0", ALL),
        step=step,
        generation=5,
        now=NOW,
    )
    assert status["phase"] == "Rolling" and status["rolling"] == "rolling slave"
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Progressing"]["status"] == "True" and conds["Ready"]["status"] == "False"


def test_status_without_controller() -> None:
    status = d.broker_group_status(
        replicas=3,
        pods=pods("bg-0", "bg-1", "bg-2"),
        update_revision="new",
        group=None,
        step=d.Wait("x"),
        generation=1,
        now=NOW,
        controller_error="UNREACHABLE: boom",
    )
    assert status["master"] is None and status["phase"] == "Degraded"
    avail = next(c for c in status["conditions"] if c["type"] == "Available")
    assert avail["status"] == "Unknown" and avail["reason"] == "ControllerUnreachable"


def test_status_pending_without_pods() -> None:
    status = d.broker_group_status(
        replicas=3, pods=[], update_revision=None, group=None, step=d.Wait("x"), generation=1, now=NOW
    )
    assert status["phase"] == "Pending" and status["readyReplicas"] == 0


def test_condition_transition_time_moves_only_on_flip() -> None:
    first = d.condition("Ready", True, "A", "m", NOW, 1)
    later = d.condition("Ready", True, "A", "m", NOW + timedelta(minutes=5), 2, [first])
    assert later["lastTransitionTime"] == first["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    flipped = d.condition("Ready", False, "B", "m", NOW + timedelta(minutes=5), 2, [first])
    assert flipped["lastTransitionTime"] == "2026-01-01T12:05:00Z"


# --------------------------------------------------------------------------- topic: grow and shrink


def queues(maxes: dict[int, int], mins: dict[int, int] | None = None) -> dict[int, d.QueueView]:
    return {q: d.QueueView(q, (mins or {}).get(q, 0), m) for q, m in maxes.items()}


def plan(
    current: dict | None,
    read: int,
    write: int,
    *,
    offsets: dict | None = None,
    maxes: dict | None = None,
    shrunk_at: str | None = None,
    now: datetime = NOW,
    perm: str = "RW",
) -> d.TopicStep:
    return d.plan_topic_step(
        current=current,
        read=read,
        write=write,
        perm=perm,
        queues=queues(maxes or {}),
        offsets={} if offsets is None else offsets,
        write_shrunk_at=shrunk_at,
        now=now,
        grace_seconds=30,
    )


def test_missing_topic_is_created() -> None:
    step = plan(None, 8, 8)
    assert step.put == {"readQueueNums": 8, "writeQueueNums": 8, "perm": "RW"} and step.phase == "Creating"


def test_unchanged_topic_needs_nothing() -> None:
    step = plan({"readQueueNums": 8, "writeQueueNums": 8, "perm": "RW"}, 8, 8)
    assert step.put is None and step.phase == "Ready"


def test_growing_is_immediate() -> None:
    step = plan({"readQueueNums": 4, "writeQueueNums": 4, "perm": "RW"}, 8, 8)
    assert step.put == {"readQueueNums": 8, "writeQueueNums": 8, "perm": "RW"}


def test_shrinking_writes_only_is_immediate() -> None:
    step = plan({"readQueueNums": 8, "writeQueueNums": 8, "perm": "RW"}, 8, 4)
    assert step.put == {"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW"}


def test_shrink_step_one_lowers_write_queue_nums_only() -> None:
    step = plan({"readQueueNums": 8, "writeQueueNums": 8, "perm": "RW"}, 4, 4)
    assert step.put == {"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW"}
    assert step.phase == "Shrinking" and step.write_shrunk_at == "2026-01-01T12:00:00Z"


def test_shrink_waits_while_a_consumer_group_lags() -> None:
    current = {"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW"}
    maxes = {q: 10 for q in range(8)}
    offsets = {"g1": {q: 10 for q in range(8)}, "g2": {4: 10, 5: 7, 6: 10, 7: 0}}
    step = plan(current, 4, 4, offsets=offsets, maxes=maxes, shrunk_at="2026-01-01T11:00:00Z")
    assert step.put is None and step.phase == "Shrinking"
    assert step.draining_queues == [5, 7] and step.remaining_messages == 13


def test_shrink_waits_for_route_refresh_grace_even_when_drained() -> None:
    current = {"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW"}
    step = plan(
        current,
        4,
        4,
        offsets={"g": {q: 10 for q in range(8)}},
        maxes={q: 10 for q in range(8)},
        shrunk_at="2026-01-01T11:59:50Z",
    )
    assert step.put is None and "refresh" in step.message


def test_shrink_lowers_read_queue_nums_once_drained() -> None:
    current = {"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW"}
    step = plan(
        current,
        4,
        4,
        offsets={"g": {q: 10 for q in range(8)}},
        maxes={q: 10 for q in range(8)},
        shrunk_at="2026-01-01T11:00:00Z",
    )
    assert step.put == {"readQueueNums": 4, "writeQueueNums": 4, "perm": "RW"}


def test_expired_messages_count_as_drained() -> None:
    current = {"readQueueNums": 2, "writeQueueNums": 1, "perm": "RW"}
    step = plan(current, 1, 1, offsets={"g": {1: 3}}, maxes={1: 10}, shrunk_at="2026-01-01T11:00:00Z")
    assert step.put is None
    assert d.undrained_queues([1], {1: d.QueueView(1, 10, 10)}, {"g": {1: 3}}) == {}


def test_unknown_offsets_never_shrink_reads() -> None:
    step = d.plan_topic_step(
        current={"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW"},
        read=4,
        write=4,
        perm="RW",
        queues={},
        offsets=None,
        write_shrunk_at="2026-01-01T11:00:00Z",
        now=NOW,
        grace_seconds=30,
    )
    assert step.put is None and step.phase == "Shrinking"


@pytest.mark.parametrize(
    ("phases", "errors", "status", "reason"),
    [
        ({"a": "Ready", "b": "Ready"}, {}, "True", "Applied"),
        ({"a": "Ready", "b": "Shrinking"}, {}, "False", "Reconciling"),
        ({"a": "Ready"}, {"b": "MESSAGE_ILLEGAL: bad"}, "False", "MESSAGE_ILLEGAL"),
        ({}, {}, "False", "NoBrokerGroups"),
    ],
)
def test_topic_ready_condition(phases: dict, errors: dict, status: str, reason: str) -> None:
    cond = d.topic_ready_condition(phases, errors, NOW, 3, None)
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == (status, reason, 3)
