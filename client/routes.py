"""Topic routes from the controller (or a standalone server): ``GET /v1/routes/{topic}``.

Cached per topic; the client instance refreshes the cache every ``ROUTE_REFRESH_S`` (RocketMQ's
pollNameServerInterval, 30 s) and callers ask for a fresh copy after an error. Several comma-separated
URLs may be given; they are tried in turn.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ferrymq.client.errors import BrokerError, ClientError, RemotingConnectError
from ferrymq.client.message import MessageQueue

ROUTE_REFRESH_S = 30.0
HTTP_TIMEOUT_S = 5.0
PERM_READ, PERM_WRITE = "R", "W"


@dataclass(frozen=True)
class GroupRoute:
    group: str
    master_tcp: str | None
    master_http: str | None
    read_queues: int
    write_queues: int
    perm: str

    @property
    def readable(self) -> bool:
        return PERM_READ in self.perm and self.master_tcp is not None

    @property
    def writable(self) -> bool:
        return PERM_WRITE in self.perm and self.master_tcp is not None


@dataclass
class TopicRoute:
    topic: str
    groups: list[GroupRoute]
    fetched_at: float = field(default_factory=time.monotonic)

    def group(self, name: str) -> GroupRoute | None:
        return next((g for g in self.groups if g.group == name), None)

    def write_queues(self) -> list[MessageQueue]:
        return [MessageQueue(self.topic, g.group, q) for g in self.groups if g.writable for q in range(g.write_queues)]

    def read_queues(self) -> list[MessageQueue]:
        return sorted(MessageQueue(self.topic, g.group, q) for g in self.groups if g.readable
                      for q in range(g.read_queues))

    def same_as(self, other: TopicRoute | None) -> bool:
        return other is not None and self.groups == other.groups


def parse_route(topic: str, data: Any) -> TopicRoute:
    try:
        groups = []
        for g in data["brokerGroups"]:
            master = g.get("master") or None
            groups.append(GroupRoute(
                group=str(g["group"]),
                master_tcp=master.get("tcpAddress") if master else None,
                master_http=master.get("httpAddress") if master else None,
                read_queues=int(g["readQueueNums"]), write_queues=int(g["writeQueueNums"]),
                perm=str(g.get("perm", "RW"))))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ClientError("SYSTEM_ERROR", f"malformed route for topic {topic!r}: {exc!r}") from exc
    return TopicRoute(topic, sorted(groups, key=lambda g: g.group))


class HttpApi:
    """A small JSON-over-HTTP caller that turns the contract's error bodies into BrokerError."""

    def __init__(self, urls: str) -> None:
        self.urls = [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]
        if not self.urls:
            raise ClientError("INVALID_REQUEST", "no server URL given")
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S))
        return self._session

    async def call(self, method: str, path: str, body: Any = None, base: str | None = None) -> Any:
        """Call ``path`` on ``base`` (or on each configured URL in turn until one answers)."""
        bases = [base.rstrip("/")] if base else self.urls
        last: Exception | None = None
        for b in bases:
            url = b if b.startswith("http") else f"http://{b}"
            try:
                async with self.session().request(method, url + path, json=body) as resp:
                    raw = await resp.read()
                    data = json.loads(raw) if raw else None
                    if resp.status >= 400:
                        err = data.get("error", {}) if isinstance(data, dict) else {}
                        raise BrokerError(str(err.get("code", "SYSTEM_ERROR")),
                                          str(err.get("message", f"HTTP {resp.status} from {url}{path}")), broker=b)
                    return data
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                last = exc
        raise RemotingConnectError(f"cannot reach {' or '.join(bases)}: {last!r}")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class RouteCache:
    def __init__(self, api: HttpApi) -> None:
        self.api = api
        self.routes: dict[str, TopicRoute] = {}
        self._fetching: dict[str, asyncio.Future[TopicRoute]] = {}

    async def get(self, topic: str, *, refresh: bool = False) -> TopicRoute:
        route = self.routes.get(topic)
        if route is not None and not refresh and time.monotonic() - route.fetched_at < ROUTE_REFRESH_S:
            return route
        pending = self._fetching.get(topic)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[TopicRoute] = asyncio.get_running_loop().create_future()
        self._fetching[topic] = fut
        try:
            route = parse_route(topic, await self.api.call("GET", f"/v1/routes/{topic}"))
            self.routes[topic] = route
            fut.set_result(route)
            return route
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()
            raise
        finally:
            self._fetching.pop(topic, None)

    def cached(self, topic: str) -> TopicRoute | None:
        return self.routes.get(topic)
