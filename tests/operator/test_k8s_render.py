"""Renderers: BrokerGroup spec -> kubernetes client models, checked by value and by Kubernetes' schemas."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from k8s_helpers import K8S_VERSION
from kubernetes import client as k8s

from ferrymq.operator import models, render

REF = render.BrokerGroupRef(name="broker-a", namespace="mq", uid="1234", controller_url="http://ctl.mq.svc:9876")


def spec(**kw: object) -> models.BrokerGroupSpec:
    return models.BrokerGroupSpec.model_validate(kw)


def test_children_are_kubernetes_models_that_validate() -> None:
    objs = render.children(REF, spec(resources={"limits": {"memory": "1Gi", "cpu": 2}}))
    kinds = [type(o) for o in objs]
    assert kinds == [k8s.V1ConfigMap, k8s.V1Service, k8s.V1Service, k8s.V1PodDisruptionBudget, k8s.V1StatefulSet]
    for obj in objs:
        kubernetes_validate.validate(render.to_dict(obj), K8S_VERSION, strict=True)


def test_children_are_owned_by_the_broker_group() -> None:
    for obj in render.children(REF, spec()):
        (owner,) = obj.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == ("BrokerGroup", "broker-a", "1234", True)
        assert obj.metadata.namespace == "mq"


def test_statefulset_identity_update_strategy_and_storage() -> None:
    sts = render.stateful_set(REF, spec(replicas=3, storage={"size": "5Gi", "storageClassName": "ssd"}))
    assert sts.spec.replicas == 3
    assert sts.spec.service_name == "broker-a-headless"
    assert sts.spec.update_strategy.type == "OnDelete"
    (claim,) = sts.spec.volume_claim_templates
    assert claim.metadata.name == "data"
    assert claim.spec.resources.requests == {"storage": "5Gi"}
    assert claim.spec.storage_class_name == "ssd"
    assert sts.spec.selector.match_labels == render.selector_labels("broker-a")
    assert render.selector_labels("broker-a").items() <= sts.spec.template.metadata.labels.items()


def test_replicas_override_for_gated_scale_down() -> None:
    assert render.stateful_set(REF, spec(replicas=3), replicas=4).spec.replicas == 4


def test_pod_template_probes_grace_and_anti_affinity() -> None:
    pod = render.stateful_set(REF, spec(terminationGracePeriodSeconds=120)).spec.template.spec
    assert pod.termination_grace_period_seconds == 120
    (c,) = pod.containers
    for probe in (c.readiness_probe, c.liveness_probe, c.startup_probe):
        assert probe.http_get.path == "/v1/health" and probe.http_get.port == "http"
    preferred = pod.affinity.pod_anti_affinity.preferred_during_scheduling_ignored_during_execution
    assert preferred[0].pod_affinity_term.topology_key == "kubernetes.io/hostname"
    assert pod.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution is None
    assert pod.security_context.run_as_non_root is True
    assert {p.name: p.container_port for p in c.ports} == {"http": 8080, "tcp": 10911, "ha": 10912}


def test_default_grace_period_is_long_enough_for_a_flush() -> None:
    assert render.stateful_set(REF, spec()).spec.template.spec.termination_grace_period_seconds >= 30


def test_broker_command_line_follows_the_contract() -> None:
    args = render.broker_args(
        REF,
        spec(flushDiskType="SYNC_FLUSH", replication={"mode": "ASYNC", "inSyncReplicas": 3, "minInSyncReplicas": 2}),
    )
    opts = dict(zip(args[1::2], args[2::2], strict=False))
    assert args[0] == "broker"
    assert opts["--group"] == "broker-a" and opts["--data-dir"] == "/data"
    assert (opts["--http-port"], opts["--tcp-port"], opts["--ha-port"]) == ("8080", "10911", "10912")
    assert opts["--controller"] == "http://ctl.mq.svc:9876"
    assert (opts["--flush"], opts["--replication"]) == ("sync", "async")
    assert (opts["--in-sync-replicas"], opts["--min-in-sync-replicas"]) == ("3", "2")
    assert opts["--config"] == "/etc/ferrymq/broker.yaml"


def test_spec_controller_url_overrides_operator_default() -> None:
    args = render.broker_args(REF, spec(controllerUrl="http://other:9876"))
    assert args[args.index("--controller") + 1] == "http://other:9876"


def test_advertise_host_is_the_pod_dns_name() -> None:
    env = {e.name: e for e in render.broker_container(REF, spec()).env}
    assert env["FERRYMQ_ADVERTISE_HOST"].value == "$(FERRYMQ_NAME).broker-a-headless.mq.svc"
    assert env["FERRYMQ_NAME"].value_from.field_ref.field_path == "metadata.name"


def test_config_map_merges_user_settings_structured_fields_win() -> None:
    cm = render.config_map(
        REF, spec(flushDiskType="SYNC_FLUSH", config={"flushDiskType": "ASYNC_FLUSH", "fileReservedTime": "48"})
    )
    assert cm.metadata.name == "broker-a-config"
    settings = yaml.safe_load(cm.data["broker.yaml"])
    assert settings["flushDiskType"] == "SYNC_FLUSH"
    assert settings["fileReservedTime"] == "48"
    assert settings["brokerName"] == "broker-a" and settings["enableControllerMode"] is True


def test_config_change_changes_the_pod_template() -> None:
    a = render.stateful_set(REF, spec(config={"fileReservedTime": "48"})).spec.template.metadata.annotations
    b = render.stateful_set(REF, spec(config={"fileReservedTime": "72"})).spec.template.metadata.annotations
    assert a[render.CONFIG_HASH_ANNOTATION] != b[render.CONFIG_HASH_ANNOTATION]
    c = render.stateful_set(REF, spec(config={"fileReservedTime": "48"})).spec.template.metadata.annotations
    assert a == c


def test_headless_service_publishes_not_ready_pods() -> None:
    svc = render.headless_service(REF)
    assert svc.metadata.name == "broker-a-headless"
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses is True
    assert {p.name for p in svc.spec.ports} == {"http", "tcp", "ha"}


def test_master_service_selects_the_master_role_only() -> None:
    svc = render.master_service(REF)
    assert svc.metadata.name == "broker-a-master"
    assert svc.spec.selector == {**render.selector_labels("broker-a"), "ferrymq.io/role": "master"}
    assert {p.port for p in svc.spec.ports} == {8080, 10911}


@pytest.mark.parametrize(("replicas", "min_isr", "max_unavailable"), [(3, 1, 1), (3, 2, 1), (2, 2, 0), (1, 1, 0)])
def test_pdb_never_allows_dropping_below_min_in_sync(replicas: int, min_isr: int, max_unavailable: int) -> None:
    pdb = render.pod_disruption_budget(
        REF, spec(replicas=replicas, replication={"inSyncReplicas": min_isr, "minInSyncReplicas": min_isr})
    )
    assert pdb.spec.max_unavailable == max_unavailable
    assert pdb.spec.selector.match_labels == render.selector_labels("broker-a")


def test_resources_are_passed_through() -> None:
    c = render.broker_container(REF, spec(resources={"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}))
    assert c.resources.requests == {"cpu": "500m"} and c.resources.limits == {"memory": "1Gi"}
    assert render.broker_container(REF, spec()).resources is None


def test_to_dict_is_camel_case_wire_form() -> None:
    d = render.to_dict(render.stateful_set(REF, spec()))
    assert d["spec"]["serviceName"] == "broker-a-headless"
    assert d["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert "service_name" not in yaml.safe_dump(d)
