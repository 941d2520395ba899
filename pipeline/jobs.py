"""Pipeline jobs: archive a topic to Parquet incrementally, replay an archive into a topic.

Run as ``ferrymq pipeline archive|replay ...``, ``python -m ferrymq.pipeline archive|replay ...`` or
``spark-submit pipeline/jobs.py archive|replay ...``. Without ``--master`` (and outside spark-submit)
Spark runs in local mode.

archive: a streaming query with ``trigger(availableNow=True)``: it reads what the topic holds past the
checkpoint, appends it to Parquet partitioned by ``date`` (the storeTimestamp's day in the session
time zone, UTC unless --timezone says otherwise), commits the checkpoint, and stops. Run it again
(cron, Airflow) to archive what arrived since; each message lands in the archive exactly once.

replay: reads the archive (or a date range of it) and writes every message into a topic, keeping
each source queue's order within its task (at-least-once, as every write).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_ENDPOINT = os.environ.get("FERRYMQ_SERVER", "http://127.0.0.1:8080")
ARCHIVE_COLUMNS = ("topic", "brokerGroup", "queueId", "queueOffset", "msgId", "tags", "keys", "properties",
                   "body", "bornTimestamp", "storeTimestamp")


class JobError(Exception):
    """A one-line failure for the user."""


@dataclass
class ArchiveResult:
    topic: str
    output: str
    checkpoint: str
    batches: int
    messages: int


@dataclass
class ReplayResult:
    topic: str
    input: str
    messages: int


def default_checkpoint(output: str) -> str:
    # Beside the data, under a name Parquet readers skip ('_' prefix), so one path is one archive.
    return output.rstrip("/") + "/_checkpoint"


def archive(spark: SparkSession, *, endpoint: str, topic: str, output: str, checkpoint: str | None = None,
            starting_offsets: str = "earliest", max_messages_per_trigger: int | None = None,
            options: dict[str, str] | None = None) -> ArchiveResult:
    from pyspark.sql import functions as F

    from ferrymq.pipeline import register

    register(spark)
    checkpoint = checkpoint or default_checkpoint(output)
    reader = (spark.readStream.format("ferrymq").option("endpoint", endpoint).option("topic", topic)
              .option("startingOffsets", starting_offsets))
    if max_messages_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(max_messages_per_trigger))
    for k, v in (options or {}).items():
        reader = reader.option(k, v)
    df = reader.load().withColumn("date", F.date_format(F.col("storeTimestamp"), "yyyy-MM-dd"))
    query = (df.writeStream.format("parquet").option("path", output).option("checkpointLocation", checkpoint)
             .partitionBy("date").outputMode("append").trigger(availableNow=True)
             .queryName(f"ferrymq-archive-{topic}").start())
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p.get("batchId") is not None]
    rows = sum(int(p.get("numInputRows", 0)) for p in progress)
    return ArchiveResult(topic, output, checkpoint, len({p["batchId"] for p in progress if p.get("numInputRows")}),
                         rows)


def replay(spark: SparkSession, *, endpoint: str, topic: str, input_path: str, from_date: dt.date | None = None,
           to_date: dt.date | None = None, keep_queue_ids: bool = False,
           options: dict[str, str] | None = None) -> ReplayResult:
    from pyspark.sql import functions as F

    from ferrymq.pipeline import register

    register(spark)
    if not _has_parquet(input_path):
        raise JobError(f"no Parquet archive at {input_path}")
    df = spark.read.parquet(input_path)
    missing = [c for c in ("body", "tags", "keys", "properties", "date") if c not in df.columns]
    if missing:
        raise JobError(f"{input_path} is not a ferrymq archive: it lacks column(s) {missing}")
    # Partition pruning on the date directories: only the chosen days are read.
    if from_date is not None:
        df = df.where(F.col("date") >= F.lit(from_date.isoformat()).cast("date"))
    if to_date is not None:
        df = df.where(F.col("date") <= F.lit(to_date.isoformat()).cast("date"))
    order = [c for c in ("brokerGroup", "queueId", "queueOffset") if c in df.columns]
    if order[:2] == ["brokerGroup", "queueId"]:
        # One source queue per task, in offset order: replay keeps each queue's order.
        df = df.repartition(F.col("brokerGroup"), F.col("queueId")).sortWithinPartitions(*order)
    cols = ["body", "tags", "keys", "properties"] + (["queueId"] if keep_queue_ids else [])
    df = df.select(*cols).cache()
    try:
        count = df.count()
        writer = df.write.format("ferrymq").mode("append").option("endpoint", endpoint).option("topic", topic)
        for k, v in (options or {}).items():
            writer = writer.option(k, v)
        if count:
            writer.save()
    finally:
        df.unpersist()
    return ReplayResult(topic, input_path, count)


def _has_parquet(path: str) -> bool:
    if "://" in path and not path.startswith("file://"):
        return True  # remote file systems: let Spark tell
    local = Path(path.removeprefix("file://"))
    return local.exists() and any(p.suffix == ".parquet" for p in local.rglob("*.parquet"))


# ---- command line --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ferrymq pipeline", description="Spark jobs over FerryMQ topics.")
    sub = p.add_subparsers(dest="job", metavar="JOB", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help="controller or standalone broker URL")
        sp.add_argument("--topic", required=True)
        sp.add_argument("--master", help="Spark master (default: local[*], or what spark-submit set)")
        sp.add_argument("--timezone", default="UTC", help="session time zone; it decides archive dates")
        sp.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="extra ferrymq data source option (repeatable)")

    sp = sub.add_parser("archive", help="append a topic's new messages to a Parquet archive partitioned by date")
    common(sp)
    sp.add_argument("--output", required=True, help="archive directory (any Hadoop path)")
    sp.add_argument("--checkpoint", help="checkpoint directory (default: OUTPUT/_checkpoint)")
    sp.add_argument("--starting-offsets", default="earliest",
                    help="where a new archive starts: earliest, latest or JSON (ignored once checkpointed)")
    sp.add_argument("--max-messages-per-trigger", type=int, help="messages per micro-batch")

    sp = sub.add_parser("replay", help="write an archive (or a date range of it) into a topic")
    common(sp)
    sp.add_argument("--input", required=True, help="archive directory")
    sp.add_argument("--from-date", type=dt.date.fromisoformat, help="first day, YYYY-MM-DD (inclusive)")
    sp.add_argument("--to-date", type=dt.date.fromisoformat, help="last day, YYYY-MM-DD (inclusive)")
    sp.add_argument("--keep-queue-ids", action="store_true",
                    help="send each message to its original queue id (the topic needs as many queues)")
    return p


def _options(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise JobError(f"--option takes KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def session(master: str | None, timezone: str, app: str) -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", timezone)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: local mode
        builder = builder.master("local[*]").config("spark.ui.enabled", "false")
    return builder.getOrCreate()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if "Error:" in line or "Exception:" in line:
            text = line
            break
    first = text.splitlines()[0] if text else type(exc).__name__
    return first[:500]


def run(argv: Sequence[str]) -> dict[str, Any]:
    args = build_parser().parse_args(list(argv))
    options = _options(args.option)
    if args.job == "replay" and args.from_date and args.to_date and args.from_date > args.to_date:
        raise JobError(f"--from-date {args.from_date} is after --to-date {args.to_date}")
    if args.job == "replay" and not _has_parquet(args.input):
        raise JobError(f"no Parquet archive at {args.input}")  # before paying for a Spark session
    spark = session(args.master, args.timezone, f"ferrymq-{args.job}-{args.topic}")
    try:
        if args.job == "archive":
            res: Any = archive(spark, endpoint=args.endpoint, topic=args.topic, output=args.output,
                               checkpoint=args.checkpoint, starting_offsets=args.starting_offsets,
                               max_messages_per_trigger=args.max_messages_per_trigger, options=options)
        else:
            res = replay(spark, endpoint=args.endpoint, topic=args.topic, input_path=args.input,
                         from_date=args.from_date, to_date=args.to_date, keep_queue_ids=args.keep_queue_ids,
                         options=options)
        return {"job": args.job, **asdict(res)}
    except JobError:
        raise
    except Exception as exc:
        raise JobError(_one_line(exc)) from exc
    finally:
        spark.stop()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        print(json.dumps(run(sys.argv[1:] if argv is None else argv)))
    except JobError as exc:
        print(f"ferrymq pipeline: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
