"""Thin client of a broker's topic admin API (the contract's HTTP API, port 8080)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from ferrymq.operator.http import ApiError, request_json

__all__ = ["ApiError", "BrokerAdmin"]


class BrokerAdmin:
    def __init__(self, base_url: str, session: aiohttp.ClientSession) -> None:
        self.base_url = base_url.rstrip("/")
        self.session = session

    def _topic(self, topic: str) -> str:
        return f"{self.base_url}/v1/topics/{quote(topic, safe='')}"

    async def get_topic(self, topic: str) -> dict[str, Any] | None:
        """The topic's config and queues, or None when the broker does not have it."""
        try:
            return await request_json(self.session, "GET", self._topic(topic))
        except ApiError as exc:
            if exc.status == 404 or exc.code == "TOPIC_NOT_EXIST":
                return None
            raise

    async def put_topic(self, topic: str, config: dict[str, Any]) -> dict[str, Any]:
        return await request_json(self.session, "PUT", self._topic(topic), body=config)

    async def delete_topic(self, topic: str) -> None:
        try:
            await request_json(self.session, "DELETE", self._topic(topic))
        except ApiError as exc:
            if exc.status != 404 and exc.code != "TOPIC_NOT_EXIST":
                raise

    async def consumer_offsets(self, topic: str) -> dict[str, dict[int, int]]:
        """Consumer group -> queueId -> committed offset (GET /v1/topics/{topic}/groups)."""
        data = await request_json(self.session, "GET", self._topic(topic) + "/groups") or {}
        return {
            str(group): {int(q): int(off) for q, off in (queues or {}).items()}
            for group, queues in (data.get("groups") or {}).items()
        }
