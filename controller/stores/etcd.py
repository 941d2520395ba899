"""etcd v3 backend, through etcd's JSON gRPC gateway (``/v3/...``) with aiohttp: no extra dependency.

Two keys under a prefix: ``<prefix>/leader`` holds the leader's URL and is attached to that controller's
lease, created only by a transaction that finds it absent (create_revision == 0); ``<prefix>/state`` holds
the state document. Every state write is one transaction comparing the state's mod_revision with the one
read *and* the leader key's create_revision with the one this controller created — so a controller that
lost its lease (paused, partitioned) cannot write even if it still believes it leads, and two leaders can
never both decide. Keys and values travel base64-encoded; etcd sends 64-bit integers as strings and leaves
out fields at their default (``succeeded`` false, ``TTL`` 0).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from ferrymq.controller.stores.base import ControllerStore, StoreConflict, StoreUnavailable, Versioned

log = logging.getLogger(__name__)
DEFAULT_PREFIX = "/ferrymq/controller"
# Leadership is believed for this share of the lease after a successful renewal was *sent*: the lease
# itself runs out a full TTL after etcd handled it, so the margin absorbs clock-rate differences.
LEASE_TRUST = 0.8


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


class EtcdStore(ControllerStore):
    def __init__(self, endpoints: Sequence[str], identity: str, *, prefix: str = DEFAULT_PREFIX,
                 lease_ttl_s: int = 10, request_timeout_s: float = 2.0) -> None:
        super().__init__(identity)
        if not endpoints:
            raise ValueError("etcd store needs at least one endpoint")
        self.endpoints = [e if "://" in e else f"http://{e}" for e in endpoints]
        self.prefix = prefix.rstrip("/") or DEFAULT_PREFIX
        self.lease_ttl_s = lease_ttl_s
        self.request_timeout_s = min(request_timeout_s, max(0.5, lease_ttl_s / 3))
        self._leader_key = _b64(f"{self.prefix}/leader")
        self._state_key = _b64(f"{self.prefix}/state")
        self._session: aiohttp.ClientSession | None = None
        self._current = 0  # index of the endpoint that answered last
        self._lease_id: int | None = None
        self._leader_rev: int | None = None  # create_revision of the leader key this controller wrote
        self._valid_until = 0.0
        self._leader_addr: str | None = None

    # ---- transport --------------------------------------------------------------------------------------
    async def open(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.request_timeout_s))

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the first endpoint that answers, starting with the one that answered last."""
        if self._session is None:
            raise StoreUnavailable("etcd store is not open")
        errors = []
        for i in range(len(self.endpoints)):
            idx = (self._current + i) % len(self.endpoints)
            url = f"{self.endpoints[idx]}{path}"
            try:
                async with self._session.post(url, json=body) as resp:
                    payload = await resp.json(content_type=None)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                errors.append(f"{self.endpoints[idx]}: {type(exc).__name__} {exc}".strip())
                continue
            self._current = idx
            if resp.status != 200 or not isinstance(payload, dict) or "error" in payload:
                msg = payload.get("message") or payload.get("error") if isinstance(payload, dict) else payload
                raise StoreUnavailable(f"etcd {path} answered {resp.status}: {msg}")
            return payload
        raise StoreUnavailable("no etcd endpoint answered: " + "; ".join(errors))

    async def _range(self, key: str) -> dict[str, Any] | None:
        resp = await self._call("/v3/kv/range", {"key": key})
        kvs = resp.get("kvs") or []
        return kvs[0] if kvs else None

    # ---- state ------------------------------------------------------------------------------------------
    async def load(self) -> Versioned:
        kv = await self._range(self._state_key)
        if kv is None:
            return Versioned(None, 0)
        return Versioned(json.loads(_unb64(kv.get("value", ""))), int(kv["mod_revision"]))

    async def compare_and_swap(self, expected_version: Any, data: dict[str, Any]) -> Any:
        if not self.is_leader():
            raise StoreConflict("this controller does not hold the etcd leader lease")
        resp = await self._call("/v3/kv/txn", {
            "compare": [
                {"key": self._state_key, "target": "MOD", "result": "EQUAL", "mod_revision": str(expected_version)},
                {"key": self._leader_key, "target": "CREATE", "result": "EQUAL",
                 "create_revision": str(self._leader_rev)},
            ],
            "success": [{"request_put": {"key": self._state_key, "value": _b64(json.dumps(data))}}],
            "failure": [],
        })
        if not resp.get("succeeded"):
            raise StoreConflict("etcd refused the write: the state changed or this controller lost leadership")
        return int(resp["header"]["revision"])

    # ---- leadership -------------------------------------------------------------------------------------
    async def campaign(self) -> bool:
        try:
            return await self._campaign()
        except StoreUnavailable as exc:
            log.warning("etcd leadership round failed: %s", exc.message)
            return self.is_leader()

    async def _campaign(self) -> bool:
        if self._lease_id is not None:
            sent = time.monotonic()
            resp = await self._call("/v3/lease/keepalive", {"ID": str(self._lease_id)})
            ttl = int((resp.get("result") or {}).get("TTL", 0))
            if ttl <= 0:
                if self._leader_rev is not None:
                    log.warning("etcd lease %x expired: leadership lost", self._lease_id)
                self._lease_id = self._leader_rev = None
            elif self._leader_rev is not None:
                self._valid_until = sent + ttl * LEASE_TRUST
        if self._leader_rev is not None:
            kv = await self._range(self._leader_key)
            if kv is not None and int(kv.get("create_revision", 0)) == self._leader_rev:
                self._leader_addr = self.identity
                return self.is_leader()
            log.warning("the etcd leader key is no longer this controller's: leadership lost")
            self._leader_rev = None
        if self._lease_id is None:
            resp = await self._call("/v3/lease/grant", {"TTL": str(self.lease_ttl_s)})
            self._lease_id = int(resp["ID"])
        sent = time.monotonic()
        resp = await self._call("/v3/kv/txn", {
            "compare": [{"key": self._leader_key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": self._leader_key, "value": _b64(self.identity),
                                         "lease": str(self._lease_id)}}],
            "failure": [{"request_range": {"key": self._leader_key}}],
        })
        if resp.get("succeeded"):
            self._leader_rev = int(resp["header"]["revision"])
            self._valid_until = sent + self.lease_ttl_s * LEASE_TRUST
            self._leader_addr = self.identity
            return True
        kvs = ((resp.get("responses") or [{}])[0].get("response_range") or {}).get("kvs") or []
        self._leader_addr = _unb64(kvs[0].get("value", "")) if kvs else None
        return False

    def is_leader(self) -> bool:
        return self._leader_rev is not None and time.monotonic() < self._valid_until

    def leader_address(self) -> str | None:
        return self._leader_addr

    @property
    def leadership_term(self) -> Any:
        return self._leader_rev  # each tenure creates the leader key anew, at a new revision

    async def resign(self) -> None:
        if self._lease_id is None:
            return
        try:
            await self._call("/v3/lease/revoke", {"ID": str(self._lease_id)})
        except StoreUnavailable as exc:
            log.warning("could not revoke the etcd lease (it will expire by itself): %s", exc.message)
        self._lease_id = self._leader_rev = None
        self._leader_addr = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def campaign_interval_s(self) -> float:
        return max(0.2, self.lease_ttl_s / 4)
