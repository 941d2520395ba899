"""Spark pipeline: the ``ferrymq`` data source (PySpark DataSource API) and archive/replay jobs.

``register(spark)`` makes ``spark.read.format("ferrymq")`` (and readStream, write, writeStream)
available in that session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    from ferrymq.pipeline.source import FerryDataSource

    spark.dataSource.register(FerryDataSource)


__all__ = ["register"]
