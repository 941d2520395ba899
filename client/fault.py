"""Avoiding broker groups and addresses that fail.

``LatencyFaultTolerance`` and ``QueueSelector`` are RocketMQ's MQFaultStrategy and
LatencyFaultToleranceImpl: after each send the producer records how long the group took (or that it
failed); a group whose latency passed a step of ``LATENCY_MAX`` is avoided for the matching
``NOT_AVAILABLE_DURATION``. Queue selection goes round-robin over the topic's write queues, skipping
avoided groups and the group that just failed; when every group is avoided it still picks one rather
than fail. A verdict is about one master: once the route names another master for the group (a
failover), the group is judged afresh.

``AddressHealth`` remembers which broker addresses just failed to connect or answer, so that reads
go to a slave of the group instead of waiting on a dead master until the controller notices.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from ferrymq.client.message import MessageQueue

# ms; RocketMQ's defaults
LATENCY_MAX = (50, 100, 550, 1000, 2000, 3000, 15000)
NOT_AVAILABLE_DURATION = (0, 0, 30000, 60000, 120000, 180000, 600000)
ISOLATION_LATENCY_MS = 30000  # a failed send counts as this slow
# A group whose master cannot take writes (refused, unreachable) counts as this slow: avoided for
# 30 s rather than isolated for 10 minutes, as it is usually a failover that the next route ends sooner.
MASTER_UNAVAILABLE_LATENCY_MS = 550


@dataclass
class FaultItem:
    latency_ms: float
    available_from: float  # monotonic seconds
    address: str | None = None  # the master the verdict is about


class LatencyFaultTolerance:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.items: dict[str, FaultItem] = {}

    def update(self, group: str, latency_ms: float, isolation: bool, address: str | None = None) -> None:
        latency = ISOLATION_LATENCY_MS if isolation else latency_ms
        duration = 0
        for i in range(len(LATENCY_MAX) - 1, -1, -1):
            if latency >= LATENCY_MAX[i]:
                duration = NOT_AVAILABLE_DURATION[i]
                break
        self.items[group] = FaultItem(latency, self.clock() + duration / 1000, address)

    def follow_masters(self, masters: dict[str, str | None]) -> None:
        """Forget verdicts about masters the route no longer names: a failed-over group is usable as
        soon as its new master is, not after the old one's isolation (up to 10 minutes) ran out."""
        for group, item in list(self.items.items()):
            new = masters.get(group)
            if item.address is not None and new is not None and new != item.address:
                del self.items[group]

    def available(self, group: str) -> bool:
        item = self.items.get(group)
        return item is None or self.clock() >= item.available_from

    def pick_least_bad(self) -> str | None:
        if not self.items:
            return None
        return min(self.items, key=lambda g: (self.items[g].available_from, self.items[g].latency_ms))


class QueueSelector:
    """Round-robin choice of a write queue with fault avoidance (MQFaultStrategy.selectOneMessageQueue)."""

    def __init__(self, fault: LatencyFaultTolerance, enabled: bool = True) -> None:
        self.fault = fault
        self.enabled = enabled
        self._counter = itertools.count(random.randrange(1 << 16))  # as RocketMQ: spread producers

    def select(self, queues: list[MessageQueue], last_failed_group: str | None) -> MessageQueue:
        n = len(queues)
        start = next(self._counter)
        if self.enabled:
            for i in range(n):
                mq = queues[(start + i) % n]
                if self.fault.available(mq.broker_group) and mq.broker_group != last_failed_group:
                    return mq
            least = self.fault.pick_least_bad()
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_group == least and mq.broker_group != last_failed_group:
                    return mq
        for i in range(n):
            mq = queues[(start + i) % n]
            if mq.broker_group != last_failed_group:
                return mq
        return queues[start % n]


DOWN_S = 5.0  # how long an address that failed is passed over for reads


class AddressHealth:
    """Addresses that just failed (connect refused or timed out, connection lost under a request, no
    answer in time), and since when. Reads pass over them for ``DOWN_S``; a successful connect clears
    the mark at once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, down_s: float = DOWN_S) -> None:
        self.clock = clock
        self.down_s = down_s
        self.failed_at: dict[str, float] = {}

    def failed(self, address: str) -> None:
        self.failed_at[address] = self.clock()

    def ok(self, address: str) -> None:
        self.failed_at.pop(address, None)

    def is_down(self, address: str) -> bool:
        t = self.failed_at.get(address)
        if t is None:
            return False
        if self.clock() - t >= self.down_s:
            del self.failed_at[address]
            return False
        return True

    def least_recently_failed(self, addresses: list[str]) -> str:
        return min(addresses, key=lambda a: self.failed_at.get(a, float("-inf")))
