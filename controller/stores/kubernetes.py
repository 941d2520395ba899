"""Kubernetes backend: a coordination.k8s.io/v1 Lease for leadership, a ConfigMap for the state.

Leadership follows client-go's leader election: the holder renews ``renewTime`` every round; a candidate
takes the Lease over only after it has watched the same record (holder and resourceVersion) stay unchanged
for ``leaseDurationSeconds`` on its own clock, so clock skew between nodes does not matter. Every write —
of the Lease and of the ConfigMap ``<name>-state`` — is a replace carrying the resourceVersion that was
read, which the API server turns into a 409 when anyone wrote in between. The Lease and the ConfigMap
cannot be updated in one transaction, so a leader that lost its Lease could still write once more; but only
if nobody wrote since it read, so no decision is ever made against state it has not seen.

The official client is synchronous, so each call runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ferrymq.controller.stores.base import ControllerStore, StoreConflict, StoreUnavailable, Versioned

log = logging.getLogger(__name__)
STATE_KEY = "state.json"
LEASE_TRUST = 0.8  # believe leadership for this share of the lease after a renewal was sent
T = TypeVar("T")


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class KubernetesStore(ControllerStore):
    def __init__(self, namespace: str, name: str, identity: str, *, lease_duration_s: int = 10,
                 coordination_api: Any = None, core_api: Any = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(identity)
        self.namespace = namespace
        self.lease_name = name
        self.config_map_name = f"{name}-state"
        self.lease_duration_s = lease_duration_s
        self.clock = clock
        self._coord = coordination_api
        self._core = core_api
        self._valid_until = 0.0
        self._holding = False
        self._term = 0
        self._leader_addr: str | None = None
        self._observed: tuple[str | None, str | None] | None = None
        self._observed_at = 0.0

    async def open(self) -> None:
        if self._coord is not None and self._core is not None:
            return
        from kubernetes import client, config

        def load() -> None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()

        try:
            await asyncio.to_thread(load)
        except Exception as exc:
            raise StoreUnavailable(f"no Kubernetes configuration (in-cluster or kubeconfig): {exc}") from exc
        self._coord = client.CoordinationV1Api()
        self._core = client.CoreV1Api()

    async def _api(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one API call on a thread; ApiExceptions pass through, transport errors become StoreUnavailable."""
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except Exception as exc:
            if _status(exc) is not None:
                raise
            raise StoreUnavailable(f"Kubernetes API call {fn.__name__} failed: {type(exc).__name__}: {exc}") from exc

    # ---- state ------------------------------------------------------------------------------------------
    async def load(self) -> Versioned:
        try:
            cm = await self._api(self._core.read_namespaced_config_map, self.config_map_name, self.namespace)
        except Exception as exc:
            if _status(exc) == 404:
                return Versioned(None, None)
            raise StoreUnavailable(f"reading ConfigMap {self.config_map_name}: {exc}") from exc
        raw = (cm.data or {}).get(STATE_KEY)
        return Versioned(json.loads(raw) if raw else None, cm.metadata.resource_version)

    async def compare_and_swap(self, expected_version: Any, data: dict[str, Any]) -> Any:
        from kubernetes import client

        if not self.is_leader():
            raise StoreConflict("this controller does not hold the Kubernetes Lease")
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=self.config_map_name, namespace=self.namespace,
                                         resource_version=expected_version,
                                         labels={"app.kubernetes.io/name": "ferrymq",
                                                 "app.kubernetes.io/component": "controller"}),
            data={STATE_KEY: json.dumps(data)},
        )
        try:
            if expected_version is None:
                cm = await self._api(self._core.create_namespaced_config_map, self.namespace, body)
            else:
                cm = await self._api(self._core.replace_namespaced_config_map, self.config_map_name,
                                     self.namespace, body)
        except Exception as exc:
            if _status(exc) in (404, 409):
                raise StoreConflict(f"ConfigMap {self.config_map_name} changed since it was read") from exc
            if isinstance(exc, StoreUnavailable):
                raise
            raise StoreUnavailable(f"writing ConfigMap {self.config_map_name}: {exc}") from exc
        return cm.metadata.resource_version

    # ---- leadership -------------------------------------------------------------------------------------
    def _now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)

    def _new_lease(self, transitions: int) -> Any:
        from kubernetes import client

        now = self._now()
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.lease_name, namespace=self.namespace),
            spec=client.V1LeaseSpec(holder_identity=self.identity, lease_duration_seconds=self.lease_duration_s,
                                    acquire_time=now, renew_time=now, lease_transitions=transitions),
        )

    async def campaign(self) -> bool:
        try:
            return await self._campaign()
        except StoreUnavailable as exc:
            log.warning("Kubernetes leadership round failed: %s", exc.message)
            return self.is_leader()
        except Exception as exc:  # an unexpected ApiException status: keep serving, try again next round
            log.warning("Kubernetes leadership round failed: %s", exc)
            return self.is_leader()

    async def _campaign(self) -> bool:
        sent = self.clock()
        try:
            lease = await self._api(self._coord.read_namespaced_lease, self.lease_name, self.namespace)
        except Exception as exc:
            if _status(exc) != 404:
                raise
            return await self._write_lease(self._coord.create_namespaced_lease, sent, self.namespace,
                                           self._new_lease(0))
        spec = lease.spec
        holder = spec.holder_identity
        if holder == self.identity:
            spec.renew_time = self._now()
            spec.lease_duration_seconds = self.lease_duration_s
            return await self._write_lease(self._coord.replace_namespaced_lease, sent, self.lease_name,
                                           self.namespace, lease)
        self._holding = False
        record = (holder, lease.metadata.resource_version)
        if record != self._observed:
            self._observed, self._observed_at = record, sent
        duration = spec.lease_duration_seconds or self.lease_duration_s
        if holder and sent - self._observed_at < duration:
            self._leader_addr = holder
            return False
        log.info("Lease %s of %r unrenewed for %ss: taking over", self.lease_name, holder, duration)
        taken = self._new_lease((spec.lease_transitions or 0) + 1)
        taken.metadata.resource_version = lease.metadata.resource_version
        return await self._write_lease(self._coord.replace_namespaced_lease, sent, self.lease_name,
                                       self.namespace, taken)

    async def _write_lease(self, fn: Callable[..., Any], sent: float, *args: Any) -> bool:
        try:
            written = await self._api(fn, *args)
        except Exception as exc:
            if _status(exc) not in (404, 409):
                raise
            if self._holding:
                log.warning("Lease %s was written by someone else: leadership lost", self.lease_name)
            self._holding = False
            return False
        if not self._holding:
            self._term += 1
        self._holding = True
        self._valid_until = sent + self.lease_duration_s * LEASE_TRUST
        self._leader_addr = self.identity
        self._observed = (self.identity, written.metadata.resource_version)
        return True

    def is_leader(self) -> bool:
        return self._holding and self.clock() < self._valid_until

    def leader_address(self) -> str | None:
        return self._leader_addr

    @property
    def leadership_term(self) -> Any:
        return self._term if self._holding else None

    async def resign(self) -> None:
        """Empty the holder so a candidate may take over on its next round, as client-go's ReleaseOnCancel."""
        if not self._holding:
            return
        self._holding = False
        try:
            lease = await self._api(self._coord.read_namespaced_lease, self.lease_name, self.namespace)
            if lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                await self._api(self._coord.replace_namespaced_lease, self.lease_name, self.namespace, lease)
        except Exception as exc:
            log.warning("could not release Lease %s (it will expire by itself): %s", self.lease_name, exc)
        self._leader_addr = None

    @property
    def campaign_interval_s(self) -> float:
        return max(0.5, self.lease_duration_s / 4)
