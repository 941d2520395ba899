"""The broker's side of the controller API: register (getting a brokerId), heartbeat, alter the
SyncStateSet. A comma-separated controller list is tried in turn; redirects to the leader are followed."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp

from ferrymq.common.errors import FerryError

log = logging.getLogger(__name__)


class ControllerClient:
    def __init__(self, addresses: str, timeout_s: float = 3.0) -> None:
        self.urls = [a if a.startswith("http") else f"http://{a}" for a in addresses.split(",") if a.strip()]
        if not self.urls:
            raise ValueError("no controller address given")
        self._preferred = 0
        self._session: aiohttp.ClientSession | None = None
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        """Call the leading controller; FerryError with the controller's code on an error answer."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        last: Exception | None = None
        n = len(self.urls)
        for i in range(n):
            idx = (self._preferred + i) % n
            try:
                async with self._session.request(method, self.urls[idx] + path, json=body,
                                                 allow_redirects=True) as resp:
                    payload = await resp.json(content_type=None)
                    if resp.status == 503 and isinstance(payload, dict) and \
                            payload.get("error", {}).get("code") == "NOT_LEADER":
                        last = FerryError("NOT_LEADER", payload["error"].get("message", "not the leader"))
                        continue
                    self._preferred = idx
                    if resp.status >= 400:
                        err = (payload or {}).get("error", {}) if isinstance(payload, dict) else {}
                        raise FerryError(err.get("code", "SYSTEM_ERROR"), err.get("message", f"HTTP {resp.status}"))
                    return payload
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                last = exc
        raise FerryError("CONTROLLER_UNAVAILABLE", f"no controller answered: {last}")

    async def register(self, info: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", "/v1/brokers/register", info)

    async def heartbeat(self, beat: dict[str, Any]) -> dict[str, Any]:
        return await self.call("POST", "/v1/brokers/heartbeat", beat)

    async def alter_sync_state_set(self, group: str, master_id: int, master_epoch: int, ss_epoch: int,
                                   members: set[int]) -> dict[str, Any]:
        return await self.call("POST", f"/v1/groups/{group}/sync-state-set", {
            "masterId": master_id, "masterEpoch": master_epoch, "syncStateSetEpoch": ss_epoch,
            "syncStateSet": sorted(members),
        })
