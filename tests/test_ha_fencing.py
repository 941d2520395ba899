"""Controller mode, real processes: fencing of a paused master, minInSyncReplicas, graceful switch."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import wait_until
from test_failover import QUEUES, TOPIC, Cluster


def _send(replica, body: str) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    return replica.call("POST", f"/v1/topics/{TOPIC}/messages", {"body": body}, timeout=10)


def _send_to_master(cluster: Cluster, body: str, timeout: float = 10) -> tuple[int, dict]:
    """Send to whoever is master, retrying while mastership settles."""
    deadline = time.monotonic() + timeout
    while True:
        status, ans = _send(cluster.wait_master(), body)
        if status == 200 or time.monotonic() > deadline:
            return status, ans
        time.sleep(0.1)


def _create_topic(cluster: Cluster) -> None:
    master = cluster.wait_master()
    status, body = master.call("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": QUEUES, "writeQueueNums": QUEUES})
    assert status == 200, body


@pytest.mark.slow
def test_paused_master_cannot_take_writes_after_resuming(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    _create_topic(cluster)
    cluster.wait_in_sync(3)
    old = cluster.wait_master()
    assert _send(old, "before")[0] == 200
    old.pause()
    try:
        new = wait_until(lambda: (m := cluster.master()) is not None and m is not old and m, 20, 0.1, "a new master")
    finally:
        old.resume()
    # Right after waking up the old master still believes it is master; its lease has run out.
    status, body = _send(old, "from-the-past")
    assert status == 503, body
    assert body["error"]["code"] == "SERVICE_NOT_AVAILABLE"
    wait_until(lambda: old.call("GET", "/v1/health")[1].get("role") == "slave", 10, 0.1, "the old master to step down")
    assert _send_to_master(cluster, "after")[0] == 200
    assert cluster.wait_master() is new


@pytest.mark.slow
def test_min_in_sync_replicas_refuses_sends(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, n=2, broker_config={"minInSyncReplicas": 2})
    _create_topic(cluster)
    cluster.wait_in_sync(2)
    master = cluster.wait_master()
    assert _send(master, "ok")[0] == 200
    slave = next(r for r in cluster.replicas if r is not master)
    slave.stop()
    cluster.wait_in_sync(1, timeout=20)
    status, body = _send(master, "refused")
    assert status == 503 and body["error"]["code"] == "IN_SYNC_REPLICAS_NOT_ENOUGH", body
    slave.start()
    cluster.wait_in_sync(2, timeout=20)
    assert _send(master, "ok-again")[0] == 200


@pytest.mark.slow
def test_graceful_switch_hands_over_without_loss(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    _create_topic(cluster)
    cluster.wait_in_sync(3)
    old = cluster.wait_master()
    acked = []
    for i in range(30):
        status, body = _send(old, f"m{i}")
        assert status == 200, body
        acked.append((body["results"][0]["queueId"], body["results"][0]["queueOffset"], f"m{i}"))
    status, _ = old.call("PUT", f"/v1/groups/cg/offsets/{TOPIC}/0", {"offset": 3})
    assert status == 200
    target = next(r for r in cluster.replicas if r is not old)
    # Slaves copy topic configs and group offsets from the master (slaveSyncInterval).
    wait_until(lambda: target.call("GET", f"/v1/groups/cg/offsets/{TOPIC}/0")[1].get("offset") == 3, 10, 0.1,
               "the committed offset on the slave")
    group = cluster.group()
    target_id = next(r["brokerId"] for r in group["replicas"] if r["name"] == target.name)
    epoch = group["masterEpoch"]
    status, body = cluster.controller.call("POST", "/v1/groups/g1/elect", {"brokerId": target_id}, timeout=20)
    assert status in (200, 202), body
    wait_until(lambda: cluster.group()["master"] and cluster.group()["master"]["name"] == target.name, 20, 0.1,
               "the designated replica to become master")
    assert cluster.group()["masterEpoch"] == epoch + 1
    status, body = _send_to_master(cluster, "after-switch")
    assert status == 200, body
    new = cluster.wait_master()
    assert new is target
    for qid, qoff, text in acked:
        status, ans = new.call("GET", f"/v1/topics/{TOPIC}/queues/{qid}/messages?offset={qoff}&maxMessages=1")
        assert status == 200 and ans["messages"] and ans["messages"][0]["body"] == text
    wait_until(lambda: old.call("GET", "/v1/health")[1].get("role") == "slave", 10, 0.1, "the old master to follow")


@pytest.mark.slow
def test_topic_created_just_before_a_failover_exists_on_the_new_master(tmp_path: Path) -> None:
    # A long periodic sync: only the push over the replication link (or the promotion's restore of
    # topics it holds messages of) can bring the topic to the new master in time.
    cluster = Cluster(tmp_path, broker_config={"slaveSyncInterval": 60_000})
    cluster.wait_in_sync(3)
    old = cluster.wait_master()
    status, body = old.call("PUT", "/v1/topics/fresh", {"readQueueNums": 2, "writeQueueNums": 2})
    assert status == 200, body
    status, body = old.call("POST", "/v1/topics/fresh/messages", {"body": "kept", "queueId": 1})
    assert status == 200, body
    old.kill9()
    new = wait_until(lambda: (m := cluster.master()) is not None and m is not old and m, 20, 0.1, "a new master")
    status, body = new.call("GET", "/v1/topics/fresh")
    assert status == 200 and body["readQueueNums"] == 2, body
    msgs = wait_until(lambda: new.call("GET", "/v1/topics/fresh/queues/1/messages?offset=0")[1].get("messages"),
                      10, 0.1, "the message on the new master")
    assert msgs[0]["body"] == "kept"


@pytest.mark.slow
def test_an_idle_group_keeps_its_sync_state_set(tmp_path: Path) -> None:
    # haMaxTimeSlaveNotCatchup is 3 s in these tests: idle slaves must still count as caught up.
    cluster = Cluster(tmp_path)
    _create_topic(cluster)
    cluster.wait_in_sync(3)
    assert _send_to_master(cluster, "one")[0] == 200
    time.sleep(5)
    assert len(cluster.group()["syncStateSet"]) == 3
