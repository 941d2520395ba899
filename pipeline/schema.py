"""The contract's row schema, and pulled messages turned into Arrow record batches of it.

Readers hand Spark Arrow batches rather than tuples: one columnar batch per pull answer skips
Spark's per-value Python conversion, which dominates the cost of reading.
"""

from __future__ import annotations

import binascii
from functools import cache
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType([
    StructField("topic", StringType()),
    StructField("brokerGroup", StringType()),
    StructField("queueId", IntegerType()),
    StructField("queueOffset", LongType()),
    StructField("msgId", StringType()),
    StructField("tags", StringType()),
    StructField("keys", ArrayType(StringType())),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("body", BinaryType()),
    StructField("bornTimestamp", TimestampType()),
    StructField("storeTimestamp", TimestampType()),
])
COLUMNS = tuple(SCHEMA.fieldNames())


@cache
def arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    # Spark checks a returned batch's schema for equality with exactly this conversion.
    return to_arrow_schema(SCHEMA, timezone="UTC")


def to_batch(topic: str, group: str, msgs: list[dict[str, Any]]) -> pa.RecordBatch:
    """Messages as the pull API returns them → one record batch of the row schema."""
    s = arrow_schema()
    n = len(msgs)
    cols = [
        pa.array([topic] * n, s.field("topic").type),
        pa.array([group] * n, s.field("brokerGroup").type),
        pa.array([m["queueId"] for m in msgs], s.field("queueId").type),
        pa.array([m["queueOffset"] for m in msgs], s.field("queueOffset").type),
        pa.array([m.get("msgId") for m in msgs], s.field("msgId").type),
        pa.array([m.get("tags") for m in msgs], s.field("tags").type),
        pa.array([m.get("keys") or [] for m in msgs], s.field("keys").type),
        pa.array([list((m.get("properties") or {}).items()) for m in msgs], s.field("properties").type),
        pa.array([binascii.a2b_base64(m["bodyBase64"]) for m in msgs], s.field("body").type),
        pa.array([m["bornTimestamp"] * 1000 for m in msgs], s.field("bornTimestamp").type),
        pa.array([m["storeTimestamp"] * 1000 for m in msgs], s.field("storeTimestamp").type),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=s)
