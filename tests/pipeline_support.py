"""Helpers shared by the pipeline tests: topics, sends, and a broker whose retention has cut a queue."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from support import BrokerProcess

# Small commit-log segments: the default preallocates 1 GiB per broker, more disk than these tests need.
SMALL_SEGMENTS: dict[str, Any] = {"mappedFileSizeCommitLog": 16 * 1024 * 1024}

# A broker that deletes commit-log segments about a second after they fill: 64 KiB segments,
# fileReservedTime 0.0003 h (~1 s), a retention pass every 100 ms, at any hour.
RETENTION_CONFIG: dict[str, Any] = {
    "mappedFileSizeCommitLog": 64 * 1024,
    "fileReservedTime": 0.0003,
    "cleanResourceInterval": 100,
    "deleteWhen": ";".join(str(h) for h in range(24)),
}


def create_topic(broker: BrokerProcess, topic: str, queues: int) -> None:
    status, body = broker.call("PUT", f"/v1/topics/{topic}",
                               {"readQueueNums": queues, "writeQueueNums": queues, "perm": "RW"})
    assert status == 200, body


def send(broker: BrokerProcess, topic: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i in range(0, len(messages), 200):
        status, body = broker.call("POST", f"/v1/topics/{topic}/messages", {"messages": messages[i:i + 200]})
        assert status == 200, body
        out.extend(body["results"])
    return out


def spread(prefix: str, count: int, queues: int, **extra: Any) -> list[dict[str, Any]]:
    """``count`` distinct messages spread round-robin over ``queues`` queues."""
    return [{"body": f"{prefix}-{i}", "queueId": i % queues, "tags": f"t{i % 3}", "keys": [f"{prefix}-k{i}"],
             "properties": {"n": str(i)}, **extra} for i in range(count)]


def queue_bounds(broker: BrokerProcess, topic: str) -> dict[int, tuple[int, int]]:
    status, body = broker.call("GET", f"/v1/topics/{topic}")
    assert status == 200, body
    return {q["queueId"]: (q["minOffset"], q["maxOffset"]) for q in body["queues"]}


def start_gap_broker(root: Path, topic: str, count: int = 400) -> tuple[BrokerProcess, tuple[int, int]]:
    """A broker whose queue 0 of ``topic`` has lost its first messages to retention.

    Returns the broker and queue 0's (minOffset, maxOffset); minOffset > 0 is the retention gap. It waits
    until every full segment is gone (only the active one, never deleted, is left), so the minimum stays
    put while a test reads.
    """
    broker = BrokerProcess(root / "gap-data", config=RETENTION_CONFIG).start()
    create_topic(broker, topic, 1)
    body = "x" * 1000
    send(broker, topic, [{"body": f"{i}:{body}", "queueId": 0} for i in range(count)])
    deadline = time.monotonic() + 60
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        lo, hi = queue_bounds(broker, topic)[0]
        if lo != last:
            last, since = lo, time.monotonic()
        elif lo > 0 and time.monotonic() - since > 2.5:  # two segment lifetimes without a change
            return broker, (lo, hi)
        time.sleep(0.1)
    broker.terminate()
    raise AssertionError(f"retention did not settle (minOffset {last}): {broker.log_tail()}")
