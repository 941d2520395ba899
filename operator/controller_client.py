"""Thin client of the FerryMQ controller's HTTP API (port 9876)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from ferrymq.operator.http import ApiError, request_json

__all__ = ["ApiError", "ControllerClient"]


class ControllerClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session

    async def group(self, group: str) -> dict[str, Any]:
        """GET /v1/groups/{group}: master, masterEpoch, syncStateSet, replicas, electable."""
        return await request_json(self.session, "GET", f"{self.base_url}/v1/groups/{quote(group, safe='')}")

    async def elect(self, group: str, broker_id: int) -> dict[str, Any]:
        """POST /v1/groups/{group}/elect: graceful switch of the master to broker_id."""
        return await request_json(
            self.session,
            "POST",
            f"{self.base_url}/v1/groups/{quote(group, safe='')}/elect",
            body={"brokerId": broker_id},
        )

    async def route(self, topic: str) -> dict[str, Any]:
        return await request_json(self.session, "GET", f"{self.base_url}/v1/routes/{quote(topic, safe='')}")

    async def health(self) -> dict[str, Any]:
        return await request_json(self.session, "GET", f"{self.base_url}/v1/health")
