"""Offset planning, pure: parse offset options, resolve them against queue bounds, cut ranges.

A position in a topic is a map (topic, broker group, queue id) → queue offset. Its JSON form, used in
options and as the streaming offset, nests the three levels: ``{"orders": {"standalone": {"0": 10}}}``.
As Kafka's source does, -2 in an option means the queue's earliest offset and -1 its latest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

EARLIEST = -2
LATEST = -1
_WORDS = {"earliest": EARLIEST, "latest": LATEST}


class QueueKey(NamedTuple):
    topic: str
    group: str
    queue_id: int


OffsetMap = dict[QueueKey, int]
Bounds = Mapping[QueueKey, tuple[int, int]]  # (minOffset, maxOffset)


class OffsetOptionError(ValueError):
    """An offset option that cannot be understood; the message names the option and the culprit."""


@dataclass(frozen=True)
class OffsetSpec:
    """``earliest``/``latest`` for every queue, or a JSON map (with that default for queues not named)."""

    default: int
    explicit: Mapping[QueueKey, int]

    def named_topics(self) -> set[str]:
        return {k.topic for k in self.explicit}


def parse_spec(text: str | None, default: str, option: str) -> OffsetSpec:
    if text is None or not text.strip():
        return OffsetSpec(_WORDS[default], {})
    word = text.strip().lower()
    if word in _WORDS:
        return OffsetSpec(_WORDS[word], {})
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise OffsetOptionError(f"{option} must be 'earliest', 'latest' or a JSON object like "
                                f'{{"topic": {{"group": {{"0": 10}}}}}}; got {text!r}') from exc
    explicit = from_json(raw, option=option, allow_sentinels=True)
    return OffsetSpec(_WORDS[default], explicit)


def from_json(raw: Any, *, option: str = "offset", allow_sentinels: bool = False) -> OffsetMap:
    lowest = EARLIEST if allow_sentinels else 0
    if not isinstance(raw, dict):
        raise OffsetOptionError(f"{option}: expected a JSON object of topics, got {type(raw).__name__}")
    out: OffsetMap = {}
    for topic, groups in raw.items():
        if not isinstance(groups, dict):
            raise OffsetOptionError(f"{option}: topic {topic!r} must map broker groups to queue offsets")
        for group, queues in groups.items():
            if not isinstance(queues, dict):
                raise OffsetOptionError(f"{option}: group {group!r} of topic {topic!r} must map queue ids "
                                        "to offsets")
            for qid, off in queues.items():
                try:
                    q = int(qid)
                except (TypeError, ValueError) as exc:
                    raise OffsetOptionError(f"{option}: queue id {qid!r} of {topic}/{group} is not an "
                                            "integer") from exc
                if isinstance(off, bool) or not isinstance(off, int) or off < lowest or q < 0:
                    raise OffsetOptionError(f"{option}: offset {off!r} of {topic}/{group}/{qid} must be an "
                                            f"integer >= {lowest}")
                out[QueueKey(str(topic), str(group), q)] = off
    return out


def to_json(offsets: Mapping[QueueKey, int]) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for k in sorted(offsets):
        out.setdefault(k.topic, {}).setdefault(k.group, {})[str(k.queue_id)] = offsets[k]
    return out


def resolve(spec: OffsetSpec, bounds: Bounds) -> OffsetMap:
    """Turn a spec into concrete offsets for the queues that exist now.

    Explicit offsets past the end are clamped to it; ones below the start are kept, so that reading
    them reports the retention gap (failOnDataLoss) instead of hiding it.
    """
    out: OffsetMap = {}
    for key, (lo, hi) in bounds.items():
        want = spec.explicit.get(key, spec.default)
        out[key] = lo if want == EARLIEST else hi if want == LATEST else min(want, hi)
    return out


@dataclass(frozen=True)
class QueueRange:
    key: QueueKey
    start: int  # inclusive
    end: int  # exclusive

    @property
    def count(self) -> int:
        return max(0, self.end - self.start)


def plan_ranges(start: Mapping[QueueKey, int], end: Mapping[QueueKey, int],
                new_queue_start: int = 0) -> list[QueueRange]:
    """The non-empty ranges between two positions. A queue absent from ``start`` is new since the
    position was taken; it is read from ``new_queue_start`` (0: a queue's offsets begin at 0)."""
    out = []
    for key in sorted(end):
        s = start.get(key, new_queue_start)
        if end[key] > s:
            out.append(QueueRange(key, s, end[key]))
    return out


def split(ranges: Iterable[QueueRange], max_per_partition: int | None) -> list[QueueRange]:
    """Cut long ranges into pieces of at most ``max_per_partition`` messages (one Spark task each)."""
    out = []
    for r in ranges:
        if not max_per_partition or r.count <= max_per_partition:
            out.append(r)
            continue
        s = r.start
        while s < r.end:
            e = min(r.end, s + max_per_partition)
            out.append(QueueRange(r.key, s, e))
            s = e
    return out


def cap(start: Mapping[QueueKey, int], latest: Mapping[QueueKey, int], max_total: int | None,
        new_queue_start: int = 0) -> OffsetMap:
    """The end position for one micro-batch: at most ``max_total`` messages past ``start``, shared
    fairly among the queues that have data (a busy queue cannot starve a quiet one)."""
    end: OffsetMap = {k: v for k, v in latest.items()}
    pending = {k: v - start.get(k, new_queue_start) for k, v in latest.items()
               if v > start.get(k, new_queue_start)}
    if max_total is None or sum(pending.values()) <= max_total:
        return end
    alloc = dict.fromkeys(pending, 0)
    budget = max_total
    active = sorted(pending)
    while budget > 0 and active:
        share = max(1, budget // len(active))
        for k in list(active):
            take = min(share, pending[k] - alloc[k], budget)
            alloc[k] += take
            budget -= take
            if alloc[k] >= pending[k]:
                active.remove(k)
            if budget == 0:
                break
    for k in pending:
        end[k] = start.get(k, new_queue_start) + alloc[k]
    return end
