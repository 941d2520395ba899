"""Reconcile passes: observe, ask :mod:`decisions` for one step, perform it, report status.

These functions know nothing about kopf; handlers.py wires them to events and timers.
Each pass is idempotent and derives all progress from the cluster, so it can be repeated,
interrupted, or resumed by another operator replica at any point.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ferrymq.operator import decisions, models, render
from ferrymq.operator.broker_admin import BrokerAdmin
from ferrymq.operator.controller_client import ControllerClient
from ferrymq.operator.http import ApiError
from ferrymq.operator.kube import KubeGateway

log = logging.getLogger(__name__)

# Producers refresh routes every 30 s in RocketMQ; wait that long after lowering writeQueueNums.
ROUTE_REFRESH_GRACE_SECONDS = 30.0


@dataclass
class PassResult:
    """What a pass did, for status, events and the caller's retry decision."""

    status: dict[str, Any]
    step: decisions.Action | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    converged: bool = True


def _now() -> datetime:
    return datetime.now(UTC)


def pod_views(pods: list[dict[str, Any]]) -> list[decisions.PodView]:
    views = []
    for pod in pods:
        meta = pod.get("metadata", {})
        conds = (pod.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)
        views.append(
            decisions.PodView(
                name=meta["name"],
                revision=(meta.get("labels") or {}).get(render.REVISION_LABEL),
                ready=ready,
                terminating=bool(meta.get("deletionTimestamp")),
            )
        )
    return sorted(views, key=lambda p: p.ordinal)


# --------------------------------------------------------------------------- BrokerGroup


async def reconcile_broker_group(
    *,
    name: str,
    namespace: str,
    uid: str,
    generation: int | None,
    spec: models.BrokerGroupSpec,
    kube: KubeGateway,
    controller: ControllerClient,
    default_controller_url: str,
    previous_conditions: list[dict[str, Any]] | None = None,
    now: Callable[[], datetime] = _now,
) -> PassResult:
    ref = render.BrokerGroupRef(name=name, namespace=namespace, uid=uid, controller_url=default_controller_url)
    events: list[tuple[str, str, str]] = []

    # Observe the controller first: scaling down depends on who is master.
    group: decisions.GroupView | None = None
    controller_error: str | None = None
    try:
        group = decisions.parse_group(await controller.group(name))
    except ApiError as exc:
        controller_error = str(exc)
    existing = await kube.get_stateful_set(namespace, name)
    pods = pod_views(await kube.list_pods(namespace, render.selector_labels(name)))

    current_replicas = int(((existing or {}).get("spec") or {}).get("replicas", spec.replicas))
    plan = decisions.plan_replicas(
        current_replicas if existing else spec.replicas,
        spec.replicas,
        pods,
        group,
        spec.replication.min_in_sync_replicas,
    )

    # Apply the children (idempotent). OnDelete means a template change restarts nothing by itself.
    for obj in render.children(ref, spec, replicas=plan.replicas):
        body = render.to_dict(obj)
        if body["kind"] == "StatefulSet" and existing is not None:
            _keep_immutable(body, existing, events)
        result = await kube.apply(body)
        if body["kind"] == "StatefulSet":
            existing = result

    # Role labels select the master Service's endpoint.
    raw_pods = await kube.list_pods(namespace, render.selector_labels(name))
    pods = pod_views(raw_pods)
    labels = {p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(render.ROLE_LABEL) for p in raw_pods}
    for pod_name, role in decisions.role_label_changes(pods, labels, group).items():
        await kube.label_pod(namespace, pod_name, {render.ROLE_LABEL: role})
        if role == "master":
            events.append(("Normal", "MasterLabelled", f"{pod_name} is master"))

    sts_status = (existing or {}).get("status") or {}
    sts_meta = (existing or {}).get("metadata") or {}
    update_revision = sts_status.get("updateRevision")
    if sts_status.get("observedGeneration", 0) < sts_meta.get("generation", 0):
        update_revision = None  # The StatefulSet controller has not seen the new template yet.

    step: decisions.Action
    if plan.action is not None:
        step = plan.action
    elif plan.replicas != spec.replicas or len(pods) > plan.replicas:
        step = decisions.Wait(f"scaling to {plan.replicas} of {spec.replicas}")
    else:
        step = decisions.next_roll_step(
            pods, update_revision, group, plan.replicas, spec.replication.min_in_sync_replicas
        )
    events.extend(await _perform(step, namespace, name, kube, controller))

    status = decisions.broker_group_status(
        replicas=spec.replicas,
        pods=pods,
        update_revision=update_revision,
        group=group,
        step=step,
        generation=generation,
        now=now(),
        previous_conditions=previous_conditions,
        controller_error=controller_error,
    )
    return PassResult(
        status=status, step=step, events=events, converged=isinstance(step, decisions.Done) and controller_error is None
    )


def _keep_immutable(body: dict[str, Any], existing: dict[str, Any], events: list[tuple[str, str, str]]) -> None:
    """A StatefulSet's claim templates, selector and service name cannot change; keep what exists."""
    old, new = existing.get("spec") or {}, body["spec"]
    for key in ("volumeClaimTemplates", "selector", "serviceName", "podManagementPolicy"):
        if key in old:
            if key == "volumeClaimTemplates" and _claim_sizes(old) != _claim_sizes(new):
                events.append(
                    (
                        "Warning",
                        "StorageImmutable",
                        "spec.storage changes do not apply to existing volumes; resize the PVCs instead",
                    )
                )
            new[key] = old[key]


def _claim_sizes(spec: dict[str, Any]) -> list[Any]:
    return [
        ((c.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
        for c in spec.get("volumeClaimTemplates") or []
    ]


async def _perform(
    step: decisions.Action, namespace: str, name: str, kube: KubeGateway, controller: ControllerClient
) -> list[tuple[str, str, str]]:
    if isinstance(step, decisions.DeletePod):
        await kube.delete_pod(namespace, step.name)
        return [("Normal", "RestartingPod", f"{step.name}: {step.reason}")]
    if isinstance(step, decisions.Handover):
        try:
            await controller.elect(name, step.to_broker_id)
        except ApiError as exc:
            return [("Warning", "HandoverFailed", f"to {step.to_name}: {exc}")]
        return [("Normal", "MasterHandover", f"mastership to {step.to_name}: {step.reason}")]
    return []


# --------------------------------------------------------------------------- Topic


def selected_groups(spec: models.TopicSpec, broker_groups: list[dict[str, Any]]) -> list[str]:
    existing = sorted(bg["metadata"]["name"] for bg in broker_groups)
    if spec.broker_groups is None:
        return existing
    return [g for g in spec.broker_groups if g in existing]


async def master_admin(
    controller: ControllerClient, group: str, namespace: str, make_admin: Callable[[str], BrokerAdmin]
) -> BrokerAdmin:
    """The group's master: the controller's address, else the `<group>-master` Service."""
    try:
        state = await controller.group(group)
        address = ((state or {}).get("master") or {}).get("httpAddress")
    except ApiError:
        address = None
    if not address:
        address = f"{render.master_service_name(group)}.{namespace}.svc:{render.HTTP_PORT}"
    return make_admin(address if address.startswith("http") else f"http://{address}")


async def reconcile_topic(
    *,
    name: str,
    namespace: str,
    generation: int | None,
    spec: models.TopicSpec,
    previous_status: dict[str, Any] | None,
    kube: KubeGateway,
    controller: ControllerClient,
    make_admin: Callable[[str], BrokerAdmin],
    now: Callable[[], datetime] = _now,
    grace_seconds: float = ROUTE_REFRESH_GRACE_SECONDS,
) -> PassResult:
    topic = spec.topic_name or name
    previous_status = previous_status or {}
    prev_groups = previous_status.get("groups") or {}
    groups = selected_groups(spec, await kube.list_broker_groups(namespace))
    statuses: dict[str, dict[str, Any]] = {}
    phases: dict[str, str] = {}
    errors: dict[str, str] = {}
    events: list[tuple[str, str, str]] = []
    retriable = False
    for group in groups:
        prev = prev_groups.get(group) or {}
        try:
            admin = await master_admin(controller, group, namespace, make_admin)
            current = await admin.get_topic(topic)
            shrinking = current is not None and spec.read_queue_nums < int(current.get("readQueueNums", 0))
            offsets = await admin.consumer_offsets(topic) if shrinking else {}
            step = decisions.plan_topic_step(
                current=current,
                read=spec.read_queue_nums,
                write=spec.write_queue_nums,
                perm=spec.perm,
                queues=_queues(current),
                offsets=offsets,
                write_shrunk_at=prev.get("writeShrunkAt"),
                now=now(),
                grace_seconds=grace_seconds,
                extra={"messageType": spec.message_type},
            )
            if step.put is not None:
                await admin.put_topic(topic, step.put)
                events.append(("Normal", "TopicApplied", f"{group}: {step.message}"))
            reached = (step.read_queue_nums, step.write_queue_nums) == (
                spec.read_queue_nums,
                spec.write_queue_nums,
            )
            phase = "Ready" if reached and step.phase != "Shrinking" else "Shrinking"
            statuses[group] = _group_status(step, phase)
            phases[group] = phase
        except ApiError as exc:
            retriable = retriable or exc.retriable
            errors[group] = f"{exc.code}: {exc.message}"
            statuses[group] = {**prev, "phase": "Error", "message": f"{exc.code}: {exc.message}"}
            events.append(("Warning", "TopicRejected" if not exc.retriable else "BrokerUnavailable", f"{group}: {exc}"))
    condition = decisions.topic_ready_condition(phases, errors, now(), generation, previous_status.get("conditions"))
    status = {
        "topicName": topic,
        "groups": statuses,
        "conditions": [condition],
        "observedGeneration": generation,
    }
    converged = not errors and bool(phases) and all(p == "Ready" for p in phases.values())
    return PassResult(status=status, events=events, converged=converged and not retriable)


def _queues(current: dict[str, Any] | None) -> dict[int, decisions.QueueView]:
    out = {}
    for q in (current or {}).get("queues") or []:
        qid = int(q["queueId"])
        out[qid] = decisions.QueueView(qid, int(q.get("minOffset", 0)), int(q.get("maxOffset", 0)))
    return out


def _group_status(step: decisions.TopicStep, phase: str) -> dict[str, Any]:
    status: dict[str, Any] = {
        "readQueueNums": step.read_queue_nums,
        "writeQueueNums": step.write_queue_nums,
        "phase": phase,
        "message": step.message,
    }
    if step.phase == "Shrinking":
        status.update(
            {
                "drainingQueues": step.draining_queues,
                "remainingMessages": step.remaining_messages,
                "writeShrunkAt": step.write_shrunk_at,
            }
        )
    return status


async def delete_topic(
    *,
    name: str,
    namespace: str,
    spec: models.TopicSpec,
    kube: KubeGateway,
    controller: ControllerClient,
    make_admin: Callable[[str], BrokerAdmin],
) -> list[str]:
    """Delete the topic from every selected group; returns the groups it was deleted from."""
    topic = spec.topic_name or name
    done = []
    for group in selected_groups(spec, await kube.list_broker_groups(namespace)):
        admin = await master_admin(controller, group, namespace, make_admin)
        await admin.delete_topic(topic)
        done.append(group)
    return done
