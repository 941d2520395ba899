"""Streaming reads: the stream offset is the per-queue position (JSON), one micro-batch a range of it.

Spark keeps the offsets in its checkpoint and asks for ``partitions(start, end)`` again after a
restart, so planning depends on the two positions only: that makes replays exact, and a file sink
then sees every message exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ferrymq.pipeline.broker_http import BrokerError, BrokerHttp
from ferrymq.pipeline.offsets import OffsetMap, cap, from_json, plan_ranges, to_json
from ferrymq.pipeline.options import ReadOptions
from ferrymq.pipeline.planner import Planner
from ferrymq.pipeline.pull import DataLossError, QueueRangePartition, read_range

log = logging.getLogger(__name__)


class FerryStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._planner: Planner | None = Planner(opts, streaming=True)
        self._target: OffsetMap | None = None  # Trigger.AvailableNow: never read past this

    def __getstate__(self) -> dict[str, Any]:
        # Executors need only the options; routes and targets are the planner's business.
        return {"opts": self.opts, "_planner": None, "_target": None}

    @property
    def planner(self) -> Planner:
        if self._planner is None:
            self._planner = Planner(self.opts, streaming=True)
        return self._planner

    # ---- offsets --------------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        bounds = self.planner.bounds(tolerate_unavailable=True)
        return to_json(self.planner.starting(bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.maxMessagesPerTrigger:
            return ReadMaxRows(self.opts.maxMessagesPerTrigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()
        log.info("available-now target: %s", to_json(self._target))

    def _latest(self) -> OffsetMap:
        return {k: hi for k, (_lo, hi) in self.planner.bounds(tolerate_unavailable=True).items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = from_json(start, option="stream offset")
        latest = self._latest()
        for key, off in begin.items():
            # A group that is down (or a queue that went away) keeps its position until it is back.
            latest.setdefault(key, off)
        for key, off in latest.items():
            was = begin.get(key)
            if was is not None and off < was:
                msg = (f"{key.topic}/{key.group}/queue {key.queue_id} now ends at offset {off}, before the "
                       f"query's position {was}: the queue was recreated or a failover lost messages")
                if self.opts.failOnDataLoss:
                    raise DataLossError(msg + ". Set failOnDataLoss=false to go on from the new end.")
                log.warning("%s; going on from %d because failOnDataLoss=false", msg, off)
        if self._target is not None:
            for key in latest:
                latest[key] = min(latest[key], self._target.get(key, begin.get(key, 0)))
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return to_json(cap(begin, latest, max_rows))

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = plan_ranges(from_json(start, option="stream offset"), from_json(end, option="stream offset"))
        return self.planner.partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueRangePartition):
            return iter(())  # Spark's stand-in partition when planning found nothing to read
        return read_range(partition, fail_on_data_loss=self.opts.failOnDataLoss,
                          batch_size=self.opts.pullBatchSize, policy=self.opts.policy())

    def commit(self, end: dict) -> None:
        if not (self.opts.commitOffsets and self.opts.consumerGroup):
            return
        for key, off in from_json(end, option="stream offset").items():
            try:
                with BrokerHttp(self.planner.address(key), self.opts.policy()) as client:
                    client.request("PUT", f"/v1/groups/{self.opts.consumerGroup}/offsets/{key.topic}/{key.queue_id}",
                                   {"offset": off})
            except BrokerError as exc:
                # The checkpoint is the source of truth; the group's offset is for lag monitoring only.
                log.warning("could not commit %s/%s/%d=%d for group %s: %s", key.topic, key.group,
                            key.queue_id, off, self.opts.consumerGroup, exc)
