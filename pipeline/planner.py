"""Driver side of reading: find the queues, turn the offset options into positions, make partitions."""

from __future__ import annotations

import logging

from ferrymq.pipeline.broker_http import BrokerError
from ferrymq.pipeline.offsets import (
    Bounds,
    OffsetMap,
    OffsetOptionError,
    QueueKey,
    QueueRange,
    parse_spec,
    resolve,
    split,
)
from ferrymq.pipeline.options import ReadOptions
from ferrymq.pipeline.pull import QueueRangePartition
from ferrymq.pipeline.routes import GroupRoute, committed_offset, discover_all, offset_by_time, queue_bounds

log = logging.getLogger(__name__)


class Planner:
    def __init__(self, opts: ReadOptions, *, streaming: bool) -> None:
        self.opts = opts
        self.policy = opts.policy()
        self.streaming = streaming
        self.starting_spec = parse_spec(opts.startingOffsets, "latest" if streaming else "earliest",
                                        "startingOffsets")
        self.ending_spec = parse_spec(opts.endingOffsets, "latest", "endingOffsets")
        if streaming and opts.endingOffsets is not None:
            raise OffsetOptionError("endingOffsets is for batch queries; a stream reads on as data arrives")
        if streaming and opts.endingTimestamp is not None:
            raise OffsetOptionError("endingTimestamp is for batch queries")
        if opts.startingTimestamp is not None and opts.startingOffsets is not None:
            raise OffsetOptionError("give startingOffsets or startingTimestamp, not both")
        if opts.endingTimestamp is not None and opts.endingOffsets is not None:
            raise OffsetOptionError("give endingOffsets or endingTimestamp, not both")
        for spec, name in ((self.starting_spec, "startingOffsets"), (self.ending_spec, "endingOffsets")):
            unknown = spec.named_topics() - set(opts.topics)
            if unknown:
                raise OffsetOptionError(f"{name} names topic(s) {sorted(unknown)} that the option topic does "
                                        f"not list ({opts.topic})")
        self.routes: dict[tuple[str, str], GroupRoute] = {}

    # ---- where things are -----------------------------------------------------------------------------
    def refresh(self) -> None:
        self.routes = {(r.topic, r.group): r for r in discover_all(self.opts.endpoint, self.opts.topics,
                                                                   self.policy)}

    def bounds(self, *, tolerate_unavailable: bool) -> Bounds:
        """(min, max) of every queue of every group; a group without a reachable master fails a batch
        query, and is left out (read later) by a stream."""
        self.refresh()
        out: dict[QueueKey, tuple[int, int]] = {}
        for route in self.routes.values():
            if not route.readable:
                log.warning("topic %s in group %s is not readable (perm %s); skipped", route.topic,
                            route.group, route.perm)
                continue
            try:
                out.update(queue_bounds(route, self.policy))
            except BrokerError as exc:
                if not tolerate_unavailable:
                    raise
                log.warning("broker group %s of topic %s is unavailable, reading it later: %s", route.group,
                            route.topic, exc)
        return out

    def address(self, key: QueueKey) -> str:
        route = self.routes.get((key.topic, key.group))
        if route is None or route.address is None:
            self.refresh()
            route = self.routes.get((key.topic, key.group))
        if route is None or route.address is None:
            raise BrokerError("SERVICE_NOT_AVAILABLE", f"broker group {key.group!r} of topic {key.topic!r} has "
                              "no master now")
        return route.address

    # ---- positions ------------------------------------------------------------------------------------
    def starting(self, bounds: Bounds) -> OffsetMap:
        if self.opts.startingTimestamp is not None:
            start = self._by_time(bounds, self.opts.startingTimestamp)
        else:
            start = resolve(self.starting_spec, bounds)
        if self.opts.consumerGroup:
            for key in bounds:
                committed = committed_offset(self._route(key), self.opts.consumerGroup, key.queue_id, self.policy)
                if committed >= 0:
                    start[key] = min(committed, bounds[key][1])
        return start

    def ending(self, bounds: Bounds) -> OffsetMap:
        if self.opts.endingTimestamp is not None:
            return self._by_time(bounds, self.opts.endingTimestamp)
        return resolve(self.ending_spec, bounds)

    def _by_time(self, bounds: Bounds, ts: int) -> OffsetMap:
        return {k: offset_by_time(self._route(k), k.queue_id, ts, self.policy) for k in bounds}

    def _route(self, key: QueueKey) -> GroupRoute:
        return self.routes[(key.topic, key.group)]

    def partitions(self, ranges: list[QueueRange]) -> list[QueueRangePartition]:
        return [QueueRangePartition.of(r, self.address(r.key), self.opts.endpoint)
                for r in split(ranges, self.opts.maxMessagesPerPartition)]

