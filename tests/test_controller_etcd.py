"""The etcd backend against a real 3-member etcd cluster on loopback (Debian's etcd-server).

Store level: one leader per lease, compare-and-swap on mod_revision, and a deposed leader fenced by the
transaction even when it still believes it leads. Process level: several ``ferrymq controller`` processes,
fake brokers heartbeating through redirects, and the leading controller killed (or frozen) in the middle of
a failover — the next leader completes it, with exactly one new master and each epoch up by one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_support import ETCD, ControllerProcess, EtcdCluster, FakeBroker, post_json, wait_for
from support import free_port, http

from ferrymq.controller.stores import store_from_url
from ferrymq.controller.stores.base import StoreConflict
from ferrymq.controller.stores.etcd import EtcdStore

pytestmark = pytest.mark.skipif(ETCD is None, reason="etcd is not installed (apt-get install etcd-server; "
                                "`make system-deps` does it)")
FAILPOINT = "controller.before_persist_election"


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd")).start()
    yield cluster
    cluster.stop()


def etcd_store(etcd: EtcdCluster, prefix: str, identity: str, ttl: int = 2) -> EtcdStore:
    store = store_from_url(etcd.url(prefix), identity, lease_seconds=ttl)
    assert isinstance(store, EtcdStore)
    return store


# ---- store level ----------------------------------------------------------------------------------------
async def test_one_leader_and_compare_and_swap(etcd: EtcdCluster) -> None:
    one, two = etcd_store(etcd, "cas", "http://one"), etcd_store(etcd, "cas", "http://two")
    await one.open()
    await two.open()
    try:
        assert await one.campaign() is True
        assert await two.campaign() is False
        assert two.leader_address() == "http://one" and not two.is_leader()
        empty = await one.load()
        assert empty.data is None
        v1 = await one.compare_and_swap(empty.version, {"n": 1})
        assert (await two.load()).data == {"n": 1}
        with pytest.raises(StoreConflict):
            await one.compare_and_swap(empty.version, {"n": 2})  # stale version
        with pytest.raises(StoreConflict):
            await two.compare_and_swap(v1, {"n": 3})  # not the leader
        assert await one.campaign() is True  # renewal keeps it
        await one.resign()
        assert await two.campaign() is True  # a revoked lease frees the key at once
        assert one.leader_address() is None
        assert await one.campaign() is False and one.leader_address() == "http://two"
        assert (await two.load()).data == {"n": 1}
    finally:
        await one.close()
        await two.close()


async def test_deposed_leader_is_fenced_by_the_transaction(etcd: EtcdCluster) -> None:
    old, new = etcd_store(etcd, "fence", "http://old"), etcd_store(etcd, "fence", "http://new")
    await old.open()
    await new.open()
    try:
        assert await old.campaign() is True
        version = (await old.load()).version
        version = await old.compare_and_swap(version, {"by": "old"})
        # old stops renewing (paused process); its lease runs out and new takes over
        deadline = time.monotonic() + 10
        while not await new.campaign():
            assert time.monotonic() < deadline, "new never became leader"
            await asyncio.sleep(0.3)
        # old still believes it leads (a frozen clock) and still has the latest version: etcd refuses anyway
        old._valid_until = time.monotonic() + 60
        with pytest.raises(StoreConflict):
            await old.compare_and_swap(version, {"by": "old, too late"})
        await new.compare_and_swap(version, {"by": "new"})
        assert (await old.load()).data == {"by": "new"}
        assert await old.campaign() is False  # and it learns it lost
        assert not old.is_leader() and old.leader_address() == "http://new"
    finally:
        await old.close()
        await new.close()


async def test_store_survives_one_etcd_member_down(etcd: EtcdCluster) -> None:
    # the first endpoint listed is unreachable: requests move on to the next member
    store = EtcdStore([f"127.0.0.1:{free_port()}", *[f"127.0.0.1:{p}" for p in etcd.client_ports]],
                      "http://solo", prefix="/failover", lease_ttl_s=2)
    await store.open()
    try:
        assert await store.campaign() is True
        await store.compare_and_swap((await store.load()).version, {"ok": True})
        assert (await store.load()).data == {"ok": True}
    finally:
        await store.resign()
        await store.close()


# ---- process level --------------------------------------------------------------------------------------
def start_group(urls: list[str], brokers: list[FakeBroker]) -> tuple[FakeBroker, FakeBroker, FakeBroker]:
    a = FakeBroker(urls, "g", "a", max_offset=500).start()
    b = FakeBroker(urls, "g", "b", max_offset=480).start()
    c = FakeBroker(urls, "g", "c", max_offset=490).start()  # the most up-to-date slave
    brokers += [a, b, c]
    status, g = a._post("/v1/brokers/heartbeat", {"group": "g", "brokerId": a.broker_id, "maxOffset": 500})
    assert status == 200, g
    status, body = a._post("/v1/groups/g/sync-state-set", {
        "masterId": a.broker_id, "masterEpoch": g["masterEpoch"], "syncStateSetEpoch": g["syncStateSetEpoch"],
        "syncStateSet": [a.broker_id, b.broker_id, c.broker_id]})
    assert status == 200, body
    return a, b, c


@pytest.fixture
def brokers() -> Iterator[list[FakeBroker]]:
    made: list[FakeBroker] = []
    yield made
    for b in made:
        b.stop()


@pytest.fixture
def controllers() -> Iterator[list[ControllerProcess]]:
    made: list[ControllerProcess] = []
    yield made
    for c in made:
        if c.proc is not None and c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.proc.pid, signal.SIGCONT)  # a frozen process cannot die until it runs
            c.kill9()


def leader_of(controllers: list[ControllerProcess]) -> ControllerProcess | None:
    leaders = [c for c in controllers if c.running and c.is_leader()]
    assert len(leaders) <= 1, "two controllers claim leadership"
    return leaders[0] if leaders else None


def group_state(c: ControllerProcess) -> dict[str, Any]:
    status, body = http("GET", f"{c.url}/v1/groups/g", timeout=5)  # followers redirect reads to the leader
    assert status == 200, body
    return body


def launch(tmp_path: Path, store: str, n: int, controllers: list[ControllerProcess],
           first_env: dict[str, str] | None = None) -> ControllerProcess:
    """Start the first controller (with ``first_env``) and let it lead; then the others follow."""
    first = ControllerProcess(tmp_path, store, name="controller-0", env=first_env).start()
    controllers.append(first)
    wait_for(first.is_leader, 15, "the first controller to lead")
    for i in range(1, n):
        controllers.append(ControllerProcess(tmp_path, store, name=f"controller-{i}").start())
    return first


@pytest.mark.slow
def test_leader_killed_mid_failover_next_leader_completes_it(etcd: EtcdCluster, tmp_path: Path,
                                                             controllers: list[ControllerProcess],
                                                             brokers: list[FakeBroker]) -> None:
    first = launch(tmp_path, etcd.url("midfailover"), 3, controllers,
                   first_env={"FERRYMQ_FAILPOINTS": f"{FAILPOINT}=sleep(30000)"})
    urls = [c.url for c in controllers]
    a, b, c = start_group(urls, brokers)
    before = group_state(first)
    assert before["master"]["brokerId"] == a.broker_id and before["syncStateSet"] == [1, 2, 3]

    # followers: redirect group reads and broker writes, answer health and routes themselves
    follower = controllers[1]
    assert follower.health() == {"status": "ok", "leader": False, "leaderAddress": first.url,
                                 "groupsWithoutMaster": []}
    status, _, location = post_json(f"{follower.url}/v1/brokers/heartbeat",
                                            {"group": "g", "brokerId": 1})
    assert status == 307 and location == f"{first.url}/v1/brokers/heartbeat"

    a.stop()  # the master dies; the leader decides and stalls before persisting the election
    wait_for(lambda: f"failpoint {FAILPOINT}" in first.log(), 15, "the leader to reach the failpoint")
    first.kill9()
    new_leader = wait_for(lambda: leader_of(controllers), 20, "another controller to lead")
    assert new_leader is not first
    wait_for(lambda: group_state(new_leader)["master"] not in (None, before["master"]), 20,
             "the next leader to complete the failover")
    after = group_state(new_leader)
    assert after["master"]["brokerId"] == c.broker_id  # highest offset among the alive in-sync replicas
    assert after["masterEpoch"] == before["masterEpoch"] + 1
    assert after["syncStateSetEpoch"] == before["syncStateSetEpoch"] + 1
    assert after["syncStateSet"] == [c.broker_id]
    wait_for(lambda: c.last is not None and c.last["role"] == "master" and b.last["role"] == "slave", 5,
             "the brokers to learn their roles from heartbeat answers")
    for ctl in controllers[1:]:  # every controller, leader or follower, agrees
        assert group_state(ctl)["masterEpoch"] == after["masterEpoch"]
        assert ctl.call("GET", "/v1/health")[1]["leaderAddress"] == new_leader.url
    assert "broker 3 is master at masterEpoch 2" in new_leader.log()
    time.sleep(1)  # nothing decides it a second time
    assert group_state(new_leader)["masterEpoch"] == after["masterEpoch"]


@pytest.mark.slow
def test_frozen_leader_cannot_write_after_the_next_one_took_over(etcd: EtcdCluster, tmp_path: Path,
                                                                 controllers: list[ControllerProcess],
                                                                 brokers: list[FakeBroker]) -> None:
    first = launch(tmp_path, etcd.url("zombie"), 2, controllers,
                   first_env={"FERRYMQ_FAILPOINTS": f"{FAILPOINT}=sleep(2500)"})
    urls = [c.url for c in controllers]
    a, _, c = start_group(urls, brokers)
    before = group_state(first)
    a.stop()
    wait_for(lambda: f"failpoint {FAILPOINT}" in first.log(), 15, "the leader to reach the failpoint")
    assert first.proc is not None
    os.kill(first.proc.pid, signal.SIGSTOP)  # frozen mid-decision, lease unrenewed
    second = controllers[1]
    wait_for(second.is_leader, 20, "the second controller to lead")
    wait_for(lambda: group_state(second)["master"]["brokerId"] == c.broker_id, 20, "the failover")
    os.kill(first.proc.pid, signal.SIGCONT)  # wakes up, finishes its stall and tries to persist
    wait_for(lambda: "refused" in first.log() or "lost leadership" in first.log(), 15,
             "the old leader to find out it was deposed")
    time.sleep(0.5)
    after = group_state(second)
    assert after["masterEpoch"] == before["masterEpoch"] + 1
    assert after["syncStateSetEpoch"] == before["syncStateSetEpoch"] + 1
    assert not first.is_leader() and second.is_leader()
    assert first.health()["leaderAddress"] == second.url
    # a clean stop gives leadership away at once (the lease is revoked)
    assert second.terminate() == 0
    wait_for(first.is_leader, 10, "the old leader to lead again after a clean handover")
    assert group_state(first)["masterEpoch"] == after["masterEpoch"]
