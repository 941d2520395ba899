"""Topic routes: which broker groups hold a topic, and where their masters and slaves listen.

Fed by brokers' registrations (RocketMQ brokers register their topic configs with the name server;
in controller mode the controller plays that part). Pure state: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ferrymq.common.errors import FerryError


@dataclass
class ReplicaAddress:
    broker_id: int
    http_address: str
    tcp_address: str
    role: str = "master"
    name: str = ""

    def to_api(self) -> dict[str, Any]:
        return {"brokerId": self.broker_id, "name": self.name, "httpAddress": self.http_address,
                "tcpAddress": self.tcp_address}


@dataclass
class GroupRoutes:
    group: str
    replicas: dict[int, ReplicaAddress] = field(default_factory=dict)
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)  # topic -> {readQueueNums, ...}
    master_id: int | None = None


class RouteTable:
    def __init__(self) -> None:
        self.groups: dict[str, GroupRoutes] = {}

    def register(self, group: str, replica: ReplicaAddress, topics: dict[str, dict[str, Any]] | None) -> None:
        """A replica reports its addresses and (when it is the master) the topics it holds."""
        g = self.groups.setdefault(group, GroupRoutes(group))
        g.replicas[replica.broker_id] = replica
        if replica.role == "master":
            g.master_id = replica.broker_id
            if topics is not None:
                g.topics = dict(topics)

    def set_master(self, group: str, master_id: int | None) -> None:
        g = self.groups.setdefault(group, GroupRoutes(group))
        g.master_id = master_id
        for r in g.replicas.values():
            r.role = "master" if r.broker_id == master_id else "slave"

    def unregister(self, group: str, broker_id: int) -> None:
        g = self.groups.get(group)
        if g is not None:
            g.replicas.pop(broker_id, None)
            if g.master_id == broker_id:
                g.master_id = None

    def replace_group(self, group: str, replicas: list[ReplicaAddress], master_id: int | None,
                      topics: dict[str, dict[str, Any]]) -> None:
        """The controller's whole view of one group at once (roles follow ``master_id``)."""
        g = GroupRoutes(group, {r.broker_id: r for r in replicas}, dict(topics))
        self.groups[group] = g
        self.set_master(group, master_id)

    def retain(self, groups: set[str]) -> None:
        for name in set(self.groups) - groups:
            del self.groups[name]

    def route(self, topic: str) -> dict[str, Any]:
        out = []
        for name in sorted(self.groups):
            g = self.groups[name]
            cfg = g.topics.get(topic)
            if cfg is None:
                continue
            master = g.replicas.get(g.master_id) if g.master_id is not None else None
            out.append({
                "group": name,
                "master": master.to_api() if master else None,
                "slaves": [r.to_api() for bid, r in sorted(g.replicas.items()) if bid != g.master_id],
                "readQueueNums": cfg["readQueueNums"],
                "writeQueueNums": cfg["writeQueueNums"],
                "perm": cfg.get("perm", "RW"),
            })
        if not out:
            raise FerryError("TOPIC_NOT_EXIST", f"no broker group holds topic {topic!r}")
        return {"topic": topic, "brokerGroups": out}
