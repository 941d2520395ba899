"""Where a topic lives: its broker groups, each master's HTTP address, queue counts and offset bounds.

The endpoint is a controller (``GET /v1/routes/{topic}``) or a single broker; a broker that serves no
route table is taken as the one group that holds the topic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ferrymq.pipeline.broker_http import BrokerError, BrokerHttp, RetryPolicy, base_url
from ferrymq.pipeline.offsets import QueueKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupRoute:
    topic: str
    group: str
    address: str | None  # the master's base URL; None while the group has no master
    read_queues: int
    write_queues: int
    perm: str = "RW"

    @property
    def readable(self) -> bool:
        return "R" in self.perm.upper()

    @property
    def writable(self) -> bool:
        return "W" in self.perm.upper()


class TopicNotFound(Exception):
    pass


def discover(endpoint: str, topic: str, policy: RetryPolicy | None = None) -> list[GroupRoute]:
    with BrokerHttp(endpoint, policy) as client:
        try:
            answer = client.get(f"/v1/routes/{topic}")
        except BrokerError as exc:
            if exc.code == "TOPIC_NOT_EXIST":
                raise TopicNotFound(f"topic {topic!r} does not exist (no broker group behind {endpoint} "
                                    "holds it)") from exc
            if exc.status not in (404, 405):
                raise
            return [_single_broker(client, endpoint, topic)]
    out = []
    for g in answer.get("brokerGroups", []):
        master = g.get("master") or {}
        addr = master.get("httpAddress")
        out.append(GroupRoute(topic, str(g["group"]), base_url(addr) if addr else None,
                              int(g.get("readQueueNums", 0)), int(g.get("writeQueueNums", 0)),
                              str(g.get("perm", "RW"))))
    return out


def _single_broker(client: BrokerHttp, endpoint: str, topic: str) -> GroupRoute:
    """A broker without a route table: it is the master of the one group we can see."""
    health = client.get("/v1/health")
    try:
        cfg = client.get(f"/v1/topics/{topic}")
    except BrokerError as exc:
        if exc.code == "TOPIC_NOT_EXIST":
            raise TopicNotFound(f"topic {topic!r} does not exist on {endpoint}") from exc
        raise
    return GroupRoute(topic, str(health.get("group", "standalone")), base_url(endpoint),
                      int(cfg["readQueueNums"]), int(cfg["writeQueueNums"]), str(cfg.get("perm", "RW")))


def discover_all(endpoint: str, topics: list[str], policy: RetryPolicy | None = None) -> list[GroupRoute]:
    return [r for t in topics for r in discover(endpoint, t, policy)]


def queue_bounds(route: GroupRoute, policy: RetryPolicy | None = None) -> dict[QueueKey, tuple[int, int]]:
    """(minOffset, maxOffset) of every readable queue of one group."""
    if route.address is None:
        raise BrokerError("SERVICE_NOT_AVAILABLE",
                          f"broker group {route.group!r} of topic {route.topic!r} has no master now")
    with BrokerHttp(route.address, policy) as client:
        desc = client.get(f"/v1/topics/{route.topic}")
    out: dict[QueueKey, tuple[int, int]] = {}
    for q in desc.get("queues", []):
        qid = int(q["queueId"])
        if qid < route.read_queues:
            out[QueueKey(route.topic, route.group, qid)] = (int(q["minOffset"]), int(q["maxOffset"]))
    return out


def offset_by_time(route: GroupRoute, queue_id: int, timestamp_ms: int, policy: RetryPolicy | None = None) -> int:
    assert route.address is not None
    with BrokerHttp(route.address, policy) as client:
        answer = client.get(f"/v1/topics/{route.topic}/queues/{queue_id}/offset-by-time", timestamp=timestamp_ms)
    return int(answer["offset"])


def committed_offset(route: GroupRoute, consumer_group: str, queue_id: int,
                     policy: RetryPolicy | None = None) -> int:
    """The consumer group's committed offset for one queue, or -1 when it has none."""
    assert route.address is not None
    with BrokerHttp(route.address, policy) as client:
        answer = client.get(f"/v1/groups/{consumer_group}/offsets/{route.topic}/{queue_id}")
    return int(answer["offset"])
