"""The pipeline's broker I/O without Spark: routes, pulling ranges, data loss, writing rows.

These run the code that Spark executors run (pull.read_range, writer.write_partition) directly against
a real standalone broker process.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pipeline_support import SMALL_SEGMENTS, create_topic, queue_bounds, send, spread, start_gap_broker
from pyspark.sql import Row
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, MapType, StringType, StructField, StructType
from support import BrokerProcess, free_port

from ferrymq.pipeline.broker_http import BrokerHttp, BrokerUnavailable, RetryPolicy
from ferrymq.pipeline.options import WriteOptions
from ferrymq.pipeline.pull import DataLossError, QueueRangePartition, read_range
from ferrymq.pipeline.routes import TopicNotFound, discover
from ferrymq.pipeline.schema import arrow_schema
from ferrymq.pipeline.writer import FerryWriteError, check_schema, write_partition

FAST = RetryPolicy(timeout_s=5, retries=1, backoff_s=0.01)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module (each test uses its own topics), shadowing conftest's per-test one."""
    b = BrokerProcess(tmp_path_factory.mktemp("io-broker") / "data", config=SMALL_SEGMENTS).start()
    yield b
    b.terminate()


def _rows(batches: Iterator[pa.RecordBatch]) -> list[dict]:
    out = []
    for b in batches:
        assert b.schema.equals(arrow_schema())
        out.extend(b.to_pylist())
    return out


def _partition(broker: BrokerProcess, topic: str, queue: int, start: int, end: int) -> QueueRangePartition:
    return QueueRangePartition(topic, "standalone", broker.url, queue, start, end, broker.url)


def test_routes_find_the_master_and_report_missing_topics(broker: BrokerProcess) -> None:
    create_topic(broker, "rt", 3)
    [route] = discover(broker.url, "rt")
    assert (route.group, route.address, route.read_queues, route.writable) == ("standalone", broker.url, 3, True)
    with pytest.raises(TopicNotFound, match="'nope' does not exist"):
        discover(broker.url, "nope")


def test_read_range_returns_exactly_the_range_in_order(broker: BrokerProcess) -> None:
    create_topic(broker, "rr", 2)
    sent = send(broker, "rr", spread("m", 60, 2))
    # batch_size 7 forces many pulls; the range starts and ends mid-queue
    rows = _rows(read_range(_partition(broker, "rr", 1, 3, 25), fail_on_data_loss=True, batch_size=7,
                            policy=FAST))
    assert [r["queueOffset"] for r in rows] == list(range(3, 25))
    by_offset = {(r["queueId"], r["queueOffset"]): r for r in sent}
    first = rows[0]
    assert first["msgId"] == by_offset[(1, 3)]["msgId"]
    assert first["body"] == b"m-7" and first["tags"] == "t1" and first["keys"] == ["m-k7"]
    assert first["properties"] == [("n", "7")]
    assert first["topic"] == "rr" and first["brokerGroup"] == "standalone"
    assert first["storeTimestamp"].tzinfo is not None


def test_retention_gap_fails_or_is_skipped(tmp_path: Path) -> None:
    gap, (lo, hi) = start_gap_broker(tmp_path, "gap")
    try:
        part = _partition(gap, "gap", 0, 0, hi)
        with pytest.raises(DataLossError, match=rf"gap/standalone/queue 0: offsets \[0, {lo}\).*failOnDataLoss"):
            list(read_range(part, fail_on_data_loss=True, batch_size=256, policy=FAST))
        rows = _rows(read_range(part, fail_on_data_loss=False, batch_size=256, policy=FAST))
        assert [r["queueOffset"] for r in rows] == list(range(lo, hi))
    finally:
        gap.terminate()


def test_planned_range_past_the_queue_end_is_data_loss(broker: BrokerProcess) -> None:
    create_topic(broker, "short", 1)
    send(broker, "short", spread("s", 5, 1))
    part = _partition(broker, "short", 0, 2, 9)
    with pytest.raises(DataLossError, match="now ends at 5"):
        list(read_range(part, fail_on_data_loss=True, batch_size=10, policy=FAST))
    assert [r["queueOffset"] for r in _rows(read_range(part, fail_on_data_loss=False, batch_size=10,
                                                       policy=FAST))] == [2, 3, 4]


def test_unreachable_broker_is_reported_after_retries() -> None:
    client = BrokerHttp(f"127.0.0.1:{free_port()}", FAST)
    with pytest.raises(BrokerUnavailable, match="UNREACHABLE"):
        client.get("/v1/health")


WRITE_SCHEMA = StructType([
    StructField("body", BinaryType()), StructField("tags", StringType()),
    StructField("keys", ArrayType(StringType())), StructField("properties", MapType(StringType(), StringType())),
    StructField("queueId", IntegerType()),
])


def _row(body: bytes | None, tags: str | None = None, keys: list[str] | None = None,
         properties: dict[str, str] | None = None, queue_id: int | None = None) -> Row:
    return Row(body=body, tags=tags, keys=keys, properties=properties, queueId=queue_id)


def test_write_partition_sends_every_row_in_batches(broker: BrokerProcess) -> None:
    create_topic(broker, "w", 2)
    opts = WriteOptions(endpoint=broker.url, topic="w", writeBatchSize=4)
    rows = [_row(f"b{i}".encode(), "tg", [f"k{i}"], {"p": str(i)}, i % 2 if i < 6 else None) for i in range(11)]
    done = write_partition(opts, check_schema(WRITE_SCHEMA), iter(rows))
    assert done.count == 11
    got = []
    for q, (lo, _hi) in queue_bounds(broker, "w").items():
        status, body = broker.call("GET", f"/v1/topics/w/queues/{q}/messages?offset={lo}&maxMessages=100")
        assert status == 200
        got += [(base64.b64decode(m["bodyBase64"]), m["tags"], m["keys"], m["properties"]) for m in body["messages"]]
    assert sorted(got) == sorted((f"b{i}".encode(), "tg", [f"k{i}"], {"p": str(i)}) for i in range(11))


@pytest.mark.parametrize("row, needle", [
    (_row(b"x" * (4 * 1024 * 1024 + 1), keys=["big"]), "body is 4194305 bytes; the limit is 4194304"),
    (_row(b"ok", properties={"p": "v" * 33000}), "encoded properties are"),
    (_row(None), "body is null"),
    (_row(b"ok", keys=["has space"]), "must be non-empty and contain no spaces"),
    (_row(b"ok", properties={"TAGS": "x"}), "reserved"),
])
def test_rows_over_the_limits_are_named_before_sending(broker: BrokerProcess, row: Row, needle: str) -> None:
    create_topic(broker, "lim", 1)
    opts = WriteOptions(endpoint=broker.url, topic="lim")
    rows = [_row(b"fine"), _row(b"fine too"), row]
    with pytest.raises(FerryWriteError, match="row 2 of partition 0") as info:
        write_partition(opts, check_schema(WRITE_SCHEMA), iter(rows))
    assert needle in str(info.value)


def test_broker_refusal_names_the_row(broker: BrokerProcess) -> None:
    create_topic(broker, "refuse", 2)
    opts = WriteOptions(endpoint=broker.url, topic="refuse")
    rows = [_row(b"a", queue_id=0), _row(b"b", keys=["kk"], queue_id=5)]
    with pytest.raises(FerryWriteError, match=r"refused row 1 of partition 0 \(keys=\['kk'\], queueId=5\).*"
                                              "MESSAGE_ILLEGAL.*writeQueueNums"):
        write_partition(opts, check_schema(WRITE_SCHEMA), iter(rows))


def test_write_schema_is_checked() -> None:
    with pytest.raises(FerryWriteError, match="needs a 'body' column"):
        check_schema(StructType([StructField("value", BinaryType())]))
    with pytest.raises(FerryWriteError, match="'properties' is map<string,int>; it must be map<string,string>"):
        check_schema(StructType([StructField("body", StringType()),
                                 StructField("properties", MapType(StringType(), IntegerType()))]))
    cols = check_schema(StructType([StructField("topic", StringType()), StructField("body", StringType()),
                                    StructField("keys", StringType())]))
    assert cols == {"body": 1, "keys": 2}
