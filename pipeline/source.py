"""The ``ferrymq`` data source: PySpark's DataSource API over the broker's HTTP API."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ferrymq.pipeline.options import PipelineOptionError, ReadOptions, WriteOptions, parse
from ferrymq.pipeline.schema import SCHEMA


class FerryDataSource(DataSource):
    """``spark.read.format("ferrymq").option("endpoint", URL).option("topic", T).load()``, likewise
    ``readStream``, ``df.write`` and ``writeStream``. Options: see docs/pipeline.md."""

    @classmethod
    def name(cls) -> str:
        return "ferrymq"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        from ferrymq.pipeline.batch_reader import FerryBatchReader

        _fixed_schema(schema)
        return FerryBatchReader(parse(ReadOptions, self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ferrymq.pipeline.stream_reader import FerryStreamReader

        _fixed_schema(schema)
        return FerryStreamReader(parse(ReadOptions, self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ferrymq.pipeline.writer import FerryBatchWriter

        return FerryBatchWriter(parse(WriteOptions, self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ferrymq.pipeline.writer import FerryStreamWriter

        return FerryStreamWriter(parse(WriteOptions, self.options), schema)


def _fixed_schema(schema: StructType) -> None:
    if schema != SCHEMA:
        raise PipelineOptionError(f"the ferrymq source has a fixed schema, {SCHEMA.simpleString()}; select or "
                                  f"cast columns after load() instead of giving .schema({schema.simpleString()})")
