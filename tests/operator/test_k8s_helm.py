"""Helm chart and plain manifests: lint, render, and validate every object offline.

Needs the helm binary (scripts/install-helm.sh puts it in .venv/bin); skipped without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_helpers import CHART, K8S_VERSION, MANIFESTS, REPO, load_docs, load_file, run_helm

from ferrymq.operator import crds, models

VALUE_SETS = {
    "defaults": [],
    "everything": [
        "--set",
        "brokerGroup.create=true",
        "--set",
        "topic.create=true",
        "--set",
        "brokerGroup.config.fileReservedTime=48",
        "--set",
        "operator.replicas=2",
    ],
    "cluster-wide": ["--set", "operator.clusterWide=true", "--set", "controller.replicas=3"],
    "no-operator": ["--set", "operator.enabled=false"],
}


def template(helm: str, *extra: str) -> list[dict[str, Any]]:
    return load_docs(run_helm(helm, "template", "ferrymq", str(CHART), "--namespace", "mq", *extra))


def validate_any(doc: dict[str, Any]) -> None:
    """Built-in kinds against Kubernetes' schemas; our CRs against the generated CRD schemas."""
    if doc["apiVersion"].startswith("ferrymq.io/"):
        crd = crds.broker_group_crd() if doc["kind"] == "BrokerGroup" else crds.topic_crd()
        jsonschema.Draft7Validator(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]).validate(doc)
        model = models.BrokerGroupSpec if doc["kind"] == "BrokerGroup" else models.TopicSpec
        model.model_validate(doc["spec"])
    elif doc["apiVersion"] == "kopf.dev/v1":
        assert doc["kind"] in ("KopfPeering", "ClusterKopfPeering") and doc["metadata"]["name"] == "ferrymq"
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_helm_lint(helm: str) -> None:
    for extra in VALUE_SETS.values():
        out = run_helm(helm, "lint", "--strict", str(CHART), *extra)
        assert "0 chart(s) failed" in out


@pytest.mark.parametrize("name", list(VALUE_SETS))
def test_rendered_objects_validate(helm: str, name: str) -> None:
    docs = template(helm, *VALUE_SETS[name])
    assert docs
    for doc in docs:
        validate_any(doc)


def test_defaults_render_operator_controller_and_rbac(helm: str) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in template(helm)}
    assert ("Deployment", "ferrymq-operator") in kinds and ("Deployment", "ferrymq-controller") in kinds
    assert ("Service", "ferrymq-controller") in kinds
    assert ("Role", "ferrymq-operator") in kinds and ("RoleBinding", "ferrymq-operator") in kinds
    assert ("Role", "ferrymq-controller") in kinds and ("KopfPeering", "ferrymq") in kinds
    assert not any(k == "BrokerGroup" for k, _ in kinds)
    assert ("Pod", "ferrymq-test-produce-consume") in kinds


def test_controller_command_and_replicas(helm: str) -> None:
    (dep,) = [d for d in template(helm) if d["kind"] == "Deployment" and "controller" in d["metadata"]["name"]]
    assert dep["spec"]["replicas"] == 2
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"] == ["controller", "--listen", "0.0.0.0:9876", "--store", "kubernetes://mq/ferrymq-controller"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/health"


def test_operator_deployment_is_namespaced_with_peering(helm: str) -> None:
    (dep,) = [d for d in template(helm) if d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][0] == "operator" and "--namespace=mq" in c["args"] and "--peering=ferrymq" in c["args"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["FERRYMQ_CONTROLLER_URL"] == "http://ferrymq-controller.mq.svc:9876"
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_operator_rbac_is_least_privilege(helm: str) -> None:
    docs = template(helm)
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "ferrymq-operator"]
    granted = {
        (g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert granted[("ferrymq.io", "brokergroups/status")] >= {"patch"}
    assert "delete" in granted[("", "pods")] and "create" not in granted[("", "pods")]
    assert ("", "secrets") not in granted and all("*" not in v for v in granted.values())
    assert ("kopf.dev", "kopfpeerings") in granted
    cluster = [d for d in docs if d["kind"] == "ClusterRole"]
    assert all(r["apiGroups"] == ["apiextensions.k8s.io"] for d in cluster for r in d["rules"])


def test_cluster_wide_uses_cluster_role_and_cluster_peering(helm: str) -> None:
    docs = template(helm, *VALUE_SETS["cluster-wide"])
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterRole", "ferrymq-operator") in kinds and ("ClusterKopfPeering", "ferrymq") in kinds
    assert not any(k == "Role" and n == "ferrymq-operator" for k, n in kinds)


def test_optional_broker_group_and_topic(helm: str) -> None:
    docs = template(helm, *VALUE_SETS["everything"])
    (bg,) = [d for d in docs if d["kind"] == "BrokerGroup"]
    assert bg["spec"]["replicas"] == 3 and bg["spec"]["config"] == {"fileReservedTime": "48"}
    (topic,) = [d for d in docs if d["kind"] == "Topic"]
    assert topic["spec"]["readQueueNums"] == 8


def test_helm_test_hook_produces_and_consumes(helm: str) -> None:
    (pod,) = [d for d in template(helm, *VALUE_SETS["everything"]) if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    assert "http://ferrymq-master.mq.svc:8080" in script
    assert "/messages" in script and "queueOffset" in script


@pytest.mark.parametrize(
    "bad",
    [
        ["--set", "controller.replicas=1"],
        ["--set", "controller.replicas=4"],
        ["--set", "brokerGroup.flushDiskType=MAYBE"],
        ["--set", "topic.readQueueNums=0"],
        ["--set", "nonsense=1"],
    ],
)
def test_values_schema_rejects_bad_values(helm: str, bad: list[str]) -> None:
    with pytest.raises(AssertionError):
        template(helm, *bad)


def test_values_schema_is_valid_json_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.Draft7Validator(schema).validate(yaml.safe_load((CHART / "values.yaml").read_text()))


def test_chart_crds_are_the_generated_ones() -> None:
    assert crds.stale() == []


def test_plain_manifests_are_rendered_from_the_chart(helm: str) -> None:
    text = (MANIFESTS / "install.yaml").read_text()
    rendered = run_helm(
        helm,
        "template",
        "ferrymq",
        str(CHART),
        "--namespace",
        "ferrymq",
        "--set",
        "createNamespace=true",
        "--skip-tests",
    )
    assert load_docs(text) == load_docs(rendered), "run scripts/render-manifests.sh"


@pytest.mark.parametrize("path", sorted(MANIFESTS.rglob("*.yaml")), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_plain_manifests_validate(path: Path) -> None:
    for doc in load_file(path):
        validate_any(doc)


def test_plain_install_has_everything() -> None:
    kinds = {d["kind"] for d in load_file(MANIFESTS / "install.yaml")}
    assert {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "Deployment",
        "Service",
        "KopfPeering",
    } <= kinds
    assert (REPO / "manifests" / "examples" / "brokergroup.yaml").exists()
