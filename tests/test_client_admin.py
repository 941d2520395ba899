"""Admin against a controller's URL (real processes): topic changes fan out to the master of every
broker group (or of the one named), slaves copy them, a single broker's URL still works, and a group
without master refuses changes instead of half-applying them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ReplicaProcess, wait_until
from test_failover import BROKER_CONFIG, GROUP, Cluster

from ferrymq.client import Admin, BrokerError, ClientError

OTHER = "g2"


@pytest.fixture
def groups(tmp_path: Path) -> Iterator[tuple[Cluster, ReplicaProcess]]:
    """Group g1 with a master and a slave, and a one-replica group g2, on one controller."""
    cluster = Cluster(tmp_path, n=2)
    solo = ReplicaProcess(tmp_path, "solo", OTHER, cluster.controller.url, config=BROKER_CONFIG).start()
    try:
        cluster.wait_master()
        cluster.wait_in_sync(2)
        wait_until(lambda: cluster.controller.call("GET", f"/v1/groups/{OTHER}")[1].get("master"), 20, 0.05,
                   "g2's master")
        yield cluster, solo
    finally:
        for r in [*cluster.replicas, solo]:
            r.kill9()
        cluster.controller.stop()


def _topic(replica: ReplicaProcess, name: str) -> dict[str, Any] | None:
    status, body = replica.call("GET", f"/v1/topics/{name}")
    return body if status == 200 else None


@pytest.mark.slow
def test_admin_via_the_controller_reaches_every_groups_master_and_slaves_follow(
        groups: tuple[Cluster, ReplicaProcess]) -> None:
    cluster, solo = groups
    master = cluster.wait_master()
    slave = next(r for r in cluster.replicas if r is not master)
    with Admin(cluster.controller.url) as admin:
        desc = admin.create_topic("everywhere", read_queues=3, write_queues=2)
        assert (desc["readQueueNums"], desc["writeQueueNums"]) == (3, 2)
        assert sorted(desc["brokerGroups"]) == [GROUP, OTHER]
        assert len(desc["brokerGroups"][GROUP]["queues"]) == 3
        assert _topic(master, "everywhere") is not None and _topic(solo, "everywhere") is not None
        wait_until(lambda: _topic(slave, "everywhere"), 10, 0.1, "the slave to copy the topic")
        # the controller routes it once the masters report it
        wait_until(lambda: len(cluster.controller.call("GET", "/v1/routes/everywhere")[1].get("brokerGroups", []))
                   == 2, 10, 0.1, "the route of both groups")

        only = admin.create_topic("only-g2", read_queues=1, write_queues=1, group=OTHER)
        assert list(only["brokerGroups"]) == [OTHER]
        assert _topic(master, "only-g2") is None and _topic(solo, "only-g2") is not None

        upd = admin.update_topic("everywhere", read_queues=4)
        assert {g: d["readQueueNums"] for g, d in upd["brokerGroups"].items()} == {GROUP: 4, OTHER: 4}
        wait_until(lambda: (_topic(slave, "everywhere") or {}).get("readQueueNums") == 4, 10, 0.1,
                   "the slave to copy the change")

        with pytest.raises(ClientError) as err:
            admin.create_topic("nowhere", group="no-such-group")
        assert err.value.code == "INVALID_REQUEST"

        admin.delete_topic("everywhere", group=GROUP)
        assert _topic(master, "everywhere") is None and _topic(solo, "everywhere") is not None
        assert list(admin.describe_topic("everywhere")["brokerGroups"]) == [OTHER]
        admin.delete_topic("everywhere")
        with pytest.raises(BrokerError) as err2:
            admin.describe_topic("everywhere")
        assert err2.value.code == "TOPIC_NOT_EXIST"
        wait_until(lambda: _topic(slave, "everywhere") is None, 10, 0.1, "the slave to drop the topic")

    # One broker's own URL: the master takes changes, a slave answers reads and names its refusal.
    with Admin(master.url) as on_master:
        assert on_master.create_topic("direct", read_queues=2, write_queues=2)["brokerGroups"][GROUP]
    wait_until(lambda: _topic(slave, "direct"), 10, 0.1, "the slave to copy the topic")
    with Admin(slave.url) as on_slave:
        assert on_slave.describe_topic("direct")["readQueueNums"] == 2
        with pytest.raises(BrokerError) as err3:
            on_slave.create_topic("refused")
        assert err3.value.code == "SERVICE_NOT_AVAILABLE"


@pytest.mark.slow
def test_admin_refuses_changes_while_a_group_has_no_master(groups: tuple[Cluster, ReplicaProcess]) -> None:
    cluster, solo = groups
    master = cluster.wait_master()
    slave = next(r for r in cluster.replicas if r is not master)
    with Admin(cluster.controller.url) as admin:
        admin.create_topic("kept", read_queues=2, write_queues=2)
        wait_until(lambda: _topic(slave, "kept"), 10, 0.1, "the slave to copy the topic")
        slave.pause()  # no candidate once the master dies: the group stays without master
        master.kill9()
        try:
            wait_until(lambda: cluster.group().get("master") is None, 20, 0.05, "the group to lose its master")
            with pytest.raises(BrokerError) as err:
                admin.create_topic("half", read_queues=1, write_queues=1)
            assert err.value.code == "SERVICE_NOT_AVAILABLE" and GROUP in err.value.message
            assert _topic(solo, "half") is None  # nothing was changed anywhere
        finally:
            slave.resume()
        wait_until(lambda: cluster.group().get("master"), 20, 0.05, "the slave to be elected")
        # described by the new master: the topic survived the failover
        assert admin.describe_topic("kept")["brokerGroups"][GROUP]["readQueueNums"] == 2
