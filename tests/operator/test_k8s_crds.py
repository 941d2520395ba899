"""CRDs: generated from the pydantic models, committed in sync, valid, and enforcing the contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml
from k8s_helpers import CHART, K8S_VERSION, MANIFESTS, REPO, load_file

from ferrymq.operator import crds, models

DATA = Path(__file__).parent / "data"
EXAMPLES = sorted((MANIFESTS / "examples").glob("*.yaml"))
INVALID = sorted((DATA / "invalid").glob("*.yaml"))


def crd_schema(kind: str) -> dict[str, Any]:
    crd = crds.broker_group_crd() if kind == "BrokerGroup" else crds.topic_crd()
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def validate_object(obj: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(crd_schema(obj["kind"])).validate(obj)


def test_committed_crds_equal_generated() -> None:
    assert crds.stale() == [], "run: python -m ferrymq.operator.crds --write"
    for folder in crds.CRD_DIRS:
        assert sorted(p.name for p in folder.glob("*.yaml")) == sorted(crds.generated_files())


def test_check_entrypoint_reports_clean() -> None:
    assert crds.main(["--check"]) == 0


def test_write_is_deterministic(tmp_path: Path) -> None:
    first = crds.write((tmp_path,))
    texts = {p.name: p.read_text() for p in first}
    crds.write((tmp_path,))
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == texts


@pytest.mark.parametrize("path", sorted((CHART / "crds").glob("*.yaml")), ids=lambda p: p.name)
def test_crds_validate_against_kubernetes_schema(path: Path) -> None:
    for doc in load_file(path):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for key in ("properties",):
            for name, sub in (node.get(key) or {}).items():
                out.extend(_walk(sub, f"{path}.{name}"))
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                out.extend(_walk(node[key], f"{path}[{key}]"))
    return out


@pytest.mark.parametrize("kind", ["BrokerGroup", "Topic"])
def test_schemas_are_structural(kind: str) -> None:
    for path, node in _walk(crd_schema(kind)):
        assert "$ref" not in node and "title" not in node and "anyOf" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{kind}{path} has no type"
        assert node.get("additionalProperties") is not False, path
        assert "default" not in node or node["default"] is not None, path


def test_contract_field_names() -> None:
    bg = crd_schema("BrokerGroup")["properties"]
    spec, status = bg["spec"]["properties"], bg["status"]["properties"]
    for name in ("replicas", "image", "storage", "flushDiskType", "replication", "resources", "config"):
        assert name in spec
    assert {"size", "storageClassName"} <= set(spec["storage"]["properties"])
    assert {"mode", "inSyncReplicas", "minInSyncReplicas", "allAckInSyncStateSet"} <= set(
        spec["replication"]["properties"]
    )
    assert spec["flushDiskType"]["enum"] == ["SYNC_FLUSH", "ASYNC_FLUSH"]
    assert spec["replication"]["properties"]["mode"]["enum"] == ["SYNC", "ASYNC"]
    assert spec["config"]["additionalProperties"] == {"type": "string"}
    for name in ("phase", "readyReplicas", "master", "masterEpoch", "syncStateSet", "conditions", "observedGeneration"):
        assert name in status
    topic = crd_schema("Topic")["properties"]
    tspec, tstatus = topic["spec"]["properties"], topic["status"]["properties"]
    for name in ("topicName", "readQueueNums", "writeQueueNums", "perm", "messageType", "brokerGroups"):
        assert name in tspec
    assert tspec["messageType"]["enum"] == ["NORMAL", "FIFO", "DELAY", "TRANSACTION"]
    assert {"groups", "conditions", "observedGeneration"} <= set(tstatus)


@pytest.mark.parametrize("crd", [crds.broker_group_crd(), crds.topic_crd()], ids=["brokergroup", "topic"])
def test_crd_shape(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert spec["group"] == "ferrymq.io" and spec["scope"] == "Namespaced"
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert spec["names"]["shortNames"]


def test_printer_columns() -> None:
    bg = {c["name"]: c["jsonPath"] for c in crds.broker_group_crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert bg["Replicas"] == ".spec.replicas" and bg["Ready"] == ".status.readyReplicas"
    assert bg["Master"] == ".status.master" and bg["Epoch"] == ".status.masterEpoch"
    topic = {c["name"]: c["jsonPath"] for c in crds.topic_crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert topic["Read"] == ".spec.readQueueNums" and topic["Write"] == ".spec.writeQueueNums"
    assert "Ready" in topic["Ready"]
    assert crds.broker_group_crd()["spec"]["names"]["shortNames"][0] == "bg"
    assert "fmqtopic" in crds.topic_crd()["spec"]["names"]["shortNames"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_crd_and_models(path: Path) -> None:
    for obj in load_file(path):
        validate_object(obj)
        model = models.BrokerGroupSpec if obj["kind"] == "BrokerGroup" else models.TopicSpec
        model.model_validate(obj["spec"])


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_objects_are_rejected_by_schema(path: Path) -> None:
    (obj,) = load_file(path)
    with pytest.raises(jsonschema.ValidationError):
        validate_object(obj)
    model = models.BrokerGroupSpec if obj["kind"] == "BrokerGroup" else models.TopicSpec
    with pytest.raises(pydantic.ValidationError):
        model.model_validate(obj["spec"])


@pytest.mark.parametrize(
    ("model", "spec", "rule"),
    [
        (models.BrokerGroupSpec, {"replicas": 1, "replication": {"minInSyncReplicas": 2, "inSyncReplicas": 2}}, 0),
        (models.BrokerGroupSpec, {"replication": {"minInSyncReplicas": 3, "inSyncReplicas": 2}}, 1),
        (models.TopicSpec, {"readQueueNums": 2, "writeQueueNums": 4}, 0),
    ],
)
def test_cross_field_rules_rejected_by_models_and_declared_as_cel(model: type, spec: dict[str, Any], rule: int) -> None:
    # jsonschema cannot run CEL; the models enforce the same rules the API server enforces via CEL.
    with pytest.raises(pydantic.ValidationError):
        model.model_validate(spec)
    rules = models.BROKER_GROUP_CEL_RULES if model is models.BrokerGroupSpec else models.TOPIC_CEL_RULES
    crd = crds.broker_group_crd() if model is models.BrokerGroupSpec else crds.topic_crd()
    declared = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert rules[rule] in declared["x-kubernetes-validations"]


def test_model_defaults_match_schema_defaults() -> None:
    spec = crd_schema("BrokerGroup")["properties"]["spec"]["properties"]
    default = models.BrokerGroupSpec()
    assert spec["replicas"]["default"] == default.replicas
    assert spec["flushDiskType"]["default"] == default.flush_disk_type
    assert spec["replication"]["default"] == {}
    assert spec["replication"]["properties"]["minInSyncReplicas"]["default"] == 1
    tspec = crd_schema("Topic")["properties"]["spec"]["properties"]
    assert tspec["perm"]["default"] == "RW" and tspec["messageType"]["default"] == "NORMAL"


def test_models_round_trip_contract_names() -> None:
    spec = models.BrokerGroupSpec.model_validate(
        {
            "replicas": 3,
            "storage": {"size": "1Gi", "storageClassName": "fast"},
            "replication": {"mode": "ASYNC", "allAckInSyncStateSet": True},
            "config": {"a": "b"},
        }
    )
    dumped = spec.dump()
    assert dumped["storage"]["storageClassName"] == "fast"
    assert dumped["replication"]["allAckInSyncStateSet"] is True
    assert "storage_class_name" not in yaml.safe_dump(dumped)


def test_kopf_peering_crds_present() -> None:
    names = {d["metadata"]["name"] for d in load_file(CHART / "crds" / "kopf-peering.yaml")}
    assert names == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert (REPO / "manifests" / "crds" / "kopf-peering.yaml").exists()
