"""The ``ferrymq`` Spark data source and the archive/replay jobs, in Spark local mode against a real
standalone broker process."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pipeline_support import SMALL_SEGMENTS, create_topic, queue_bounds, send, spread, start_gap_broker
from support import BrokerProcess

pytestmark = pytest.mark.slow

os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from ferrymq.pipeline import register  # noqa: E402
from ferrymq.pipeline.jobs import archive, replay  # noqa: E402


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = (SparkSession.builder.master("local[2]").appName("ferrymq-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.streaming.minBatchesToRetain", "100")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def mod_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data", config=SMALL_SEGMENTS).start()
    yield b
    b.terminate()


def _read(spark: SparkSession, broker: BrokerProcess, topic: str, **options: Any) -> Any:
    r = spark.read.format("ferrymq").option("endpoint", broker.url).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v if isinstance(v, str) else json.dumps(v))
    return r.load()


def _signature(rows: list[Any]) -> Counter[tuple[Any, ...]]:
    return Counter((bytes(r["body"]), r["tags"], tuple(r["keys"]), tuple(sorted(r["properties"].items())))
                   for r in rows)


def test_batch_read_content_and_count_over_four_queues(spark: SparkSession, mod_broker: BrokerProcess) -> None:
    create_topic(mod_broker, "b4", 4)
    sent = send(mod_broker, "b4", spread("b4", 200, 4))
    df = _read(spark, mod_broker, "b4", maxMessagesPerPartition="30")
    assert df.schema.simpleString() == (
        "struct<topic:string,brokerGroup:string,queueId:int,queueOffset:bigint,msgId:string,tags:string,"
        "keys:array<string>,properties:map<string,string>,body:binary,bornTimestamp:timestamp,"
        "storeTimestamp:timestamp>")
    rows = df.collect()
    assert len(rows) == 200
    # 4 queues of 50, cut into pieces of at most 30 → 8 input partitions
    assert df.rdd.getNumPartitions() == 8
    by_id = {r["msgId"]: r for r in rows}
    assert set(by_id) == {s["msgId"] for s in sent}
    for s in sent:
        r = by_id[s["msgId"]]
        i = int(bytes(r["body"]).decode().split("-")[1])
        assert (r["queueId"], r["queueOffset"]) == (s["queueId"], s["queueOffset"])
        assert (r["topic"], r["brokerGroup"], r["tags"], r["keys"], r["properties"]) == (
            "b4", "standalone", f"t{i % 3}", [f"b4-k{i}"], {"n": str(i)})
        assert r["storeTimestamp"] >= r["bornTimestamp"] - dt.timedelta(seconds=1)
    counts = dict(df.groupBy("queueId").count().collect())
    assert counts == {0: 50, 1: 50, 2: 50, 3: 50}


def test_batch_read_offset_ranges_and_timestamp_start(spark: SparkSession, mod_broker: BrokerProcess) -> None:
    create_topic(mod_broker, "rng", 2)
    send(mod_broker, "rng", spread("early", 20, 2))
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.05)
    send(mod_broker, "rng", spread("late", 10, 2))
    ranged = _read(spark, mod_broker, "rng", startingOffsets={"rng": {"standalone": {"0": 3, "1": -1}}},
                   endingOffsets={"rng": {"standalone": {"0": 8}}})
    got = sorted((r["queueId"], r["queueOffset"]) for r in ranged.select("queueId", "queueOffset").collect())
    assert got == [(0, o) for o in range(3, 8)]
    late = _read(spark, mod_broker, "rng", startingTimestamp=str(cut_ms)).collect()
    assert sorted(bytes(r["body"]).decode() for r in late) == sorted(f"late-{i}" for i in range(10))
    # nothing to read is an empty DataFrame, not an error
    assert _read(spark, mod_broker, "rng", startingOffsets="latest").count() == 0


def test_batch_read_starts_from_a_consumer_groups_offsets(spark: SparkSession, mod_broker: BrokerProcess) -> None:
    create_topic(mod_broker, "cg", 2)
    send(mod_broker, "cg", spread("cg", 20, 2))
    assert mod_broker.call("PUT", "/v1/groups/billing/offsets/cg/0", {"offset": 7})[0] == 200
    rows = _read(spark, mod_broker, "cg", consumerGroup="billing").select("queueId", "queueOffset").collect()
    # queue 0 from the committed 7; queue 1 has no committed offset, so from startingOffsets (earliest)
    assert sorted((r[0], r[1]) for r in rows) == [(0, o) for o in range(7, 10)] + [(1, o) for o in range(10)]


def test_bad_options_fail_clearly(spark: SparkSession, mod_broker: BrokerProcess) -> None:
    with pytest.raises(Exception, match="startingOffsets must be 'earliest', 'latest' or a JSON object"):
        _read(spark, mod_broker, "b4", startingOffsets="yesterday").collect()
    with pytest.raises(Exception, match="topic 'missing' does not exist"):
        _read(spark, mod_broker, "missing").collect()


def _stream(spark: SparkSession, broker: BrokerProcess, topic: str, out: Path, ckpt: Path, *,
            available_now: bool, **options: str) -> Any:
    r = spark.readStream.format("ferrymq").option("endpoint", broker.url).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    w = (r.load().writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(ckpt)))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="100 milliseconds")
    return w.start()


def test_stream_restarted_from_checkpoint_delivers_every_message_once(
        spark: SparkSession, mod_broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(mod_broker, "st", 4)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    opts = {"startingOffsets": "earliest", "maxMessagesPerTrigger": "50"}
    send(mod_broker, "st", spread("a", 120, 4))
    q = _stream(spark, mod_broker, "st", out, ckpt, available_now=True, **opts)
    q.awaitTermination(120)
    assert [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]] == [50, 50, 20]

    # Second run: a continuous trigger, stopped in the middle while more data keeps arriving.
    send(mod_broker, "st", spread("b", 150, 4))
    q = _stream(spark, mod_broker, "st", out, ckpt, available_now=False, **opts)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and sum(p["numInputRows"] for p in q.recentProgress) < 50:
        time.sleep(0.05)
    send(mod_broker, "st", spread("c", 30, 4))
    q.stop()
    mid = sum(p["numInputRows"] for p in q.recentProgress)
    assert 50 <= mid < 180

    # Third run from the checkpoint: it picks up exactly where the stopped query left off.
    q = _stream(spark, mod_broker, "st", out, ckpt, available_now=True, **opts)
    q.awaitTermination(120)
    assert q.exception() is None

    rows = spark.read.parquet(str(out)).select("queueId", "queueOffset", "body").collect()
    keys = Counter((r["queueId"], r["queueOffset"]) for r in rows)
    assert max(keys.values()) == 1, "a message was delivered twice"
    assert sorted(bytes(r["body"]).decode() for r in rows) == sorted(
        [f"a-{i}" for i in range(120)] + [f"b-{i}" for i in range(150)] + [f"c-{i}" for i in range(30)])


def test_stream_picks_up_new_queues(spark: SparkSession, mod_broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(mod_broker, "grow", 1)
    send(mod_broker, "grow", spread("g1", 5, 1))
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = _stream(spark, mod_broker, "grow", out, ckpt, available_now=True, startingOffsets="earliest")
    q.awaitTermination(60)
    create_topic(mod_broker, "grow", 3)
    send(mod_broker, "grow", spread("g2", 9, 3))
    q = _stream(spark, mod_broker, "grow", out, ckpt, available_now=True, startingOffsets="earliest")
    q.awaitTermination(60)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(bytes(r["body"]).decode() for r in rows) == sorted(
        [f"g1-{i}" for i in range(5)] + [f"g2-{i}" for i in range(9)])


def test_write_then_read_back(spark: SparkSession, mod_broker: BrokerProcess) -> None:
    create_topic(mod_broker, "wr", 3)
    data = [(f"body-{i}", f"tag{i % 2}", [f"k{i}", f"x{i}"], {"i": str(i)}, (i % 3) if i % 2 else None)
            for i in range(60)]
    df = spark.createDataFrame(data, "body string, tags string, keys array<string>, "
                               "properties map<string,string>, queueId int")
    df.write.format("ferrymq").mode("append").option("endpoint", mod_broker.url).option("topic", "wr").save()
    back = _read(spark, mod_broker, "wr").collect()
    assert _signature(back) == Counter((b.encode(), t, tuple(k), tuple(p.items())) for b, t, k, p, _q in data)
    pinned = {bytes(r["body"]).decode(): r["queueId"] for r in back}
    assert all(pinned[b] == q for b, _t, _k, _p, q in data if q is not None)

    big = spark.createDataFrame([(b"ok",), (b"z" * (4 * 1024 * 1024 + 1),)], "body binary")
    with pytest.raises(Exception, match=r"cannot write row 1 of partition \d+ to topic 'wr': body is 4194305 bytes"):
        big.coalesce(1).write.format("ferrymq").mode("append").option("endpoint", mod_broker.url) \
            .option("topic", "wr").save()


def test_stream_write(spark: SparkSession, mod_broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(mod_broker, "src", 2)
    create_topic(mod_broker, "dst", 2)
    send(mod_broker, "src", spread("s", 40, 2))
    src = (spark.readStream.format("ferrymq").option("endpoint", mod_broker.url).option("topic", "src")
           .option("startingOffsets", "earliest").load())
    q = (src.select(F.concat(F.lit("copy:"), F.col("body")).alias("body"), "tags", "keys", "properties")
         .writeStream.format("ferrymq").option("endpoint", mod_broker.url).option("topic", "dst")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(60)
    got = sorted(bytes(r["body"]).decode() for r in _read(spark, mod_broker, "dst").collect())
    assert got == sorted(f"copy:s-{i}" for i in range(40))


def test_retention_gap_with_fail_on_data_loss(spark: SparkSession, tmp_path: Path) -> None:
    gap, (lo, hi) = start_gap_broker(tmp_path, "gone")
    try:
        from_zero = json.dumps({"gone": {"standalone": {"0": 0}}})
        with pytest.raises(Exception, match=r"data loss in gone/standalone/queue 0: offsets \[0, \d+\)"):
            _read(spark, gap, "gone", startingOffsets=from_zero).count()
        tolerant = _read(spark, gap, "gone", startingOffsets=from_zero, failOnDataLoss="false")
        offsets = sorted(r[0] for r in tolerant.select("queueOffset").collect())
        lo_now = queue_bounds(gap, "gone")[0][0]
        assert offsets == list(range(offsets[0], hi)) and lo <= offsets[0] <= lo_now

        q = _stream(spark, gap, "gone", tmp_path / "o1", tmp_path / "c1", available_now=True,
                    startingOffsets=from_zero)
        with pytest.raises(Exception, match="data loss in gone/standalone/queue 0"):
            q.awaitTermination(60)
        q = _stream(spark, gap, "gone", tmp_path / "o2", tmp_path / "c2", available_now=True,
                    startingOffsets=from_zero, failOnDataLoss="false")
        q.awaitTermination(60)
        assert q.exception() is None
        streamed = sorted(r[0] for r in spark.read.parquet(str(tmp_path / "o2")).select("queueOffset").collect())
        assert streamed and streamed == list(range(streamed[0], hi)) and streamed[0] >= lo
    finally:
        gap.terminate()


def test_archive_then_replay_round_trips(spark: SparkSession, mod_broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(mod_broker, "arc", 3)
    create_topic(mod_broker, "restored", 3)
    first = spread("r1", 45, 3)
    first[0]["bodyBase64"] = "AAEC/w=="  # not UTF-8: bytes must survive as bytes
    del first[0]["body"]
    send(mod_broker, "arc", first)
    out = str(tmp_path / "archive")
    res = archive(spark, endpoint=mod_broker.url, topic="arc", output=out, max_messages_per_trigger=20)
    assert res.messages == 45
    send(mod_broker, "arc", spread("r2", 15, 3))
    # incremental: the second run archives only what arrived since the first
    assert archive(spark, endpoint=mod_broker.url, topic="arc", output=out).messages == 15
    assert archive(spark, endpoint=mod_broker.url, topic="arc", output=out).messages == 0
    archived = spark.read.parquet(out)
    today = dt.datetime.now(dt.UTC).date()
    assert {r[0] for r in archived.select("date").distinct().collect()} <= {today, today - dt.timedelta(days=1)}
    assert (tmp_path / "archive" / f"date={today.isoformat()}").is_dir()

    assert replay(spark, endpoint=mod_broker.url, topic="restored", input_path=out).messages == 60
    original = _signature(_read(spark, mod_broker, "arc").collect())
    assert sum(original.values()) == 60
    assert _signature(_read(spark, mod_broker, "restored").collect()) == original

    # a date range outside the archive replays nothing
    assert replay(spark, endpoint=mod_broker.url, topic="restored", input_path=out,
                  from_date=today + dt.timedelta(days=1)).messages == 0


def test_cli_archive_job(mod_broker: BrokerProcess, tmp_path: Path) -> None:
    create_topic(mod_broker, "clijob", 2)
    send(mod_broker, "clijob", spread("j", 10, 2))
    out = tmp_path / "arch"
    proc = subprocess.run([sys.executable, "-m", "ferrymq", "pipeline", "archive", "--endpoint", mod_broker.url,
                           "--topic", "clijob", "--output", str(out), "--master", "local[1]"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["job"] == "archive" and summary["messages"] == 10
    assert summary["checkpoint"] == f"{out}/_checkpoint"
    bad = subprocess.run([sys.executable, "-m", "ferrymq", "pipeline", "replay", "--endpoint", mod_broker.url,
                          "--topic", "clijob", "--input", str(tmp_path / "nothing-here")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines()[-1] == f"ferrymq pipeline: no Parquet archive at {tmp_path}/nothing-here"
