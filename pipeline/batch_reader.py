"""Batch reads: plan (group, queue, offset range) partitions once, pull them on the executors."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from ferrymq.pipeline.offsets import plan_ranges
from ferrymq.pipeline.options import ReadOptions
from ferrymq.pipeline.planner import Planner
from ferrymq.pipeline.pull import QueueRangePartition, read_range


class FerryBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        # Checked here so that bad offset options fail when the query is defined, not at run time.
        Planner(opts, streaming=False)

    def partitions(self) -> Sequence[InputPartition]:
        planner = Planner(self.opts, streaming=False)
        bounds = planner.bounds(tolerate_unavailable=False)
        start = planner.starting(bounds)
        end = planner.ending(bounds)
        return planner.partitions(plan_ranges(start, end, new_queue_start=0))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueueRangePartition):
            return iter(())  # Spark's stand-in partition when planning found nothing to read
        return read_range(partition, fail_on_data_loss=self.opts.failOnDataLoss,
                          batch_size=self.opts.pullBatchSize, policy=self.opts.policy())
