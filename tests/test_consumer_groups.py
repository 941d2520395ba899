"""ConsumerGroupService: membership, notifications, heartbeat expiry, queue locks — pure logic on a
fake clock."""

from __future__ import annotations

from ferrymq.broker.services.consumer_groups import ConsumerGroupService, HeartbeatData


class Chan:
    def __init__(self, name: str) -> None:
        self.remote = name
        self.notified: list[str] = []
        self.closed = False

    def notify_consumer_ids_changed(self, group: str) -> None:
        self.notified.append(group)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def hb(cid: str, *groups: str, producer: str | None = None) -> HeartbeatData:
    return HeartbeatData.model_validate({
        "clientId": cid, "producerGroups": [producer] if producer else [],
        "consumerGroups": [{"group": g, "subscriptions": [{"topic": "t", "expression": "a||b"}]} for g in groups]})


def service(clock: Clock) -> ConsumerGroupService:
    return ConsumerGroupService(channel_expired_timeout_ms=120_000, lock_max_live_time_ms=60_000, clock=clock)


def test_join_notifies_every_member_and_repeat_heartbeats_do_not() -> None:
    clock = Clock()
    svc = service(clock)
    a, b = Chan("a"), Chan("b")
    svc.heartbeat(a, hb("A", "g"))
    assert a.notified == ["g"]
    svc.heartbeat(b, hb("B", "g"))
    assert a.notified == ["g", "g"] and b.notified == ["g"]
    svc.heartbeat(a, hb("A", "g"))
    assert a.notified == ["g", "g"] and b.notified == ["g"]
    assert svc.consumer_ids("g") == ["A", "B"]
    assert svc.group_info("g").subscriptions == {"t": "a||b"}  # type: ignore[union-attr]


def test_closed_channel_drops_its_clients_and_locks_and_tells_the_rest() -> None:
    clock = Clock()
    svc = service(clock)
    a, b = Chan("a"), Chan("b")
    svc.heartbeat(a, hb("A", "g", "h", producer="pg"))
    svc.heartbeat(b, hb("B", "g"))
    assert svc.lock_batch("g", "A", [("t", 0), ("t", 1)]) == [("t", 0), ("t", 1)]
    assert svc.lock_batch("g", "B", [("t", 1), ("t", 2)]) == [("t", 2)]
    b.notified.clear()
    svc.channel_closed(a)
    assert svc.consumer_ids("g") == ["B"] and svc.consumer_ids("h") == []
    assert svc.producer_channels("pg") == []
    assert b.notified == ["g"]
    assert svc.lock_batch("g", "B", [("t", 0), ("t", 1)]) == [("t", 0), ("t", 1)]


def test_heartbeat_expiry() -> None:
    clock = Clock()
    svc = service(clock)
    a, b = Chan("a"), Chan("b")
    svc.heartbeat(a, hb("A", "g"))
    svc.heartbeat(b, hb("B", "g"))
    svc.lock_batch("g", "A", [("t", 0)])
    clock.t += 100
    svc.heartbeat(b, hb("B", "g"))
    assert svc.scan_expired() == []
    clock.t += 30
    assert svc.scan_expired() == [a]
    assert svc.consumer_ids("g") == ["B"]
    assert svc.lock_holder("g", ("t", 0)) is None


def test_locks_renew_lapse_and_unlock() -> None:
    clock = Clock()
    svc = service(clock)
    assert svc.lock_batch("g", "A", [("t", 0)]) == [("t", 0)]
    clock.t += 50
    assert svc.lock_batch("g", "B", [("t", 0)]) == []
    assert svc.lock_batch("g", "A", [("t", 0)]) == [("t", 0)]  # renewal
    clock.t += 59
    assert svc.lock_holder("g", ("t", 0)) == "A"
    clock.t += 2
    assert svc.lock_holder("g", ("t", 0)) is None
    assert svc.lock_batch("g", "B", [("t", 0)]) == [("t", 0)]  # lapsed: B takes it
    svc.unlock_batch("g", "A", [("t", 0)])  # not A's any more: no effect
    assert svc.lock_holder("g", ("t", 0)) == "B"
    svc.unlock_batch("g", "B", [("t", 0)])
    assert svc.lock_holder("g", ("t", 0)) is None
    assert svc.lock_batch("other", "C", [("t", 0)]) == [("t", 0)]  # groups are independent


def test_unregister() -> None:
    clock = Clock()
    svc = service(clock)
    a, b = Chan("a"), Chan("b")
    svc.heartbeat(a, hb("A", "g"))
    svc.heartbeat(b, hb("B", "g"))
    svc.lock_batch("g", "A", [("t", 3)])
    b.notified.clear()
    svc.unregister("A", None, "g")
    assert svc.consumer_ids("g") == ["B"] and b.notified == ["g"]
    assert svc.lock_holder("g", ("t", 3)) is None
