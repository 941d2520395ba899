"""Topic and offset administration.

A topic that has no route yet is created through the server URL's HTTP API (a standalone server, or
a broker); once routed, topic changes go over TCP to the master of every broker group holding it.
"""

from __future__ import annotations

from typing import Any

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.client.errors import BrokerError, client_checked
from ferrymq.client.instance import ClientInstance
from ferrymq.client.message import MessageQueue
from ferrymq.common.limits import check_group, check_topic


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

    # ---- topics -----------------------------------------------------------------------------------------
    async def create_topic(self, name: str, read_queues: int = 8, write_queues: int = 8, perm: str = "RW",
                           message_type: str = "NORMAL") -> dict[str, Any]:
        client_checked(check_topic, name)
        spec = {"readQueueNums": read_queues, "writeQueueNums": write_queues, "perm": perm,
                "messageType": message_type}
        masters = await self._masters(name)
        if not masters:
            await self.instance.http.call("PUT", f"/v1/topics/{name}", spec)
        else:
            for _, addr in masters:
                await self.instance.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": name, **spec})
        return await self.describe_topic(name)

    async def describe_topic(self, name: str) -> dict[str, Any]:
        """The topic's config (as the first group holds it) and, per broker group, its queues."""
        client_checked(check_topic, name)
        masters = await self._masters(name)
        if not masters:
            raise BrokerError("TOPIC_NOT_EXIST", f"no broker group holds topic {name!r}")
        groups = {g: await self.instance.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": name})
                  for g, addr in masters}
        first = next(iter(groups.values()))
        out = {k: v for k, v in first.items() if k != "queues"}
        out["brokerGroups"] = groups
        return out

    async def update_topic(self, name: str, read_queues: int | None = None, write_queues: int | None = None,
                           perm: str | None = None) -> dict[str, Any]:
        client_checked(check_topic, name)
        masters = await self._masters(name)
        if not masters:
            raise BrokerError("TOPIC_NOT_EXIST", f"no broker group holds topic {name!r}")
        for _, addr in masters:
            cur = await self.instance.call(addr, RequestCode.GET_TOPIC_STATS_INFO, {"topic": name})
            spec = {"readQueueNums": read_queues or cur["readQueueNums"],
                    "writeQueueNums": write_queues or cur["writeQueueNums"], "perm": perm or cur["perm"],
                    "messageType": cur.get("messageType", "NORMAL")}
            await self.instance.call(addr, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": name, **spec})
        return await self.describe_topic(name)

    async def delete_topic(self, name: str) -> None:
        client_checked(check_topic, name)
        masters = await self._masters(name)
        if not masters:
            raise BrokerError("TOPIC_NOT_EXIST", f"no broker group holds topic {name!r}")
        for _, addr in masters:
            await self.instance.call(addr, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": name})

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
