"""``ferrymq controller`` as a real process with the file store, driven by fake brokers over HTTP."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from controller_support import ControllerProcess, FakeBroker, wait_for

TOPICS = {"orders": {"readQueueNums": 2, "writeQueueNums": 2, "perm": "RW"}}


@pytest.fixture
def brokers() -> Iterator[list[FakeBroker]]:
    made: list[FakeBroker] = []
    yield made
    for b in made:
        b.stop()


def master_of(c: ControllerProcess, group: str = "g") -> int | None:
    status, body = c.call("GET", f"/v1/groups/{group}")
    assert status == 200, body
    return body["master"]["brokerId"] if body["master"] else None


@pytest.mark.parametrize("unclean", [False, True], ids=["unclean-off", "unclean-on"])
def test_unclean_election(tmp_path: Path, brokers: list[FakeBroker], unclean: bool) -> None:
    c = ControllerProcess(tmp_path, f"file://{tmp_path}/state", unclean=unclean).start()
    try:
        a = FakeBroker([c.url], "g", "a", max_offset=100, topics=TOPICS).start()
        b = FakeBroker([c.url], "g", "b", max_offset=60).start()  # never joins the SyncStateSet
        brokers += [a, b]
        assert master_of(c) == a.broker_id
        a.stop()  # the only in-sync replica dies
        if unclean:
            wait_for(lambda: master_of(c) == b.broker_id, 10, "the out-of-sync replica to be elected")
            _, g = c.call("GET", "/v1/groups/g")
            assert g["syncStateSet"] == [b.broker_id] and g["masterEpoch"] == 2
            assert c.health()["groupsWithoutMaster"] == []
        else:
            wait_for(lambda: c.health()["groupsWithoutMaster"] == ["g"], 10, "the group to lose its master")
            _, g = c.call("GET", "/v1/groups/g")
            assert g["master"] is None and g["electable"] is False
            assert g["syncStateSet"] == [a.broker_id]
            _, metrics = c.call("GET", "/metrics")
            assert 'ferrymq_controller_group_has_master{group="g"} 0.0' in metrics
            assert "has no master" in c.log()
            assert b.last is not None and b.last["writable"] is False  # b was never told to take writes
            _, route = c.call("GET", "/v1/routes/orders")
            assert route["brokerGroups"][0]["master"] is None
            a.start()  # the in-sync replica returns and is master again
            wait_for(lambda: master_of(c) == a.broker_id, 10, "the in-sync replica to be re-elected")
    finally:
        assert c.terminate() == 0


def test_restart_keeps_state_after_sigterm_and_kill9(tmp_path: Path, brokers: list[FakeBroker]) -> None:
    store = f"file://{tmp_path}/state"
    c = ControllerProcess(tmp_path, store).start()
    a = FakeBroker([c.url], "g", "a", max_offset=10, topics=TOPICS).start()
    b = FakeBroker([c.url], "g", "b", max_offset=10).start()
    brokers += [a, b]
    _, g = c.call("GET", "/v1/groups/g")
    assert c.call("POST", "/v1/groups/g/sync-state-set", {"masterId": 1, "masterEpoch": 1,
                                                          "syncStateSetEpoch": g["syncStateSetEpoch"],
                                                          "syncStateSet": [1, 2]})[0] == 200
    status, _ = c.call("POST", "/v1/groups/g/elect", {"brokerId": 2, "wait": True})  # fake a stops, b catches up
    assert status == 200
    wait_for(lambda: c.call("GET", "/v1/routes/orders")[0] == 200, 5, "the route")
    expected = {k: g2[k] for g2 in [c.call("GET", "/v1/groups/g")[1]]
                for k in ("master", "masterEpoch", "syncStateSet", "syncStateSetEpoch")}
    assert expected["masterEpoch"] == 2 and expected["master"]["brokerId"] == 2
    for stop in ("sigterm", "kill9"):
        if stop == "sigterm":
            assert c.terminate() == 0
        else:
            c.kill9()
        c = ControllerProcess(tmp_path, store, name=f"controller-{stop}").start()
        a.controllers = b.controllers = [c.url]
        _, g = c.call("GET", "/v1/groups/g")
        assert {k: g[k] for k in expected} == expected, stop
        assert c.call("GET", "/v1/routes/orders")[0] == 200
    # the brokers keep their ids when they register again
    assert a.register()["brokerId"] == 1 and b.register()["brokerId"] == 2
    assert c.terminate() == 0


def test_second_controller_on_the_same_file_store_refuses_to_start(tmp_path: Path) -> None:
    c = ControllerProcess(tmp_path, f"file://{tmp_path}/state").start()
    try:
        out = subprocess.run([sys.executable, "-m", "ferrymq", "controller", "--listen", "127.0.0.1:0",
                              "--store", f"file://{tmp_path}/state"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 1
        assert "in use by another controller" in out.stderr
        assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    finally:
        assert c.terminate() == 0


@pytest.mark.parametrize(("args", "needle"), [
    (["--listen", "nope", "--store", "file:///tmp/x"], "listen"),
    (["--listen", "127.0.0.1:0", "--store", "zk://x"], "unknown store scheme"),
    (["--listen", "127.0.0.1:0", "--store", "kubernetes://only-namespace"], "kubernetes://namespace/name"),
    (["--listen", "127.0.0.1:0", "--store", "file:///tmp/x", "--heartbeat-timeout-ms", "5"], "Heartbeat"),
])
def test_cli_errors_are_one_line(args: list[str], needle: str) -> None:
    out = subprocess.run([sys.executable, "-m", "ferrymq", "controller", *args], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 1, out
    assert needle.lower() in out.stderr.lower() and "Traceback" not in out.stderr
