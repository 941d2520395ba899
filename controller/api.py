"""The controller's HTTP API: broker registration and heartbeats, SyncStateSet changes, elections, group
state, routes, health and metrics.

Writes — and group reads, whose liveness facts only the leader has — are the leader's: a follower answers
them with a 307 redirect to the leader's URL (the same path), or 503 NOT_LEADER while no leader is known.
Routes, health and metrics are answered by every controller, followers from the stored state.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ferrymq.common.http import json_ok, read_json, read_model
from ferrymq.common.limits import check_group, check_topic
from ferrymq.controller.errors import ControllerError, invalid
from ferrymq.controller.replicas import GroupState, Statuses, electable, is_alive
from ferrymq.controller.routes import RouteTable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PERMS = {6: "RW", 4: "R", 2: "W", 0: "DENY"}


def route_routes(table: RouteTable) -> list[web.RouteDef]:
    """GET /v1/routes/{topic} from a route table (what ``ferrymq standalone`` serves)."""

    async def get_route(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_topic(topic)
        return json_ok(table.route(topic))

    return [web.get("/v1/routes/{topic}", get_route)]


# ---- payloads -------------------------------------------------------------------------------------------
class _Payload(BaseModel):
    # brokers may send more than this controller reads (newer brokers, extra diagnostics): ignore it
    model_config = ConfigDict(extra="ignore")


class RegisterRequest(_Payload):
    group: str
    name: str = Field(min_length=1, max_length=255)
    httpAddress: str
    tcpAddress: str = ""
    haAddress: str = ""
    brokerId: int | None = None
    electionPriority: int = 0

    @field_validator("group")
    @classmethod
    def _group(cls, v: str) -> str:
        check_group(v)
        return v


class TopicRoute(BaseModel):
    model_config = ConfigDict(extra="allow")
    readQueueNums: int = Field(ge=0)
    writeQueueNums: int = Field(ge=0)
    perm: str | int = "RW"

    @field_validator("perm")
    @classmethod
    def _perm(cls, v: str | int) -> str:
        if isinstance(v, int):
            if v not in PERMS:
                raise ValueError("perm is RW, R, W or DENY (or RocketMQ's 6, 4, 2, 0)")
            return PERMS[v]
        if v not in PERMS.values():
            raise ValueError("perm is RW, R, W or DENY")
        return v


class HeartbeatRequest(_Payload):
    group: str
    brokerId: int
    epoch: int = -1
    maxOffset: int = -1
    confirmOffset: int = -1
    electionPriority: int | None = None
    writable: bool | None = None
    topics: dict[str, TopicRoute] | None = None


class AlterSyncStateSetRequest(_Payload):
    masterId: int
    masterEpoch: int
    syncStateSetEpoch: int
    syncStateSet: list[int] = Field(min_length=1)


class ElectRequest(_Payload):
    brokerId: int | None = None
    wait: bool = False  # designateElect only: answer when the switch is over instead of 202 at once


# ---- views ----------------------------------------------------------------------------------------------
def group_view(gs: GroupState, statuses: Statuses, *, unclean: bool, leader: bool) -> dict[str, Any]:
    def addresses(broker_id: int) -> dict[str, Any]:
        r = gs.replicas[broker_id]
        return {"brokerId": r.broker_id, "name": r.name, "httpAddress": r.http_address,
                "tcpAddress": r.tcp_address, "haAddress": r.ha_address}

    replicas = []
    for bid in sorted(gs.replicas):
        st = statuses.get(bid)
        replicas.append({
            **addresses(bid),
            "alive": is_alive(statuses, bid),
            "maxOffset": st.max_offset if st else -1,
            "confirmOffset": st.confirm_offset if st else -1,
            "epoch": st.epoch if st else -1,
            "role": "master" if bid == gs.master_id else "slave",
            "electionPriority": (st.election_priority if st and st.election_priority is not None
                                 else gs.replicas[bid].election_priority),
        })
    sw = gs.switching
    return {
        "group": gs.group,
        "master": addresses(gs.master_id) if gs.master_id in gs.replicas else None,
        "masterEpoch": gs.master_epoch,
        "syncStateSet": sorted(gs.sync_state_set),
        "syncStateSetEpoch": gs.sync_state_set_epoch,
        "replicas": replicas,
        # a follower has no liveness facts; it can only say whether a master is recorded
        "electable": electable(gs, statuses, unclean=unclean) if leader else gs.master_id is not None,
        "switching": None if sw is None else {"from": sw.from_id, "to": sw.to_id, "deadlineMs": sw.deadline_ms},
    }


# ---- handlers -------------------------------------------------------------------------------------------
def controller_routes(service: Any) -> list[web.RouteDef]:
    """The controller's endpoints; ``service`` is a ControllerService, ``metrics`` rendered by the caller."""

    def leader_only(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            if service.is_leader:
                return await handler(request)
            leader = service.leader_url()
            body = {"error": {"code": "NOT_LEADER", "message": "this controller is not the leader",
                              "leader": leader}}
            if leader:
                raise web.HTTPTemporaryRedirect(f"{leader.rstrip('/')}{request.path_qs}", text=json_dumps(body),
                                                content_type="application/json")
            return web.json_response(body, status=503)

        return wrapped

    def view(gs: GroupState) -> dict[str, Any]:
        return group_view(gs, service.statuses(gs.group), unclean=service.unclean, leader=service.is_leader)

    def group_param(request: web.Request) -> str:
        name = request.match_info["group"]
        check_group(name)
        return name

    @leader_only
    async def register(request: web.Request) -> web.Response:
        req = await read_model(request, RegisterRequest)
        broker_id, gs = await service.register(
            req.group, req.name, http_address=req.httpAddress, tcp_address=req.tcpAddress,
            ha_address=req.haAddress, broker_id=req.brokerId, election_priority=req.electionPriority)
        return json_ok({"brokerId": broker_id, "group": view(gs)})

    @leader_only
    async def heartbeat(request: web.Request) -> web.Response:
        req = await read_model(request, HeartbeatRequest)
        topics = None if req.topics is None else {t: cfg.model_dump() for t, cfg in req.topics.items()}
        for t in topics or ():
            check_topic(t)
        gs = await service.heartbeat(
            req.group, req.brokerId, epoch=req.epoch, max_offset=req.maxOffset, confirm_offset=req.confirmOffset,
            election_priority=req.electionPriority, writable=req.writable, topics=topics)
        is_master = gs.master_id == req.brokerId
        switching_away = gs.switching is not None and gs.switching.from_id == req.brokerId
        return json_ok({**view(gs), "brokerId": req.brokerId, "role": "master" if is_master else "slave",
                        "writable": is_master and not switching_away})

    @leader_only
    async def get_group(request: web.Request) -> web.Response:
        name = group_param(request)
        gs = service.groups.get(name)
        if gs is None:
            raise ControllerError("GROUP_NOT_FOUND", f"no broker group {name!r} has registered")
        return json_ok(view(gs))

    @leader_only
    async def list_groups(request: web.Request) -> web.Response:
        return json_ok({"groups": [view(gs) for _, gs in sorted(service.groups.items())]})

    @leader_only
    async def alter_sync_state_set(request: web.Request) -> web.Response:
        name = group_param(request)
        req = await read_model(request, AlterSyncStateSetRequest)
        gs = await service.alter_sync_state_set(name, master_id=req.masterId, master_epoch=req.masterEpoch,
                                                sync_state_set_epoch=req.syncStateSetEpoch,
                                                sync_state_set=req.syncStateSet)
        return json_ok({"syncStateSet": sorted(gs.sync_state_set), "syncStateSetEpoch": gs.sync_state_set_epoch})

    @leader_only
    async def elect(request: web.Request) -> web.Response:
        name = group_param(request)
        # an empty body means "re-run the election", like {"brokerId": null}
        raw = await read_json(request) if request.can_read_body else None
        raw = {} if raw is None else raw
        if not isinstance(raw, dict):
            raise invalid("the body must be a JSON object")
        req = ElectRequest.model_validate(raw) if raw else ElectRequest()
        gs = await service.elect(name, req.brokerId)
        if req.brokerId is None or gs.switching is None:
            return json_ok(view(gs))
        if not req.wait:
            return json_ok({"switching": view(gs)["switching"], "group": view(gs)}, status=202)
        gs = await service.wait_switch(name, req.brokerId)
        if gs.master_id != req.brokerId:
            raise ControllerError("SWITCH_ABANDONED",
                                  f"group {name!r}: broker {req.brokerId} did not catch up with master "
                                  f"{gs.master_id} within {service.config.switch_timeout} ms", group=view(gs))
        return json_ok(view(gs))

    async def get_route(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_topic(topic)
        await service.refresh_if_follower()
        return json_ok(service.routes.route(topic))

    async def health(request: web.Request) -> web.Response:
        await service.refresh_if_follower()
        return json_ok({"status": "ok", "leader": service.is_leader, "leaderAddress": service.leader_url(),
                        "groupsWithoutMaster": service.groups_without_master()})

    return [
        web.post("/v1/brokers/register", register),
        web.post("/v1/brokers/heartbeat", heartbeat),
        web.get("/v1/groups", list_groups),
        web.get("/v1/groups/{group}", get_group),
        web.post("/v1/groups/{group}/sync-state-set", alter_sync_state_set),
        web.post("/v1/groups/{group}/elect", elect),
        web.get("/v1/routes/{topic}", get_route),
        web.get("/v1/health", health),
    ]


def json_dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
