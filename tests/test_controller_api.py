"""The controller's HTTP API and decisions loop in-process: a real file store in a temp dir, a real aiohttp
server, and a hand-driven clock so heartbeat expiry and switch deadlines are exact rather than slept for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from ferrymq.common.http import error_middleware
from ferrymq.controller.api import controller_routes
from ferrymq.controller.config import ControllerConfig
from ferrymq.controller.metrics import metrics_route
from ferrymq.controller.service import ControllerService
from ferrymq.controller.stores.base import StoreUnavailable
from ferrymq.controller.stores.file import FileStore

TIMEOUT_MS = 1000
TOPICS = {"orders": {"readQueueNums": 4, "writeQueueNums": 4, "perm": "RW"}}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Harness:
    def __init__(self, directory: Path, clock: Clock, unclean: bool = False) -> None:
        self.directory = directory
        self.clock = clock
        cfg = ControllerConfig(store=f"file://{directory}", controller_broker_heartbeat_timeout=TIMEOUT_MS,
                               scan_interval=3_600_000, switch_timeout=2000, enable_elect_unclean_master=unclean)
        self.service = ControllerService(cfg, FileStore(directory, "http://controller.test"), clock=clock,
                                         wall_ms=lambda: int(clock.t * 1000))
        app = web.Application(middlewares=[error_middleware])
        app.add_routes(controller_routes(self.service))
        app.add_routes([metrics_route(self.service)])
        self.client = TestClient(TestServer(app))

    async def start(self) -> Harness:
        await self.client.start_server()
        await self.service.start()
        for _ in range(200):
            if self.service.is_leader:
                return self
            await asyncio.sleep(0.01)
        raise AssertionError("the file-store controller never became leader")

    async def stop(self) -> None:
        await self.client.close()
        await self.service.stop()

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any]:
        kwargs: dict[str, Any] = {"data": raw} if raw is not None else {"json": body} if body is not None else {}
        resp = await self.client.request(method, path, **kwargs)
        text = await resp.text()
        return resp.status, (await resp.json() if resp.content_type == "application/json" else text)

    async def register(self, name: str, group: str = "g", broker_id: int | None = None, prio: int = 0) -> int:
        status, body = await self.call("POST", "/v1/brokers/register", {
            "group": group, "name": name, "httpAddress": f"{name}:8080", "tcpAddress": f"{name}:10911",
            "haAddress": f"{name}:10912", "brokerId": broker_id, "electionPriority": prio})
        assert status == 200, body
        return int(body["brokerId"])

    async def beat(self, broker_id: int, *, group: str = "g", offset: int = 0, epoch: int = 1,
                   writable: bool | None = True, topics: dict[str, Any] | None = None) -> tuple[int, Any]:
        return await self.call("POST", "/v1/brokers/heartbeat", {
            "group": group, "brokerId": broker_id, "epoch": epoch, "maxOffset": offset, "confirmOffset": offset,
            "writable": writable, "topics": topics})

    async def group(self, group: str = "g") -> dict[str, Any]:
        status, body = await self.call("GET", f"/v1/groups/{group}")
        assert status == 200, body
        return body

    async def in_sync(self, *ids: int, group: str = "g") -> dict[str, Any]:
        g = await self.group(group)
        status, body = await self.call("POST", f"/v1/groups/{group}/sync-state-set", {
            "masterId": g["master"]["brokerId"], "masterEpoch": g["masterEpoch"],
            "syncStateSetEpoch": g["syncStateSetEpoch"], "syncStateSet": list(ids)})
        assert status == 200, body
        return body


@pytest.fixture
async def ctl(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await Harness(tmp_path / "state", Clock()).start()
    yield h
    await h.stop()


async def three_in_sync(h: Harness) -> None:
    for name in ("a", "b", "c"):
        await h.register(name)
    for b in (1, 2, 3):
        await h.beat(b, offset=100)
    await h.in_sync(1, 2, 3)


# ---- registration and heartbeats ------------------------------------------------------------------------
async def test_register_assigns_ids_and_first_replica_is_master(ctl: Harness) -> None:
    assert [await ctl.register(n) for n in ("a", "b")] == [1, 2]
    assert await ctl.register("a") == 1
    assert await ctl.register("b", broker_id=2) == 2
    g = await ctl.group()
    assert g["master"]["name"] == "a" and g["masterEpoch"] == 1
    assert g["syncStateSet"] == [1] and g["syncStateSetEpoch"] == 1
    assert [(r["brokerId"], r["role"], r["alive"]) for r in g["replicas"]] == [(1, "master", True),
                                                                             (2, "slave", True)]
    assert g["electable"] is True and g["switching"] is None
    status, body = await ctl.call("GET", "/v1/groups")
    assert status == 200 and [x["group"] for x in body["groups"]] == ["g"]


async def test_heartbeat_answers_the_group_state_and_role(ctl: Harness) -> None:
    await ctl.register("a")
    await ctl.register("b")
    status, body = await ctl.beat(2, offset=42)
    assert status == 200
    assert body["role"] == "slave" and body["writable"] is False and body["master"]["brokerId"] == 1
    assert next(r for r in body["replicas"] if r["brokerId"] == 2)["maxOffset"] == 42
    status, body = await ctl.beat(1)
    assert body["role"] == "master" and body["writable"] is True


async def test_unknown_broker_must_register_again(ctl: Harness) -> None:
    await ctl.register("a")
    for broker_id, group in ((7, "g"), (1, "other")):
        status, body = await ctl.beat(broker_id, group=group)
        assert status == 404 and body["error"]["code"] == "BROKER_NOT_REGISTERED"
    status, body = await ctl.call("GET", "/v1/groups/nope")
    assert status == 404 and body["error"]["code"] == "GROUP_NOT_FOUND"


@pytest.mark.parametrize(("path", "payload"), [
    ("/v1/brokers/register", {"group": "g"}),
    ("/v1/brokers/register", {"group": "bad group!", "name": "a", "httpAddress": "x"}),
    ("/v1/brokers/register", {"group": "g", "name": "a", "httpAddress": "x", "brokerId": "one"}),
    ("/v1/brokers/register", {"group": "g", "name": "a", "httpAddress": "x", "brokerId": 0}),
    ("/v1/brokers/heartbeat", {"group": "g", "brokerId": 1, "topics": {"t": {"readQueueNums": -1,
                                                                              "writeQueueNums": 1}}}),
    ("/v1/brokers/heartbeat", {"group": "g", "brokerId": 1, "topics": {"bad topic": {"readQueueNums": 1,
                                                                                      "writeQueueNums": 1}}}),
    ("/v1/brokers/heartbeat", {"group": "g", "brokerId": 1, "topics": {"t": {"readQueueNums": 1,
                                                                              "writeQueueNums": 1, "perm": 7}}}),
    ("/v1/groups/g/sync-state-set", {"masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1,
                                     "syncStateSet": []}),
    ("/v1/groups/g/elect", [1]),
])
async def test_bad_requests_get_the_contract_error_body(ctl: Harness, path: str, payload: Any) -> None:
    await ctl.register("a")
    status, body = await ctl.call("POST", path, payload)
    assert status in (400, 404) and status != 500, body
    assert body["error"]["code"] in ("INVALID_REQUEST", "TOPIC_ILLEGAL") and body["error"]["message"]


async def test_malformed_json_is_a_400(ctl: Harness) -> None:
    status, body = await ctl.call("POST", "/v1/brokers/heartbeat", raw=b"{nope")
    assert status == 400 and body["error"]["code"] == "INVALID_REQUEST"


# ---- SyncStateSet -------------------------------------------------------------------------------------
async def test_sync_state_set_changes_are_fenced(ctl: Harness) -> None:
    await ctl.register("a")
    await ctl.register("b")
    assert await ctl.in_sync(1, 2) == {"syncStateSet": [1, 2], "syncStateSetEpoch": 2}
    path = "/v1/groups/g/sync-state-set"
    stale = {"masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": 1, "syncStateSet": [1]}
    status, body = await ctl.call("POST", path, stale)
    assert status == 409 and body["error"]["code"] == "FENCED_SYNC_STATE_SET_EPOCH"
    status, body = await ctl.call("POST", path, {**stale, "masterId": 2, "syncStateSetEpoch": 2})
    assert status == 409 and body["error"]["code"] == "FENCED_MASTER_EPOCH"
    status, body = await ctl.call("POST", path, {**stale, "masterEpoch": 0, "syncStateSetEpoch": 2})
    assert status == 409 and body["error"]["code"] == "FENCED_MASTER_EPOCH"
    status, body = await ctl.call("POST", path, {**stale, "syncStateSetEpoch": 2, "syncStateSet": [1, 2, 5]})
    assert status == 400


async def test_dead_broker_cannot_be_added_but_can_be_removed(ctl: Harness) -> None:
    await ctl.register("a")
    await ctl.register("b")
    ctl.clock.advance(TIMEOUT_MS / 1000 + 0.1)
    await ctl.beat(1)  # the master stays alive, b has expired
    g = await ctl.group()
    body = {"masterId": 1, "masterEpoch": 1, "syncStateSetEpoch": g["syncStateSetEpoch"], "syncStateSet": [1, 2]}
    status, err = await ctl.call("POST", "/v1/groups/g/sync-state-set", body)
    assert status == 400 and "not alive" in err["error"]["message"]


# ---- elections ----------------------------------------------------------------------------------------
async def test_master_expiry_elects_the_most_up_to_date_in_sync_replica(ctl: Harness) -> None:
    await three_in_sync(ctl)
    ctl.clock.advance(0.6)
    await ctl.beat(2, offset=150)
    await ctl.beat(3, offset=180)
    ctl.clock.advance(0.6)  # a expired; b and c heard from 0.6 s ago
    await ctl.service.scan()
    g = await ctl.group()
    assert g["master"]["brokerId"] == 3
    assert (g["masterEpoch"], g["syncStateSet"], g["syncStateSetEpoch"]) == (2, [3], 3)
    # the old master comes back: it is a slave of the new one
    status, body = await ctl.beat(1, offset=100)
    assert status == 200
    assert body["role"] == "slave" and body["writable"] is False and body["master"]["brokerId"] == 3


async def test_no_electable_replica_leaves_the_group_without_master(ctl: Harness,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    await ctl.register("a")
    await ctl.register("b")  # never joined the SyncStateSet
    ctl.clock.advance(0.6)
    await ctl.beat(2)
    ctl.clock.advance(0.6)
    with caplog.at_level("ERROR", logger="ferrymq.controller"):
        await ctl.service.scan()
        await ctl.service.scan()
    g = await ctl.group()
    assert g["master"] is None and g["electable"] is False and g["masterEpoch"] == 2
    assert g["syncStateSet"] == [1]
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "has no master" in r.getMessage()]
    assert len(errors) == 1  # once per transition, not once per scan
    _, health = await ctl.call("GET", "/v1/health")
    assert health["groupsWithoutMaster"] == ["g"] and health["leader"] is True
    _, metrics = await ctl.call("GET", "/metrics")
    assert 'ferrymq_controller_group_has_master{group="g"} 0.0' in metrics
    assert 'ferrymq_controller_group_electable{group="g"} 0.0' in metrics
    # an explicit election changes nothing either
    status, body = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": None})
    assert status == 200 and body["master"] is None
    # the in-sync replica returns: it is master again, under a new epoch
    await ctl.beat(1)
    await ctl.service.scan()
    g = await ctl.group()
    assert g["master"]["brokerId"] == 1 and g["masterEpoch"] == 3
    _, health = await ctl.call("GET", "/v1/health")
    assert health["groupsWithoutMaster"] == []


async def test_unclean_election_picks_an_alive_replica_outside_the_set(tmp_path: Path) -> None:
    h = await Harness(tmp_path / "s", Clock(), unclean=True).start()
    try:
        await h.register("a")
        await h.register("b")
        h.clock.advance(0.6)
        await h.beat(2, offset=7)
        h.clock.advance(0.6)
        await h.service.scan()
        g = await h.group()
        assert g["master"]["brokerId"] == 2 and g["syncStateSet"] == [2] and g["masterEpoch"] == 2
    finally:
        await h.stop()


async def test_elect_null_keeps_a_live_master_and_replaces_a_dead_one(ctl: Harness) -> None:
    await three_in_sync(ctl)
    status, body = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": None})
    assert status == 200 and body["master"]["brokerId"] == 1 and body["masterEpoch"] == 1
    ctl.clock.advance(0.6)
    await ctl.beat(2, offset=100)
    ctl.clock.advance(0.6)
    status, body = await ctl.call("POST", "/v1/groups/g/elect")  # empty body = {"brokerId": null}
    assert status == 200 and body["master"]["brokerId"] == 2 and body["masterEpoch"] == 2


# ---- graceful switch ----------------------------------------------------------------------------------
async def test_graceful_switch(ctl: Harness) -> None:
    await three_in_sync(ctl)
    status, body = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": 2})
    assert status == 202 and body["switching"]["from"] == 1 and body["switching"]["to"] == 2
    # the old master is told to stop taking writes; until it says it did, nothing moves
    _, hb = await ctl.beat(1, offset=120, writable=True)
    assert hb["writable"] is False and hb["switching"]["to"] == 2
    await ctl.beat(2, offset=120)
    assert (await ctl.group())["master"]["brokerId"] == 1
    await ctl.beat(1, offset=130, writable=False)  # stopped, at offset 130
    await ctl.beat(2, offset=125)                  # still behind
    assert (await ctl.group())["master"]["brokerId"] == 1
    _, hb = await ctl.beat(2, offset=130)          # caught up: the switch completes
    assert hb["role"] == "master" and hb["writable"] is True
    g = await ctl.group()
    assert (g["masterEpoch"], g["syncStateSet"], g["syncStateSetEpoch"], g["switching"]) == (2, [2], 3, None)
    _, hb = await ctl.beat(1, offset=130, writable=False)
    assert hb["role"] == "slave"


async def test_graceful_switch_refusals(ctl: Harness) -> None:
    await ctl.register("a")
    await ctl.register("b")
    status, body = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": 2})  # b is not in sync
    assert status == 409 and body["error"]["code"] == "NOT_IN_SYNC_STATE_SET"
    await ctl.in_sync(1, 2)
    ctl.clock.advance(0.6)
    await ctl.beat(1)
    ctl.clock.advance(0.6)  # b expired
    status, body = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": 2})
    assert status == 409 and body["error"]["code"] == "NOT_IN_SYNC_STATE_SET"


async def test_graceful_switch_that_does_not_finish_is_abandoned(ctl: Harness) -> None:
    await three_in_sync(ctl)
    status, _ = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": 3})
    assert status == 202
    await ctl.beat(1, offset=200, writable=False)
    await ctl.beat(3, offset=150)  # never catches up
    ctl.clock.advance(2.1)
    for b in (1, 2, 3):
        await ctl.beat(b, offset=200 if b == 1 else 150, writable=b == 1)
    await ctl.service.scan()
    g = await ctl.group()
    assert g["switching"] is None and g["master"]["brokerId"] == 1 and g["masterEpoch"] == 1
    _, hb = await ctl.beat(1, offset=200)
    assert hb["writable"] is True  # the old master takes writes again


async def test_graceful_switch_can_wait_for_the_outcome(ctl: Harness) -> None:
    await three_in_sync(ctl)

    async def brokers() -> None:
        await asyncio.sleep(0.05)
        await ctl.beat(1, offset=300, writable=False)
        await ctl.beat(2, offset=300)

    task = asyncio.create_task(brokers())
    status, body = await ctl.call("POST", "/v1/groups/g/elect", {"brokerId": 2, "wait": True})
    await task
    assert status == 200 and body["master"]["brokerId"] == 2 and body["switching"] is None


# ---- routes, restart, exclusivity ---------------------------------------------------------------------
async def test_routes_come_from_the_masters_heartbeats(ctl: Harness) -> None:
    await three_in_sync(ctl)
    status, body = await ctl.call("GET", "/v1/routes/orders")
    assert status == 404 and body["error"]["code"] == "TOPIC_NOT_EXIST"
    await ctl.beat(2, topics={"ignored": {"readQueueNums": 1, "writeQueueNums": 1}})  # slaves do not route
    await ctl.beat(1, topics=TOPICS)
    status, body = await ctl.call("GET", "/v1/routes/orders")
    assert status == 200
    (entry,) = body["brokerGroups"]
    assert entry["group"] == "g" and entry["master"]["brokerId"] == 1
    assert entry["master"]["httpAddress"] == "a:8080" and entry["master"]["tcpAddress"] == "a:10911"
    assert sorted(s["brokerId"] for s in entry["slaves"]) == [2, 3]
    assert (entry["readQueueNums"], entry["writeQueueNums"], entry["perm"]) == (4, 4, "RW")
    assert (await ctl.call("GET", "/v1/routes/ignored"))[0] == 404
    # after a failover the route names the new master
    ctl.clock.advance(0.6)
    await ctl.beat(2, offset=100)
    ctl.clock.advance(0.6)
    await ctl.service.scan()
    _, body = await ctl.call("GET", "/v1/routes/orders")
    assert body["brokerGroups"][0]["master"]["brokerId"] == 2


async def test_file_store_restart_keeps_state(tmp_path: Path) -> None:
    clock = Clock()
    h = await Harness(tmp_path / "s", clock).start()
    await three_in_sync(h)
    await h.beat(1, topics=TOPICS)
    await h.call("POST", "/v1/groups/g/elect", {"brokerId": 2})
    before = await h.group()
    await h.stop()
    h2 = await Harness(tmp_path / "s", clock).start()
    try:
        after = await h2.group()
        for key in ("master", "masterEpoch", "syncStateSet", "syncStateSetEpoch", "switching"):
            assert after[key] == before[key], key
        assert [r["alive"] for r in after["replicas"]] == [True, True, True]  # one timeout of grace
        assert await h2.register("c") == 3
        assert (await h2.call("GET", "/v1/routes/orders"))[0] == 200
    finally:
        await h2.stop()


async def test_file_store_serves_one_controller(tmp_path: Path) -> None:
    first = FileStore(tmp_path / "s", "one")
    await first.open()
    second = FileStore(tmp_path / "s", "two")
    with pytest.raises(StoreUnavailable, match="in use by another controller"):
        await second.open()
    await first.close()
    await second.open()  # the lock goes with the process that held it
    await second.close()


async def test_metrics(ctl: Harness) -> None:
    await three_in_sync(ctl)
    status, text = await ctl.call("GET", "/metrics")
    assert status == 200
    for line in ("ferrymq_controller_is_leader 1.0", 'ferrymq_controller_group_has_master{group="g"} 1.0',
                 'ferrymq_controller_master_epoch{group="g"} 1.0',
                 'ferrymq_controller_sync_state_set_size{group="g"} 3.0',
                 'ferrymq_controller_alive_replicas{group="g"} 3.0'):
        assert line in text, line


def test_config_file_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text("controllerBrokerHeartbeatTimeout: 3000\nenableElectUncleanMaster: true\nswitchTimeout: 500\n"
                    "listen: 0.0.0.0:9876\n")
    cfg = ControllerConfig.from_file(path, controller_broker_heartbeat_timeout=1500, store="file:///x")
    assert cfg.controller_broker_heartbeat_timeout == 1500  # the flag wins
    assert cfg.enable_elect_unclean_master is True and cfg.switch_timeout == 500
    assert (cfg.listen_host, cfg.listen_port, cfg.store) == ("0.0.0.0", 9876, "file:///x")
    defaults = ControllerConfig()
    assert defaults.controller_broker_heartbeat_timeout == 10_000 and defaults.enable_elect_unclean_master is False
    path.write_text("noSuchSetting: 1\n")
    with pytest.raises(ValueError, match="noSuchSetting"):
        ControllerConfig.from_file(path)
