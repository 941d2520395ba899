"""The Kubernetes store around the exact API calls it makes, against an in-memory API server double.

No API server runs here. The double implements the five calls the store uses — read/create/replace of a
coordination.k8s.io/v1 Lease and of a ConfigMap — with the API server's optimistic concurrency: every write
bumps ``metadata.resourceVersion``, and a replace naming another resourceVersion is a 409 Conflict.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.service import ControllerService
from ferrymq.controller.stores import store_from_url
from ferrymq.controller.stores.base import StoreConflict
from ferrymq.controller.stores.kubernetes import STATE_KEY, KubernetesStore

NS, NAME = "ferrymq", "ferrymq-controller"


class FakeApiServer:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Any] = {}
        self.rv = 100
        self.calls: list[str] = []
        self.down = False
        self.interleave: Any = None  # runs once inside the next replace, before its resourceVersion check

    def _read(self, kind: str, name: str, ns: str) -> Any:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        obj = self.objects.get((kind, ns, name))
        if obj is None:
            raise ApiException(status=404, reason="Not Found")
        return copy.deepcopy(obj)

    def _store(self, kind: str, ns: str, body: Any) -> Any:
        self.rv += 1
        stored = copy.deepcopy(body)
        stored.metadata.resource_version = str(self.rv)
        self.objects[(kind, ns, stored.metadata.name)] = stored
        return copy.deepcopy(stored)

    def _create(self, kind: str, ns: str, body: Any) -> Any:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        if (kind, ns, body.metadata.name) in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(kind, ns, body)

    def _replace(self, kind: str, name: str, ns: str, body: Any) -> Any:
        if self.interleave is not None:
            other, self.interleave = self.interleave, None
            other()
        current = self._read(kind, name, ns)
        if body.metadata.resource_version is not None and body.metadata.resource_version != \
                current.metadata.resource_version:
            raise ApiException(status=409, reason="Conflict")
        return self._store(kind, ns, body)


class FakeCoordinationV1Api:
    def __init__(self, server: FakeApiServer) -> None:
        self.server = server

    def read_namespaced_lease(self, name: str, namespace: str) -> client.V1Lease:
        self.server.calls.append("read_namespaced_lease")
        return self.server._read("Lease", name, namespace)

    def create_namespaced_lease(self, namespace: str, body: client.V1Lease) -> client.V1Lease:
        self.server.calls.append("create_namespaced_lease")
        return self.server._create("Lease", namespace, body)

    def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease) -> client.V1Lease:
        self.server.calls.append("replace_namespaced_lease")
        return self.server._replace("Lease", name, namespace, body)


class FakeCoreV1Api:
    def __init__(self, server: FakeApiServer) -> None:
        self.server = server

    def read_namespaced_config_map(self, name: str, namespace: str) -> client.V1ConfigMap:
        self.server.calls.append("read_namespaced_config_map")
        return self.server._read("ConfigMap", name, namespace)

    def create_namespaced_config_map(self, namespace: str, body: client.V1ConfigMap) -> client.V1ConfigMap:
        self.server.calls.append("create_namespaced_config_map")
        return self.server._create("ConfigMap", namespace, body)

    def replace_namespaced_config_map(self, name: str, namespace: str,
                                      body: client.V1ConfigMap) -> client.V1ConfigMap:
        self.server.calls.append("replace_namespaced_config_map")
        return self.server._replace("ConfigMap", name, namespace, body)


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


def make_store(server: FakeApiServer, identity: str, clock: Clock, duration: int = 10) -> KubernetesStore:
    return KubernetesStore(NS, NAME, identity, lease_duration_s=duration,
                           coordination_api=FakeCoordinationV1Api(server), core_api=FakeCoreV1Api(server), clock=clock)


@pytest.fixture
def server() -> FakeApiServer:
    return FakeApiServer()


def lease(server: FakeApiServer) -> client.V1Lease:
    return server.objects[("Lease", NS, NAME)]


async def test_url_parsing() -> None:
    store = store_from_url("kubernetes://ns1/ctl", "http://me", lease_seconds=7)
    assert isinstance(store, KubernetesStore)
    assert (store.namespace, store.lease_name, store.config_map_name, store.lease_duration_s) == \
        ("ns1", "ctl", "ctl-state", 7)


async def test_first_candidate_creates_the_lease(server: FakeApiServer) -> None:
    one = make_store(server, "http://one", Clock())
    assert await one.campaign() is True and one.is_leader()
    spec = lease(server).spec
    assert spec.holder_identity == "http://one" and spec.lease_duration_seconds == 10
    assert spec.renew_time is not None and spec.lease_transitions == 0
    assert server.calls == ["read_namespaced_lease", "create_namespaced_lease"]


async def test_holder_renews_and_a_watching_candidate_waits(server: FakeApiServer) -> None:
    clock = Clock()
    one, two = make_store(server, "http://one", clock), make_store(server, "http://two", clock)
    assert await one.campaign() is True
    for _ in range(5):
        clock.t += 4  # 20 s in all, well past the duration, but renewed every 4 s
        before = lease(server).spec.renew_time
        assert await one.campaign() is True
        assert lease(server).spec.renew_time >= before
        assert await two.campaign() is False
        assert two.leader_address() == "http://one" and not two.is_leader()
    assert "replace_namespaced_lease" in server.calls


async def test_unrenewed_lease_is_taken_over_once(server: FakeApiServer) -> None:
    clock = Clock()
    one, two, three = (make_store(server, f"http://{n}", clock) for n in ("one", "two", "three"))
    assert await one.campaign() is True
    assert await two.campaign() is False and await three.campaign() is False
    clock.t += 11  # one stopped renewing (killed); the others have watched the same record for > 10 s
    results = [await two.campaign(), await three.campaign()]
    assert results == [True, False]
    assert lease(server).spec.holder_identity == "http://two" and lease(server).spec.lease_transitions == 1
    assert three.leader_address() == "http://two"
    # one's own belief ran out with its lease, and its next round learns who leads
    assert not one.is_leader()
    assert await one.campaign() is False and one.leader_address() == "http://two"


async def test_racing_takeover_has_one_winner(server: FakeApiServer) -> None:
    clock = Clock()
    one, two, three = (make_store(server, f"http://{n}", clock) for n in ("one", "two", "three"))
    assert await one.campaign() is True
    assert await two.campaign() is False and await three.campaign() is False
    clock.t += 11

    def three_lands_first() -> None:
        taken = copy.deepcopy(lease(server))
        taken.spec.holder_identity = "http://three"
        server._replace("Lease", NAME, NS, taken)

    server.interleave = three_lands_first  # between two's read and two's replace
    assert await two.campaign() is False  # its replace named the resourceVersion it read: 409
    assert not two.is_leader()
    assert lease(server).spec.holder_identity == "http://three"
    assert await two.campaign() is False and two.leader_address() == "http://three"


async def test_resign_lets_the_next_candidate_in_at_once(server: FakeApiServer) -> None:
    clock = Clock()
    one, two = make_store(server, "http://one", clock), make_store(server, "http://two", clock)
    assert await one.campaign() is True
    await one.resign()
    assert lease(server).spec.holder_identity is None and not one.is_leader()
    assert await two.campaign() is True


async def test_state_config_map_compare_and_swap(server: FakeApiServer) -> None:
    clock = Clock()
    one, two = make_store(server, "http://one", clock), make_store(server, "http://two", clock)
    with pytest.raises(StoreConflict):  # not leader yet
        await one.compare_and_swap(None, {"x": 1})
    assert await one.campaign() is True
    empty = await one.load()
    assert empty.data is None and empty.version is None
    v1 = await one.compare_and_swap(None, {"x": 1})
    cm = server.objects[("ConfigMap", NS, f"{NAME}-state")]
    assert json.loads(cm.data[STATE_KEY]) == {"x": 1} and cm.metadata.resource_version == v1
    with pytest.raises(StoreConflict):
        await one.compare_and_swap(None, {"x": 2})  # create again: AlreadyExists
    v2 = await one.compare_and_swap(v1, {"x": 2})
    with pytest.raises(StoreConflict):
        await one.compare_and_swap(v1, {"x": 3})  # stale resourceVersion
    loaded = await two.load()
    assert loaded.data == {"x": 2} and loaded.version == v2
    assert server.calls.count("replace_namespaced_config_map") == 2


async def test_api_outage_keeps_leadership_until_the_lease_could_have_run_out(server: FakeApiServer) -> None:
    clock = Clock()
    one = make_store(server, "http://one", clock)
    assert await one.campaign() is True
    server.down = True
    clock.t += 5
    assert await one.campaign() is True  # 5 s < 0.8 x 10 s since the last renewal was sent
    clock.t += 4
    assert await one.campaign() is False  # might have expired: stop deciding
    server.down = False
    assert await one.campaign() is True  # still the holder: renewed


async def test_controller_service_on_the_kubernetes_store(server: FakeApiServer) -> None:
    clock = Clock()
    store = make_store(server, "http://ctl-0", clock)
    cfg = ControllerConfig(store=f"kubernetes://{NS}/{NAME}", scan_interval=3_600_000)
    svc = ControllerService(cfg, store, clock=clock)
    await svc.start()
    try:
        for _ in range(100):
            if svc.is_leader:
                break
            await asyncio.sleep(0.01)
        assert svc.is_leader
        broker_id, gs = await svc.register("g", "a", http_address="a:1", tcp_address="a:2", ha_address="a:3",
                                           broker_id=None, election_priority=0)
        assert broker_id == 1 and gs.master_id == 1
        stored = json.loads(server.objects[("ConfigMap", NS, f"{NAME}-state")].data[STATE_KEY])
        assert stored["groups"][0]["masterId"] == 1 and stored["groups"][0]["masterEpoch"] == 1
    finally:
        await svc.stop()
    assert lease(server).spec.holder_identity is None  # a clean stop released the Lease
