"""Pure renderers: a BrokerGroup spec -> the Kubernetes objects that run it.

Every function returns a kubernetes client model and touches no API server, so each one
is unit-tested by value; :func:`to_dict` turns a model into the wire form the API takes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml
from kubernetes import client as k8s

from ferrymq.operator import models

HTTP_PORT = 8080
TCP_PORT = 10911
HA_PORT = 10912
DATA_DIR = "/data"
CONFIG_DIR = "/etc/ferrymq"
CONFIG_FILE = "broker.yaml"
RUN_AS_USER = 10001

ROLE_LABEL = "ferrymq.io/role"
GROUP_LABEL = "ferrymq.io/broker-group"
CONFIG_HASH_ANNOTATION = "ferrymq.io/config-hash"
REVISION_LABEL = "controller-revision-hash"  # Set by the StatefulSet controller on each pod.

_api = k8s.ApiClient()


@dataclass(frozen=True)
class BrokerGroupRef:
    """Identity of the BrokerGroup object the rendered children belong to."""

    name: str
    namespace: str
    uid: str
    controller_url: str


def to_dict(obj: Any) -> dict[str, Any]:
    """A kubernetes model in its JSON wire form (camelCase, no nulls)."""
    return _api.sanitize_for_serialization(obj)


def headless_service_name(name: str) -> str:
    return f"{name}-headless"


def master_service_name(name: str) -> str:
    return f"{name}-master"


def config_map_name(name: str) -> str:
    return f"{name}-config"


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "ferrymq", "app.kubernetes.io/component": "broker", GROUP_LABEL: name}


def common_labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "ferrymq-operator",
    }


def _owner(ref: BrokerGroupRef) -> list[k8s.V1OwnerReference]:
    # Owner references make Kubernetes garbage-collect the children with the BrokerGroup.
    return [
        k8s.V1OwnerReference(
            api_version=models.API_VERSION,
            kind="BrokerGroup",
            name=ref.name,
            uid=ref.uid,
            controller=True,
            block_owner_deletion=True,
        )
    ]


def _meta(ref: BrokerGroupRef, name: str) -> k8s.V1ObjectMeta:
    return k8s.V1ObjectMeta(
        name=name, namespace=ref.namespace, labels=common_labels(ref.name), owner_references=_owner(ref)
    )


def broker_settings(ref: BrokerGroupRef, spec: models.BrokerGroupSpec) -> dict[str, Any]:
    """The broker's config file: the user's spec.config, with the structured spec fields winning."""
    settings: dict[str, Any] = dict(sorted((spec.config or {}).items()))
    settings.update(
        {
            "brokerClusterName": ref.namespace,
            "brokerName": ref.name,
            "flushDiskType": spec.flush_disk_type,
            "replicationMode": spec.replication.mode,
            "inSyncReplicas": spec.replication.in_sync_replicas,
            "minInSyncReplicas": spec.replication.min_in_sync_replicas,
            "allAckInSyncStateSet": spec.replication.all_ack_in_sync_state_set,
            "enableControllerMode": True,
        }
    )
    return settings


def config_map(ref: BrokerGroupRef, spec: models.BrokerGroupSpec) -> k8s.V1ConfigMap:
    text = yaml.safe_dump(broker_settings(ref, spec), sort_keys=False)
    return k8s.V1ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=_meta(ref, config_map_name(ref.name)),
        data={CONFIG_FILE: text},
    )


def config_hash(cm: k8s.V1ConfigMap) -> str:
    # The pod template carries the hash so that a settings change rolls the pods like any spec change.
    text = yaml.safe_dump(cm.data, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ports(include_ha: bool) -> list[k8s.V1ServicePort]:
    ports = [
        k8s.V1ServicePort(name="http", port=HTTP_PORT, target_port="http", protocol="TCP"),
        k8s.V1ServicePort(name="tcp", port=TCP_PORT, target_port="tcp", protocol="TCP"),
    ]
    if include_ha:
        ports.append(k8s.V1ServicePort(name="ha", port=HA_PORT, target_port="ha", protocol="TCP"))
    return ports


def headless_service(ref: BrokerGroupRef) -> k8s.V1Service:
    # Not-ready pods are published too: a restarting slave must resolve its peers to catch up.
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=_meta(ref, headless_service_name(ref.name)),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector=selector_labels(ref.name),
            ports=_ports(include_ha=True),
        ),
    )


def master_service(ref: BrokerGroupRef) -> k8s.V1Service:
    selector = {**selector_labels(ref.name), ROLE_LABEL: "master"}
    return k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=_meta(ref, master_service_name(ref.name)),
        spec=k8s.V1ServiceSpec(type="ClusterIP", selector=selector, ports=_ports(include_ha=False)),
    )


def pdb_max_unavailable(spec: models.BrokerGroupSpec) -> int:
    """One voluntary disruption at a time, and none when it would break minInSyncReplicas."""
    return 1 if spec.replicas - spec.replication.min_in_sync_replicas >= 1 else 0


def pod_disruption_budget(ref: BrokerGroupRef, spec: models.BrokerGroupSpec) -> k8s.V1PodDisruptionBudget:
    return k8s.V1PodDisruptionBudget(
        api_version="policy/v1",
        kind="PodDisruptionBudget",
        metadata=_meta(ref, ref.name),
        spec=k8s.V1PodDisruptionBudgetSpec(
            max_unavailable=pdb_max_unavailable(spec),
            selector=k8s.V1LabelSelector(match_labels=selector_labels(ref.name)),
        ),
    )


def broker_args(ref: BrokerGroupRef, spec: models.BrokerGroupSpec) -> list[str]:
    return [
        "broker",
        "--group",
        ref.name,
        "--data-dir",
        DATA_DIR,
        "--http-port",
        str(HTTP_PORT),
        "--tcp-port",
        str(TCP_PORT),
        "--ha-port",
        str(HA_PORT),
        "--controller",
        spec.controller_url or ref.controller_url,
        "--flush",
        "sync" if spec.flush_disk_type == "SYNC_FLUSH" else "async",
        "--replication",
        spec.replication.mode.lower(),
        "--in-sync-replicas",
        str(spec.replication.in_sync_replicas),
        "--min-in-sync-replicas",
        str(spec.replication.min_in_sync_replicas),
        "--config",
        f"{CONFIG_DIR}/{CONFIG_FILE}",
    ]


def _quantities(values: dict[str, models.Quantity] | None) -> dict[str, str] | None:
    # The API takes 2 or "2" alike; the client models want strings.
    return None if values is None else {k: str(v) for k, v in values.items()}


def _probe(period: int, failures: int) -> k8s.V1Probe:
    return k8s.V1Probe(
        http_get=k8s.V1HTTPGetAction(path="/v1/health", port="http"),
        period_seconds=period,
        timeout_seconds=3,
        failure_threshold=failures,
    )


def broker_container(ref: BrokerGroupRef, spec: models.BrokerGroupSpec) -> k8s.V1Container:
    env = [
        k8s.V1EnvVar(
            name="FERRYMQ_NAME",
            value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name")),
        ),
        k8s.V1EnvVar(
            name="POD_NAMESPACE",
            value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.namespace")),
        ),
        # The stable per-pod DNS name the headless Service gives; peers and clients dial it.
        k8s.V1EnvVar(
            name="FERRYMQ_ADVERTISE_HOST",
            value=f"$(FERRYMQ_NAME).{headless_service_name(ref.name)}.{ref.namespace}.svc",
        ),
    ]
    resources = None
    if spec.resources is not None:
        resources = k8s.V1ResourceRequirements(
            limits=_quantities(spec.resources.limits), requests=_quantities(spec.resources.requests)
        )
    return k8s.V1Container(
        name="broker",
        image=spec.image,
        image_pull_policy=spec.image_pull_policy,
        args=broker_args(ref, spec),
        env=env,
        ports=[
            k8s.V1ContainerPort(name="http", container_port=HTTP_PORT, protocol="TCP"),
            k8s.V1ContainerPort(name="tcp", container_port=TCP_PORT, protocol="TCP"),
            k8s.V1ContainerPort(name="ha", container_port=HA_PORT, protocol="TCP"),
        ],
        # Recovery of a large commit log can take minutes; the startup probe covers that window.
        startup_probe=_probe(period=5, failures=120),
        readiness_probe=_probe(period=5, failures=3),
        liveness_probe=_probe(period=10, failures=6),
        resources=resources,
        volume_mounts=[
            k8s.V1VolumeMount(name="data", mount_path=DATA_DIR),
            k8s.V1VolumeMount(name="config", mount_path=CONFIG_DIR, read_only=True),
        ],
        security_context=k8s.V1SecurityContext(
            allow_privilege_escalation=False,
            run_as_non_root=True,
            capabilities=k8s.V1Capabilities(drop=["ALL"]),
        ),
    )


def _anti_affinity(name: str) -> k8s.V1Affinity:
    # Preferred, not required: a small cluster (kind) must still schedule every replica.
    term = k8s.V1WeightedPodAffinityTerm(
        weight=100,
        pod_affinity_term=k8s.V1PodAffinityTerm(
            topology_key="kubernetes.io/hostname",
            label_selector=k8s.V1LabelSelector(match_labels=selector_labels(name)),
        ),
    )
    return k8s.V1Affinity(
        pod_anti_affinity=k8s.V1PodAntiAffinity(preferred_during_scheduling_ignored_during_execution=[term])
    )


def stateful_set(ref: BrokerGroupRef, spec: models.BrokerGroupSpec, replicas: int | None = None) -> k8s.V1StatefulSet:
    """The brokers' StatefulSet; ``replicas`` overrides spec.replicas while a scale-down waits."""
    cm = config_map(ref, spec)
    claim_spec = k8s.V1PersistentVolumeClaimSpec(
        access_modes=["ReadWriteOnce"],
        storage_class_name=spec.storage.storage_class_name,
        resources=k8s.V1VolumeResourceRequirements(requests={"storage": spec.storage.size}),
    )
    template = k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(
            labels=common_labels(ref.name), annotations={CONFIG_HASH_ANNOTATION: config_hash(cm)}
        ),
        spec=k8s.V1PodSpec(
            containers=[broker_container(ref, spec)],
            volumes=[
                k8s.V1Volume(name="config", config_map=k8s.V1ConfigMapVolumeSource(name=config_map_name(ref.name)))
            ],
            affinity=_anti_affinity(ref.name),
            termination_grace_period_seconds=spec.termination_grace_period_seconds,
            security_context=k8s.V1PodSecurityContext(
                run_as_user=RUN_AS_USER,
                run_as_group=RUN_AS_USER,
                fs_group=RUN_AS_USER,
                run_as_non_root=True,
                seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
            ),
        ),
    )
    return k8s.V1StatefulSet(
        api_version="apps/v1",
        kind="StatefulSet",
        metadata=_meta(ref, ref.name),
        spec=k8s.V1StatefulSetSpec(
            replicas=spec.replicas if replicas is None else replicas,
            service_name=headless_service_name(ref.name),
            selector=k8s.V1LabelSelector(match_labels=selector_labels(ref.name)),
            # Parallel: replicas start together; the operator itself orders disruptive steps.
            pod_management_policy="Parallel",
            # OnDelete: the operator, not the StatefulSet controller, decides which pod restarts when.
            update_strategy=k8s.V1StatefulSetUpdateStrategy(type="OnDelete"),
            template=template,
            volume_claim_templates=[
                k8s.V1PersistentVolumeClaim(
                    api_version="v1",
                    kind="PersistentVolumeClaim",
                    metadata=k8s.V1ObjectMeta(name="data", labels=selector_labels(ref.name)),
                    spec=claim_spec,
                )
            ],
        ),
    )


def children(ref: BrokerGroupRef, spec: models.BrokerGroupSpec, replicas: int | None = None) -> list[Any]:
    """Every object a BrokerGroup owns, in apply order (config before the pods that mount it)."""
    return [
        config_map(ref, spec),
        headless_service(ref),
        master_service(ref),
        pod_disruption_budget(ref, spec),
        stateful_set(ref, spec, replicas),
    ]
