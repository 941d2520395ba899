"""Reconcile passes against an in-memory fake of the Kubernetes API and fake controller/brokers.

Not kmock and not a real API server: FakeKube below implements the operator's KubeGateway
interface with a few lines of StatefulSet behaviour (revisions, OnDelete restarts).
"""

from __future__ import annotations

import copy
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from ferrymq.operator import decisions, models, reconcile, render
from ferrymq.operator.http import ApiError

NS = "mq"


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.broker_groups: list[dict[str, Any]] = []
        self.applied: list[str] = []

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = (obj["kind"], obj["metadata"]["name"])
        self.applied.append(obj["kind"])
        old = self.objects.get(key)
        new = copy.deepcopy(obj)
        if obj["kind"] == "StatefulSet":
            revision = hashlib.sha1(json.dumps(obj["spec"]["template"], sort_keys=True).encode()).hexdigest()[:8]
            gen = (old or {}).get("metadata", {}).get("generation", 0)
            if old is None or old["spec"] != obj["spec"]:
                gen += 1
            new["metadata"]["generation"] = gen
            new["status"] = {"observedGeneration": gen, "updateRevision": f"bg-{revision}"}
            for i in range(obj["spec"]["replicas"]):
                self.pods.setdefault(f"bg-{i}", self._pod(f"bg-{i}", new["status"]["updateRevision"]))
            for name in [n for n in self.pods if decisions.pod_ordinal(n) >= obj["spec"]["replicas"]]:
                del self.pods[name]
        self.objects[key] = new
        return copy.deepcopy(new)

    @staticmethod
    def _pod(name: str, revision: str, ready: bool = True) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {render.REVISION_LABEL: revision}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        }

    async def get_stateful_set(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get(("StatefulSet", name)))

    async def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for p in self.pods.values()]

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        self.pods[name]["metadata"]["labels"].update(labels)

    async def delete_pod(self, namespace: str, name: str) -> None:
        # OnDelete: the StatefulSet controller recreates the pod from the current template.
        self.deleted.append(name)
        revision = self.objects[("StatefulSet", "bg")]["status"]["updateRevision"]
        self.pods[name] = self._pod(name, revision)

    async def list_broker_groups(self, namespace: str) -> list[dict[str, Any]]:
        return self.broker_groups


class FakeController:
    """The controller's group view; restarted pods rejoin the SyncStateSet two passes later."""

    def __init__(self, names: list[str], master: str) -> None:
        self.names = names
        self.master = master
        self.epoch = 1
        self.sss = set(names)
        self.rejoining: dict[str, int] = {}
        self.elections: list[int] = []
        self.min_sss_seen = len(names)

    def restart(self, name: str) -> None:
        self.sss.discard(name)
        self.rejoining[name] = 2
        self.min_sss_seen = min(self.min_sss_seen, len(self.sss))

    def tick(self) -> None:
        for name in list(self.rejoining):
            self.rejoining[name] -= 1
            if self.rejoining[name] == 0:
                self.sss.add(name)
                del self.rejoining[name]

    async def group(self, group: str) -> dict[str, Any]:
        ids = {n: i + 1 for i, n in enumerate(self.names)}
        return {
            "group": group,
            "master": {"brokerId": ids[self.master], "name": self.master},
            "masterEpoch": self.epoch,
            "syncStateSet": [ids[n] for n in sorted(self.sss)],
            "syncStateSetEpoch": 1,
            "replicas": [{"brokerId": ids[n], "name": n, "alive": True} for n in self.names],
        }

    async def elect(self, group: str, broker_id: int) -> dict[str, Any]:
        self.elections.append(broker_id)
        self.master = self.names[broker_id - 1]
        self.epoch += 1
        return await self.group(group)


async def run_pass(kube: FakeKube, ctl: FakeController, spec: models.BrokerGroupSpec) -> reconcile.PassResult:
    return await reconcile.reconcile_broker_group(
        name="bg",
        namespace=NS,
        uid="u1",
        generation=1,
        spec=spec,
        kube=kube,
        controller=ctl,  # type: ignore[arg-type]
        default_controller_url="http://ctl:9876",
    )


async def test_first_pass_creates_children_and_labels_master() -> None:
    kube, ctl = FakeKube(), FakeController(["bg-0", "bg-1", "bg-2"], master="bg-0")
    result = await run_pass(kube, ctl, models.BrokerGroupSpec(replicas=3))
    assert kube.applied == ["ConfigMap", "Service", "Service", "PodDisruptionBudget", "StatefulSet"]
    assert isinstance(result.step, decisions.Done)
    roles = {n: p["metadata"]["labels"]["ferrymq.io/role"] for n, p in kube.pods.items()}
    assert roles == {"bg-0": "master", "bg-1": "slave", "bg-2": "slave"}
    assert result.status["master"] == "bg-0" and result.status["readyReplicas"] == 3


async def test_rolling_update_slaves_first_then_handover_then_old_master() -> None:
    names = ["bg-0", "bg-1", "bg-2"]
    kube, ctl = FakeKube(), FakeController(names, master="bg-0")
    spec = models.BrokerGroupSpec(
        replicas=3, image="ferrymq:1", replication={"inSyncReplicas": 2, "minInSyncReplicas": 2}
    )
    await run_pass(kube, ctl, spec)
    real_delete = kube.delete_pod

    async def delete_and_notify(namespace: str, name: str) -> None:
        assert ctl.master != name, "the master must never be restarted"
        ctl.restart(name)
        await real_delete(namespace, name)

    kube.delete_pod = delete_and_notify  # type: ignore[method-assign]
    spec2 = spec.model_copy(update={"image": "ferrymq:2"})
    actions: list[Any] = []
    for _ in range(20):
        result = await run_pass(kube, ctl, spec2)
        actions.append(result.step)
        ctl.tick()
        if isinstance(result.step, decisions.Done):
            break
    assert isinstance(actions[-1], decisions.Done)
    assert kube.deleted == ["bg-2", "bg-1", "bg-0"]
    assert ctl.elections == [2]  # bg-1 (brokerId 2) took over before bg-0 restarted
    assert ctl.min_sss_seen >= 2
    assert any(isinstance(a, decisions.Wait) and "SyncStateSet" in a.reason for a in actions)
    assert result.status["phase"] == "Running" and result.status["master"] == "bg-1"


async def test_scale_down_hands_over_from_highest_ordinal_master() -> None:
    names = ["bg-0", "bg-1", "bg-2"]
    kube, ctl = FakeKube(), FakeController(names, master="bg-2")
    await run_pass(kube, ctl, models.BrokerGroupSpec(replicas=3))
    result = await run_pass(kube, ctl, models.BrokerGroupSpec(replicas=2))
    assert isinstance(result.step, decisions.Handover) and ctl.master == "bg-0"
    assert kube.objects[("StatefulSet", "bg")]["spec"]["replicas"] == 3
    await run_pass(kube, ctl, models.BrokerGroupSpec(replicas=2))
    assert kube.objects[("StatefulSet", "bg")]["spec"]["replicas"] == 2


async def test_controller_unreachable_reports_and_does_not_roll() -> None:
    kube = FakeKube()

    class Down:
        async def group(self, group: str) -> dict[str, Any]:
            raise ApiError(0, "UNREACHABLE", "connection refused")

    result = await reconcile.reconcile_broker_group(
        name="bg",
        namespace=NS,
        uid="u",
        generation=2,
        spec=models.BrokerGroupSpec(replicas=3),
        kube=kube,
        controller=Down(),
        default_controller_url="http://ctl:9876",
    )  # type: ignore[arg-type]
    assert not result.converged and kube.deleted == []
    avail = next(c for c in result.status["conditions"] if c["type"] == "Available")
    assert avail["reason"] == "ControllerUnreachable"


async def test_storage_change_keeps_claim_templates_and_warns() -> None:
    kube, ctl = FakeKube(), FakeController(["bg-0"], master="bg-0")
    await run_pass(kube, ctl, models.BrokerGroupSpec(replicas=1, replication={"inSyncReplicas": 1}))
    result = await run_pass(
        kube, ctl, models.BrokerGroupSpec(replicas=1, storage={"size": "99Gi"}, replication={"inSyncReplicas": 1})
    )
    claims = kube.objects[("StatefulSet", "bg")]["spec"]["volumeClaimTemplates"]
    assert claims[0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert any(reason == "StorageImmutable" for _, reason, _ in result.events)


# --------------------------------------------------------------------------- topics


class FakeAdmin:
    def __init__(self) -> None:
        self.topics: dict[str, dict[str, Any]] = {}
        self.offsets: dict[str, dict[int, int]] = {}
        self.puts: list[dict[str, Any]] = []
        self.reject: ApiError | None = None

    async def get_topic(self, topic: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.topics.get(topic))

    async def put_topic(self, topic: str, config: dict[str, Any]) -> dict[str, Any]:
        if self.reject:
            raise self.reject
        self.puts.append(config)
        queues = [{"queueId": q, "minOffset": 0, "maxOffset": 5} for q in range(config["readQueueNums"])]
        self.topics[topic] = {**config, "queues": queues}
        return self.topics[topic]

    async def consumer_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        return self.offsets


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


async def topic_pass(
    kube: FakeKube, admin: FakeAdmin, spec: models.TopicSpec, status: dict[str, Any] | None, clock: Clock
) -> reconcile.PassResult:
    ctl = FakeController(["bg-0"], master="bg-0")
    return await reconcile.reconcile_topic(
        name="orders",
        namespace=NS,
        generation=3,
        spec=spec,
        previous_status=status,
        kube=kube,
        controller=ctl,
        make_admin=lambda url: admin,
        now=clock,
    )  # type: ignore[arg-type,return-value]


async def test_topic_created_on_every_group_by_default() -> None:
    kube, clock = FakeKube(), Clock()
    admins: dict[str, FakeAdmin] = {}
    kube.broker_groups = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    result = await reconcile.reconcile_topic(
        name="orders",
        namespace=NS,
        generation=3,
        spec=models.TopicSpec(readQueueNums=4, writeQueueNums=4),
        previous_status=None,
        kube=kube,
        controller=FakeController(["bg-0"], master="bg-0"),  # type: ignore[arg-type]
        make_admin=lambda url: admins.setdefault(url, FakeAdmin()),
        now=clock,
    )  # type: ignore[arg-type,return-value]
    assert len(admins) == 2 and all(len(a.puts) == 1 for a in admins.values())
    assert result.converged and result.status["topicName"] == "orders"
    assert result.status["groups"]["a"] == {
        "readQueueNums": 4,
        "writeQueueNums": 4,
        "phase": "Ready",
        "message": "creating topic",
    }
    assert result.status["conditions"][0]["status"] == "True"


async def test_topic_only_on_selected_existing_groups() -> None:
    kube, admin, clock = FakeKube(), FakeAdmin(), Clock()
    kube.broker_groups = [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]
    result = await topic_pass(kube, admin, models.TopicSpec(brokerGroups=["b", "zzz"]), None, clock)
    assert list(result.status["groups"]) == ["b"]


async def test_topic_shrink_protocol_end_to_end() -> None:
    kube, admin, clock = FakeKube(), FakeAdmin(), Clock()
    kube.broker_groups = [{"metadata": {"name": "a"}}]
    status = (await topic_pass(kube, admin, models.TopicSpec(readQueueNums=8, writeQueueNums=8), None, clock)).status
    small = models.TopicSpec(readQueueNums=4, writeQueueNums=4)
    admin.offsets = {"g": {q: 0 for q in range(8)}}
    status = (await topic_pass(kube, admin, small, status, clock)).status
    assert admin.puts[-1] == {"readQueueNums": 8, "writeQueueNums": 4, "perm": "RW", "messageType": "NORMAL"}
    group = status["groups"]["a"]
    assert group["phase"] == "Shrinking" and group["writeShrunkAt"]
    clock.now += timedelta(minutes=5)
    result = await topic_pass(kube, admin, small, status, clock)
    group = result.status["groups"]["a"]
    assert group["drainingQueues"] == [4, 5, 6, 7] and group["remainingMessages"] == 20
    assert result.status["conditions"][0]["status"] == "False" and len(admin.puts) == 2
    admin.offsets = {"g": {q: 5 for q in range(8)}}
    result = await topic_pass(kube, admin, small, result.status, clock)
    assert admin.puts[-1]["readQueueNums"] == 4
    assert result.status["groups"]["a"]["phase"] == "Ready" and result.converged


async def test_rejected_topic_spec_reports_ready_false_with_reason() -> None:
    kube, admin, clock = FakeKube(), FakeAdmin(), Clock()
    kube.broker_groups = [{"metadata": {"name": "a"}}]
    admin.reject = ApiError(400, "MESSAGE_ILLEGAL", "queue count too large")
    result = await topic_pass(kube, admin, models.TopicSpec(), None, clock)
    cond = result.status["conditions"][0]
    assert (cond["status"], cond["reason"]) == ("False", "MESSAGE_ILLEGAL")
    assert result.status["groups"]["a"]["phase"] == "Error"
    assert any(reason == "TopicRejected" for _, reason, _ in result.events)
