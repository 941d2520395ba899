"""Spark read benchmark: messages/s read into a DataFrame (local[2]) against the raw pull rate of one
HTTP client over the same data, printed as a ratio.

    python -m bench.pipeline_bench [--messages 200000] [--body-size 256] [--queues 4] [--runs 3]

Setup: a standalone broker (ASYNC_FLUSH) on 127.0.0.1, one topic with --queues queues holding
--messages messages of --body-size bytes, all in the page cache.
- raw pull: one client, one keep-alive connection, ``GET .../messages?maxMessages=1024`` in a loop over
  every queue, JSON decoded (what any client must do), bodies left as base64.
- executor path: the same pulls through ``pull.read_range`` in this process, i.e. also base64-decoding
  bodies and building Arrow record batches (the work one Spark task does).
- Spark: ``spark.read.format("ferrymq")...load()`` written to the ``noop`` sink (every row materialised,
  nothing stored), local[2], one input partition per queue; the first run warms the JVM and the Python
  workers and is not counted.
Each figure is the best of --runs. The broker shares the machine's cores with the readers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import BrokerProcess, kill_all  # noqa: E402

from bench.report import RESULTS_DIR, load_average  # noqa: E402
from ferrymq.pipeline.broker_http import BrokerHttp, RetryPolicy  # noqa: E402
from ferrymq.pipeline.pull import QueueRangePartition, read_range  # noqa: E402

TOPIC = "bench"


def fill(broker: BrokerProcess, messages: int, body_size: int, queues: int) -> dict[int, int]:
    body = "x" * body_size
    batch = 1000
    with BrokerHttp(broker.url) as client:
        client.request("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": queues, "writeQueueNums": queues})
        for i in range(0, messages, batch):
            n = min(batch, messages - i)
            client.request("POST", f"/v1/topics/{TOPIC}/messages",
                           {"messages": [{"body": body, "queueId": (i // batch) % queues} for _ in range(n)]})
        desc = client.get(f"/v1/topics/{TOPIC}")
    return {q["queueId"]: q["maxOffset"] for q in desc["queues"]}


def raw_pull(url: str, ends: dict[int, int]) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with BrokerHttp(url) as client:
        for q, end in ends.items():
            off = 0
            while off < end:
                ans = client.get(f"/v1/topics/{TOPIC}/queues/{q}/messages", offset=off, maxMessages=1024)
                n += len(ans["messages"])
                off = ans["nextOffset"]
    return n, time.perf_counter() - t0


def executor_path(url: str, ends: dict[int, int]) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    for q, end in ends.items():
        p = QueueRangePartition(TOPIC, "standalone", url, q, 0, end, url)
        for batch in read_range(p, fail_on_data_loss=True, batch_size=1024, policy=RetryPolicy()):
            n += batch.num_rows
    return n, time.perf_counter() - t0


def spark_read(url: str, runs: int, total: int) -> list[float]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from ferrymq.pipeline import register

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    try:
        secs = []
        for i in range(runs + 1):
            df = spark.read.format("ferrymq").option("endpoint", url).option("topic", TOPIC).load()
            t0 = time.perf_counter()
            df.write.format("noop").mode("overwrite").save()
            if i:  # run 0 warms up the JVM and the Python workers
                secs.append(time.perf_counter() - t0)
        counted = spark.read.format("ferrymq").option("endpoint", url).option("topic", TOPIC).load().count()
        assert counted == total, f"Spark read {counted} of {total} messages"
        return secs
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--body-size", type=int, default=256)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrymq-pipeline-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", flush="async").start()
        try:
            t0 = time.perf_counter()
            ends = fill(broker, args.messages, args.body_size, args.queues)
            total = sum(ends.values())
            print(f"filled {total} messages of {args.body_size} B over {args.queues} queues in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
            raw = [raw_pull(broker.url, ends) for _ in range(args.runs)]
            assert all(n == total for n, _ in raw)
            exe = [executor_path(broker.url, ends) for _ in range(args.runs)]
            assert all(n == total for n, _ in exe)
            spark = spark_read(broker.url, args.runs, total)
        finally:
            broker.terminate()
            kill_all()
    raw_rate = total / min(s for _, s in raw)
    exe_rate = total / min(s for _, s in exe)
    spark_rate = total / min(spark)
    rows = [
        ("raw pull, 1 HTTP client (JSON decoded)", raw_rate, [total / s for _, s in raw]),
        ("executor path, 1 process (+ base64, Arrow)", exe_rate, [total / s for _, s in exe]),
        ("Spark local[2] -> DataFrame (noop sink)", spark_rate, [total / s for s in spark]),
    ]
    print(f"\nload average {load_average()}; {os.cpu_count()} CPUs; best of {args.runs} runs")
    print(f"{'what':<46} {'msgs/s':>10} {'median':>10} {'x raw pull':>11}")
    for name, best, all_rates in rows:
        print(f"{name:<46} {best:>10.0f} {statistics.median(all_rates):>10.0f} {best / raw_rate:>11.2f}")
    print(f"\nratio Spark / raw pull = {spark_rate / raw_rate:.2f}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    doc = {"kind": "pipeline", "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": load_average(),
           "settings": vars(args), "messages": total,
           "rows": [{"name": n, "best_msgs_per_s": round(b), "median_msgs_per_s": round(statistics.median(a)),
                     "ratio_of_raw_pull": round(b / raw_rate, 3)} for n, b, a in rows]}
    (RESULTS_DIR / "pipeline-latest.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
