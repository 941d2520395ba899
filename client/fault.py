"""Latency-based avoidance of slow or failing broker groups: RocketMQ's MQFaultStrategy and
LatencyFaultToleranceImpl.

After each send the producer records how long the group took (or that it failed); a group whose
latency passed a step of ``LATENCY_MAX`` is avoided for the matching ``NOT_AVAILABLE_DURATION``.
Queue selection goes round-robin over the topic's write queues, skipping avoided groups and the group
that just failed; when every group is avoided it still picks one rather than fail.
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


@dataclass
class FaultItem:
    latency_ms: float
    available_from: float  # monotonic seconds


class LatencyFaultTolerance:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.items: dict[str, FaultItem] = {}

    def update(self, group: str, latency_ms: float, isolation: bool) -> None:
        latency = ISOLATION_LATENCY_MS if isolation else latency_ms
        duration = 0
        for i in range(len(LATENCY_MAX) - 1, -1, -1):
            if latency >= LATENCY_MAX[i]:
                duration = NOT_AVAILABLE_DURATION[i]
                break
        self.items[group] = FaultItem(latency, self.clock() + duration / 1000)

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
