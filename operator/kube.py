"""The operator's few Kubernetes API calls, behind a small interface the reconcilers use.

:class:`KubeGateway` is what the reconcilers need; :class:`ApiGateway` implements it with the
official client (blocking calls moved to threads). Tests substitute an in-memory fake.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from ferrymq.operator import models

FIELD_MANAGER = "ferrymq-operator"
APPLY = "application/apply-patch+yaml"


class KubeGateway(Protocol):
    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def get_stateful_set(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]: ...
    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None: ...
    async def delete_pod(self, namespace: str, name: str) -> None: ...
    async def list_broker_groups(self, namespace: str) -> list[dict[str, Any]]: ...


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


class ApiGateway:
    """KubeGateway over the kubernetes client; objects in and out are plain camelCase dicts."""

    def __init__(self, api_client: k8s.ApiClient | None = None) -> None:
        self.api = api_client or k8s.ApiClient()
        self.core = k8s.CoreV1Api(self.api)
        self.apps = k8s.AppsV1Api(self.api)
        self.policy = k8s.PolicyV1Api(self.api)
        self.custom = k8s.CustomObjectsApi(self.api)

    def _plain(self, obj: Any) -> dict[str, Any]:
        return self.api.sanitize_for_serialization(obj)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply: create or update, dropping fields it set before but no longer renders."""
        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        patchers = {
            "ConfigMap": self.core.patch_namespaced_config_map,
            "Service": self.core.patch_namespaced_service,
            "StatefulSet": self.apps.patch_namespaced_stateful_set,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
        }
        result = await asyncio.to_thread(
            patchers[kind], name, ns, obj, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY
        )
        return self._plain(result)

    async def get_stateful_set(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._plain(await asyncio.to_thread(self.apps.read_namespaced_stateful_set, name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list_pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        pods = await asyncio.to_thread(self.core.list_namespaced_pod, namespace, label_selector=_selector(selector))
        return [self._plain(p) for p in pods.items]

    async def label_pod(self, namespace: str, name: str, labels: dict[str, str]) -> None:
        await asyncio.to_thread(self.core.patch_namespaced_pod, name, namespace, {"metadata": {"labels": labels}})

    async def delete_pod(self, namespace: str, name: str) -> None:
        try:
            await asyncio.to_thread(self.core.delete_namespaced_pod, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def list_broker_groups(self, namespace: str) -> list[dict[str, Any]]:
        data = await asyncio.to_thread(
            self.custom.list_namespaced_custom_object, models.GROUP, models.VERSION, namespace, "brokergroups"
        )
        return list(data.get("items", []))
