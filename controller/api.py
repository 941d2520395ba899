"""The controller's HTTP API. Issue #2 brings routes; replica management arrives with issue #5."""

from __future__ import annotations

from aiohttp import web

from ferrymq.common.http import json_ok
from ferrymq.common.limits import check_topic
from ferrymq.controller.routes import RouteTable


def route_routes(table: RouteTable) -> list[web.RouteDef]:
    async def get_route(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_topic(topic)
        return json_ok(table.route(topic))

    return [web.get("/v1/routes/{topic}", get_route)]
