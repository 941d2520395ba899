"""Topic routes from the controller (or a standalone server): ``GET /v1/routes/{topic}``.

Cached per topic; the client instance refreshes the cache every ``ROUTE_REFRESH_S`` (RocketMQ's
pollNameServerInterval, 30 s) and callers ask for a fresh copy after an error. While a group of a
route has no master, or its master just failed (a failover under way), the route is re-read at most
every ``DEGRADED_REFRESH_S`` when used, so clients find the new master within a second of its
election. Several comma-separated URLs may be given; they are tried in turn.

Writes and offset commits go to a group's master only. Reads (pulls, offset and queue queries) go to
the master, or, while the group has none or it just failed, to a slave (RocketMQ's
findBrokerAddressInSubscribe falling back to any replica of the group): slaves serve everything their
master confirmed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ferrymq.client.errors import BrokerError, ClientError, RemotingConnectError
from ferrymq.client.fault import AddressHealth
from ferrymq.client.message import MessageQueue

ROUTE_REFRESH_S = 30.0
DEGRADED_REFRESH_S = 1.0
MIN_REFRESH_S = 0.1  # forced refreshes closer together than this reuse the last answer
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
    slaves_tcp: tuple[str, ...] = ()

    @property
    def readable(self) -> bool:
        # A group without master stays readable through its slaves: consumers keep their queues (and
        # keep reading) through a failover instead of dropping and re-taking them.
        return PERM_READ in self.perm and (self.master_tcp is not None or bool(self.slaves_tcp))

    @property
    def writable(self) -> bool:
        return PERM_WRITE in self.perm and self.master_tcp is not None

    def read_address(self, health: AddressHealth | None) -> str | None:
        """The master unless it just failed; else the first slave that did not; else whichever failed
        longest ago (it may be back)."""
        candidates = [a for a in (self.master_tcp, *self.slaves_tcp) if a]
        if not candidates:
            return None
        if health is None:
            return candidates[0]
        for a in candidates:
            if not health.is_down(a):
                return a
        return health.least_recently_failed(candidates)


@dataclass
class TopicRoute:
    topic: str
    groups: list[GroupRoute]
    fetched_at: float = field(default_factory=time.monotonic)

    def group(self, name: str) -> GroupRoute | None:
        return next((g for g in self.groups if g.group == name), None)

    def write_queues(self, *, include_masterless: bool = False) -> list[MessageQueue]:
        """Queues that take writes now; with ``include_masterless`` also those of groups in a failover
        (a stable list, for queue selectors that must keep a key on one queue)."""
        return [MessageQueue(self.topic, g.group, q) for g in self.groups
                if (g.writable or (include_masterless and PERM_WRITE in g.perm)) for q in range(g.write_queues)]

    def read_queues(self) -> list[MessageQueue]:
        return sorted(MessageQueue(self.topic, g.group, q) for g in self.groups if g.readable
                      for q in range(g.read_queues))

    def masters(self) -> dict[str, str | None]:
        return {g.group: g.master_tcp for g in self.groups}

    def same_as(self, other: TopicRoute | None) -> bool:
        return other is not None and self.groups == other.groups


def parse_route(topic: str, data: Any) -> TopicRoute:
    try:
        groups = []
        for g in data["brokerGroups"]:
            master = g.get("master") or None
            slaves = tuple(str(s["tcpAddress"]) for s in g.get("slaves") or () if s.get("tcpAddress"))
            groups.append(GroupRoute(
                group=str(g["group"]),
                master_tcp=master.get("tcpAddress") if master else None,
                master_http=master.get("httpAddress") if master else None,
                read_queues=int(g["readQueueNums"]), write_queues=int(g["writeQueueNums"]),
                perm=str(g.get("perm", "RW")), slaves_tcp=slaves))
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
        self._attempted: dict[str, float] = {}  # topic -> when a fetch last started

    async def get(self, topic: str, *, refresh: bool = False, max_age: float = ROUTE_REFRESH_S) -> TopicRoute:
        route = self.routes.get(topic)
        if route is not None:
            age = time.monotonic() - route.fetched_at
            if age < (MIN_REFRESH_S if refresh else max_age):
                return route
        pending = self._fetching.get(topic)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[TopicRoute] = asyncio.get_running_loop().create_future()
        self._fetching[topic] = fut
        self._attempted[topic] = time.monotonic()
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

    def fresh(self, topic: str) -> TopicRoute | None:
        """The cached route if younger than ``ROUTE_REFRESH_S`` (what ``get`` returns at once), else None."""
        route = self.routes.get(topic)
        return route if route is not None and time.monotonic() - route.fetched_at < ROUTE_REFRESH_S else None

    async def _current(self, topic: str, *, refresh: bool, health: AddressHealth | None) -> TopicRoute:
        """The route, re-read when asked or when it looks stale (a group without master, or a master
        that just failed); an unreachable controller leaves the cached route in use, tried again at
        most every ``DEGRADED_REFRESH_S``."""
        route = self.routes.get(topic)
        if route is None:
            return await self.get(topic)
        stale = refresh or any(g.master_tcp is None or (health is not None and health.is_down(g.master_tcp))
                               for g in route.groups)
        max_age = DEGRADED_REFRESH_S if stale else ROUTE_REFRESH_S
        if time.monotonic() - route.fetched_at < max_age:
            return route
        if stale and time.monotonic() - self._attempted.get(topic, 0.0) < DEGRADED_REFRESH_S:
            return route  # the controller failed us a moment ago: do not wait on it for every call
        try:
            return await self.get(topic, max_age=max_age)
        except ClientError:
            return route

    async def address(self, mq: MessageQueue, *, read: bool = False, health: AddressHealth | None = None) -> str:
        """Where to send a request about ``mq``: its group's master; for ``read``s, a slave while the
        group has no master or the master just failed."""
        route = await self._current(mq.topic, refresh=False, health=health)
        g = route.group(mq.broker_group)
        if g is None or (g.read_address(health) if read else g.master_tcp) is None:
            route = await self._current(mq.topic, refresh=True, health=health)
            g = route.group(mq.broker_group)
        addr = None if g is None else g.read_address(health) if read else g.master_tcp
        if addr is None:
            raise BrokerError("SERVICE_NOT_AVAILABLE",
                              f"broker group {mq.broker_group!r} has no master for topic {mq.topic!r} now")
        return addr

    def is_master(self, mq: MessageQueue, address: str) -> bool:
        route = self.routes.get(mq.topic)
        g = route.group(mq.broker_group) if route is not None else None
        return g is not None and g.master_tcp == address
