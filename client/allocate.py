"""Queue allocation among a consumer group's members: RocketMQ's AllocateMessageQueueAveragely.

Pure: every member computes its own share from the same sorted lists, so after all members see the
same member list, the shares are disjoint and cover every queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def allocate_averagely(queues: Sequence[T], members: Sequence[str], me: str) -> list[T]:
    """``queues`` and ``members`` must be sorted the same way by every member."""
    if me not in members or not queues:
        return []
    index = members.index(me)
    n, m = len(queues), len(members)
    mod = n % m
    if n <= m:
        average = 1
    elif mod > 0 and index < mod:
        average = n // m + 1
    else:
        average = n // m
    start = index * average if mod > 0 and index < mod else index * average + mod
    size = min(average, n - start)
    return [queues[(start + i) % n] for i in range(max(size, 0))]
