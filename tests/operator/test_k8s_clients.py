"""The controller and broker admin clients against small aiohttp servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from ferrymq.operator.broker_admin import BrokerAdmin
from ferrymq.operator.controller_client import ControllerClient
from ferrymq.operator.http import ApiError, request_json


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def make_app() -> web.Application:
    topics: dict[str, dict[str, Any]] = {}
    group = {
        "group": "bg",
        "master": {"brokerId": 1, "name": "bg-0", "httpAddress": "bg-0.h:8080"},
        "masterEpoch": 2,
        "syncStateSet": [1, 2],
        "syncStateSetEpoch": 3,
        "replicas": [],
        "electable": True,
    }

    async def get_group(req: web.Request) -> web.Response:
        if req.match_info["g"] != "bg":
            return error(404, "GROUP_NOT_EXIST", "no such group")
        return web.json_response(group)

    async def elect(req: web.Request) -> web.Response:
        body = await req.json()
        if body["brokerId"] not in group["syncStateSet"]:
            return error(409, "NOT_IN_SYNC_STATE_SET", f"broker {body['brokerId']} is not in sync")
        group["master"] = {"brokerId": body["brokerId"], "name": f"bg-{body['brokerId'] - 1}"}
        group["masterEpoch"] += 1
        return web.json_response(group)

    async def put_topic(req: web.Request) -> web.Response:
        body = await req.json()
        if body["readQueueNums"] > 64:
            return error(400, "MESSAGE_ILLEGAL", "too many queues")
        topics[req.match_info["t"]] = body
        return web.json_response(body)

    async def get_topic(req: web.Request) -> web.Response:
        t = req.match_info["t"]
        if t not in topics:
            return error(404, "TOPIC_NOT_EXIST", t)
        return web.json_response({**topics[t], "queues": [{"queueId": 0, "minOffset": 0, "maxOffset": 3}]})

    async def delete_topic(req: web.Request) -> web.Response:
        if topics.pop(req.match_info["t"], None) is None:
            return error(404, "TOPIC_NOT_EXIST", "gone")
        return web.Response(status=204)

    async def groups(req: web.Request) -> web.Response:
        return web.json_response({"groups": {"cg": {"0": 3, "1": 2}}})

    async def slow(req: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    async def not_json(req: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>")

    async def health(req: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/v1/groups/{g}", get_group)
    app.router.add_post("/v1/groups/{g}/elect", elect)
    app.router.add_put("/v1/topics/{t}", put_topic)
    app.router.add_get("/v1/topics/{t}", get_topic)
    app.router.add_delete("/v1/topics/{t}", delete_topic)
    app.router.add_get("/v1/topics/{t}/groups", groups)
    app.router.add_get("/slow", slow)
    app.router.add_get("/html", not_json)
    app.router.add_get("/v1/health", health)
    return app


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    srv = TestServer(make_app(), host="127.0.0.1")
    await srv.start_server()
    async with aiohttp.ClientSession() as session:
        yield str(srv.make_url("")).rstrip("/"), session
    await srv.close()


async def test_controller_group_and_elect(server: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = server
    ctl = ControllerClient(url + "/", session)
    assert (await ctl.group("bg"))["masterEpoch"] == 2
    state = await ctl.elect("bg", 2)
    assert state["master"]["name"] == "bg-1" and state["masterEpoch"] == 3
    assert (await ctl.health())["status"] == "ok"


async def test_controller_errors_carry_contract_codes(server: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = server
    ctl = ControllerClient(url, session)
    with pytest.raises(ApiError) as info:
        await ctl.elect("bg", 3)
    assert (info.value.status, info.value.code) == (409, "NOT_IN_SYNC_STATE_SET") and info.value.retriable
    with pytest.raises(ApiError) as info:
        await ctl.group("nope")
    assert info.value.code == "GROUP_NOT_EXIST"


async def test_broker_admin_topic_lifecycle(server: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = server
    admin = BrokerAdmin(url, session)
    assert await admin.get_topic("orders") is None
    await admin.put_topic("orders", {"readQueueNums": 8, "writeQueueNums": 8, "perm": "RW"})
    got = await admin.get_topic("orders")
    assert got is not None and got["readQueueNums"] == 8 and got["queues"][0]["maxOffset"] == 3
    assert await admin.consumer_offsets("orders") == {"cg": {0: 3, 1: 2}}
    await admin.delete_topic("orders")
    await admin.delete_topic("orders")  # idempotent: TOPIC_NOT_EXIST is fine


async def test_broker_rejection_is_not_retriable(server: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = server
    with pytest.raises(ApiError) as info:
        await BrokerAdmin(url, session).put_topic("t", {"readQueueNums": 999, "writeQueueNums": 1})
    assert info.value.code == "MESSAGE_ILLEGAL" and not info.value.retriable


async def test_timeouts_and_unreachable_become_api_errors(server: tuple[str, aiohttp.ClientSession]) -> None:
    url, session = server
    with pytest.raises(ApiError) as info:
        await request_json(session, "GET", url + "/slow", client_timeout=aiohttp.ClientTimeout(total=0.2))
    assert info.value.status == 0 and info.value.retriable
    with pytest.raises(ApiError) as info:
        await request_json(
            session, "GET", "http://127.0.0.1:9/v1/health", client_timeout=aiohttp.ClientTimeout(total=2)
        )
    assert info.value.code == "UNREACHABLE"
    with pytest.raises(ApiError) as info:
        await request_json(session, "GET", url + "/html")
    assert info.value.status == 502 and info.value.code == "HTTP_ERROR" and "bad gateway" in info.value.message
