"""Topic and offset administration.

Topic changes go to the master of every broker group (or of the one named with ``group=``), over its
HTTP API. Given a controller's URL, the groups and their masters come from ``GET /v1/groups``, so a
topic can be created on groups that do not hold it yet (routes only list groups that do); slaves copy
it from their master within ``slaveSyncInterval``. Given a standalone server's or a single broker's
URL, that server is the one group. A group without a master (a failover under way) makes a change
fail with SERVICE_NOT_AVAILABLE before anything is changed anywhere; ``describe_topic`` then reads that
group from a live slave.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ferrymq.client.errors import BrokerError, ClientError, client_checked
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import MessageQueue
from ferrymq.common.limits import check_group, check_topic


@dataclass(frozen=True)
class GroupTarget:
    """Where a broker group's topic admin goes: its master's HTTP base (None: the configured URL)."""

    group: str
    master: str | None
    replicas: tuple[str, ...] = ()  # live replicas' HTTP bases, for reads while there is no master
    has_master: bool = True


def _base(address: str) -> str:
    return address if address.startswith("http") else f"http://{address}"


class AsyncAdmin:
    def __init__(self, url: str) -> None:
        self.instance = ClientInstance(url)

    async def start(self) -> None:
        """Optional: every call also works without it."""

    async def shutdown(self) -> None:
        await self.instance.shutdown()

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _masters(self, topic: str) -> list[tuple[str, str]]:
        """(broker group, master TCP address) of every group holding ``topic``; [] when none does."""
        try:
            route = await self.instance.route(topic, refresh=True)
        except BrokerError as exc:
            if exc.code == "TOPIC_NOT_EXIST":
                return []
            raise
        return [(g.group, g.master_tcp) for g in route.groups if g.master_tcp]

    # ---- where topic changes go ---------------------------------------------------------------------------
    async def _targets(self, group: str | None) -> list[GroupTarget]:
        """Every broker group the server URL knows of (or just ``group``)."""
        http = self.instance.http
        health = await http.call("GET", "/v1/health")
        if isinstance(health, dict) and "role" in health:
            # a standalone server or one broker replica: it is the only group there is
            name = str(health.get("group", "standalone"))
            targets = [GroupTarget(name, None)]
        else:
            data = await http.call("GET", "/v1/groups")
            targets = []
            for g in data.get("groups", []) if isinstance(data, dict) else []:
                master = g.get("master") or None
                replicas = tuple(_base(r["httpAddress"]) for r in g.get("replicas", [])
                                 if r.get("alive") and r.get("httpAddress"))
                targets.append(GroupTarget(str(g["group"]), _base(master["httpAddress"]) if master else None,
                                           replicas, master is not None))
        if group is not None:
            targets = [t for t in targets if t.group == group]
            if not targets:
                raise ClientError("INVALID_REQUEST", f"the server knows no broker group {group!r}")
        if not targets:
            raise BrokerError("SERVICE_NOT_AVAILABLE", "the controller knows no broker group yet")
        return targets

    @staticmethod
    def _require_masters(targets: list[GroupTarget]) -> None:
        missing = [t.group for t in targets if not t.has_master]
        if missing:
            raise BrokerError("SERVICE_NOT_AVAILABLE", f"broker group(s) {', '.join(missing)} have no master now "
                              "(a failover is under way); nothing was changed, try again shortly")

    async def _call(self, method: str, path: str, base: str | None, body: Any = None) -> Any:
        return await self.instance.http.call(method, path, body, base=base)

    async def _describe_one(self, name: str, t: GroupTarget) -> dict[str, Any] | None:
        """The topic on group ``t`` (from its master, else a live slave); None when it lacks the topic."""
        bases = [t.master] if t.has_master else list(t.replicas)
        if not bases:
            raise BrokerError("SERVICE_NOT_AVAILABLE", f"broker group {t.group!r} has no live replica now")
        last: ClientError | None = None
        for base in bases:
            try:
                return await self._call("GET", f"/v1/topics/{name}", base)
            except BrokerError as exc:
                if exc.code == "TOPIC_NOT_EXIST":
                    return None
                last = exc
            except ClientError as exc:
                last = exc
        assert last is not None
        raise last

    async def _holding(self, name: str, targets: list[GroupTarget]) -> dict[GroupTarget, dict[str, Any]]:
        out = {}
        for t in targets:
            desc = await self._describe_one(name, t)
            if desc is not None:
                out[t] = desc
        if not out:
            raise BrokerError("TOPIC_NOT_EXIST", f"no broker group holds topic {name!r}")
        return out

    # ---- topics -----------------------------------------------------------------------------------------
    async def create_topic(self, name: str, read_queues: int = 8, write_queues: int = 8, perm: str = "RW",
                           message_type: str = "NORMAL", *, group: str | None = None) -> dict[str, Any]:
        """Create (or update) the topic on every broker group, or on ``group`` only."""
        client_checked(check_topic, name)
        spec = {"readQueueNums": read_queues, "writeQueueNums": write_queues, "perm": perm,
                "messageType": message_type}
        targets = await self._targets(group)
        self._require_masters(targets)
        for t in targets:
            await self._call("PUT", f"/v1/topics/{name}", t.master, spec)
        return await self.describe_topic(name, group=group)

    async def describe_topic(self, name: str, *, group: str | None = None) -> dict[str, Any]:
        """The topic's config (as the first group holds it) and, per broker group, its queues."""
        client_checked(check_topic, name)
        held = await self._holding(name, await self._targets(group))
        groups = {t.group: desc for t, desc in held.items()}
        first = next(iter(groups.values()))
        out = {k: v for k, v in first.items() if k != "queues"}
        out["brokerGroups"] = groups
        return out

    async def update_topic(self, name: str, read_queues: int | None = None, write_queues: int | None = None,
                           perm: str | None = None, *, group: str | None = None) -> dict[str, Any]:
        """Change the topic on every group holding it (or on ``group``); unset fields keep their value."""
        client_checked(check_topic, name)
        targets = await self._targets(group)
        self._require_masters(targets)
        for t, cur in (await self._holding(name, targets)).items():
            spec = {"readQueueNums": read_queues or cur["readQueueNums"],
                    "writeQueueNums": write_queues or cur["writeQueueNums"], "perm": perm or cur["perm"],
                    "messageType": cur.get("messageType", "NORMAL")}
            await self._call("PUT", f"/v1/topics/{name}", t.master, spec)
        return await self.describe_topic(name, group=group)

    async def delete_topic(self, name: str, *, group: str | None = None) -> None:
        """Delete the topic from every group holding it (or from ``group``)."""
        client_checked(check_topic, name)
        targets = await self._targets(group)
        self._require_masters(targets)
        for t in await self._holding(name, targets):
            await self._call("DELETE", f"/v1/topics/{name}", t.master)

    # ---- offsets and groups -----------------------------------------------------------------------------
    async def consumer_offsets(self, group: str, topic: str) -> dict[MessageQueue, int]:
        """The group's committed offset of every read queue of ``topic`` (-1: none committed)."""
        client_checked(check_group, group)
        route = await self.instance.route(topic, refresh=True)
        return {mq: await self.instance.query_offset(group, mq) for mq in route.read_queues()}

    async def set_consumer_offset(self, group: str, mq: MessageQueue, offset: int) -> None:
        client_checked(check_group, group)
        await self.instance.update_offset(group, mq, offset)

    async def reset_offsets_by_time(self, group: str, topic: str, timestamp_ms: int) -> dict[MessageQueue, int]:
        """Move the group's offsets to the first message stored at or after ``timestamp_ms``; the
        group's consumers should be stopped meanwhile, or they commit over it."""
        client_checked(check_group, group)
        route = await self.instance.route(topic, refresh=True)
        out = {}
        for mq in route.read_queues():
            off = await self.instance.search_offset(mq, timestamp_ms)
            await self.instance.update_offset(group, mq, off)
            out[mq] = off
        return out

    async def queue_offsets(self, topic: str) -> dict[MessageQueue, tuple[int, int]]:
        """(min offset, max offset) of every read queue."""
        route = await self.instance.route(topic, refresh=True)
        return {mq: (await self.instance.min_offset(mq), await self.instance.max_offset(mq))
                for mq in route.read_queues()}

    async def consumer_ids(self, group: str, topic: str) -> list[str]:
        """The live members of ``group`` as the brokers holding ``topic`` see them."""
        client_checked(check_group, group)
        ids: set[str] = set()
        for _, addr in await self._masters(topic):
            ids.update(await self.instance.consumer_ids(group, addr))
        return sorted(ids)
