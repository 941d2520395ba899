"""A restarted broker keeps its topics, group offsets and messages; SIGTERM flushes and exits cleanly."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support import BrokerProcess

CONFIG = {"mappedFileSizeCommitLog": 256 * 1024, "preallocateCommitLog": False}


def start(data: Path, flush: str = "sync", **extra: object) -> BrokerProcess:
    return BrokerProcess(data, flush=flush, config={**CONFIG, **extra}).start()


def last_start_line(broker: BrokerProcess) -> str:
    return [ln for ln in broker.log_path.read_text(errors="replace").splitlines() if " started on " in ln][-1]


def snapshot(broker: BrokerProcess, topics: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for t in topics:
        status, cfg = broker.call("GET", f"/v1/topics/{t}")
        assert status == 200, cfg
        out[t] = cfg
        for q in range(cfg["readQueueNums"]):
            status, page = broker.call("GET", f"/v1/topics/{t}/queues/{q}/messages?offset=0&maxMessages=1000")
            assert status == 200
            out[f"{t}/{q}"] = [(m["queueOffset"], m["msgId"], m["bodyBase64"], m["tags"]) for m in page["messages"]]
    return out


def populate(broker: BrokerProcess) -> None:
    assert broker.call("PUT", "/v1/topics/alpha", {"readQueueNums": 4, "writeQueueNums": 2, "perm": "RW"})[0] == 200
    assert broker.call("PUT", "/v1/topics/beta", {"readQueueNums": 1, "writeQueueNums": 1})[0] == 200
    for i in range(30):
        status, _ = broker.call("POST", "/v1/topics/alpha/messages", {"body": f"a{i}" * 50, "tags": f"t{i % 3}"})
        assert status == 200
    status, _ = broker.call("POST", "/v1/topics/beta/messages", {"messages": [{"body": f"b{i}"} for i in range(10)]})
    assert status == 200
    assert broker.call("PUT", "/v1/topics/beta", {"readQueueNums": 1, "writeQueueNums": 1, "perm": "R"})[0] == 200
    assert broker.call("PUT", "/v1/groups/g1/offsets/alpha/1", {"offset": 7})[0] == 200
    assert broker.call("PUT", "/v1/groups/g2/offsets/beta/0", {"offset": 10})[0] == 200


def offsets(broker: BrokerProcess) -> tuple[int, int, int]:
    return tuple(broker.call("GET", path)[1]["offset"] for path in (  # type: ignore[return-value]
        "/v1/groups/g1/offsets/alpha/1", "/v1/groups/g2/offsets/beta/0", "/v1/groups/g1/offsets/alpha/0"))


def test_sigterm_restart_keeps_topics_offsets_and_messages(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(data)
    try:
        populate(broker)
        before = snapshot(broker, ["alpha", "beta"])
        assert broker.terminate() == 0, broker.log_tail()
        assert "stopped cleanly" in broker.log_tail()
        assert not (data / "abort").exists()
        assert json.loads((data / "checkpoint").read_text())["clean"] is True

        broker = start(data)
        assert "clean start" in last_start_line(broker)
        assert snapshot(broker, ["alpha", "beta"]) == before
        assert offsets(broker) == (7, 10, -1)
        assert broker.call("GET", "/v1/topics/beta")[1]["perm"] == "R"
        status, body = broker.call("POST", "/v1/topics/alpha/messages", {"body": "after", "queueId": 1})
        assert status == 200 and body["results"][0]["queueOffset"] == 15, "queue offsets continue"
        status, body = broker.call("GET", "/v1/topics")
        assert sorted(t["topicName"] for t in body["topics"]) == ["alpha", "beta"]

        assert broker.call("DELETE", "/v1/topics/beta")[0] == 204
        assert broker.terminate() == 0
        broker = start(data)
        assert broker.call("GET", "/v1/topics/beta")[0] == 404, "a deleted topic stays deleted"
        assert broker.call("GET", "/v1/topics/alpha")[0] == 200
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.terminate()


@pytest.mark.slow
def test_kill9_keeps_topic_configs_and_persisted_offsets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(data)
    try:
        populate(broker)
        before = snapshot(broker, ["alpha", "beta"])
        # Group offsets reach the disk (write, fsync, rename) every few seconds: wait for that.
        path = data / "config" / "consumerOffset.json"
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if path.exists() and json.loads(path.read_text()).get("offsets", {}).get("g2"):
                break
            time.sleep(0.1)
        broker.kill9()
        broker = start(data)
        assert "recovered" in last_start_line(broker)
        assert snapshot(broker, ["alpha", "beta"]) == before
        assert offsets(broker) == (7, 10, -1)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.terminate()


def test_sigterm_under_async_flush_flushes_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # No flush on its own for a minute: only the shutdown can make these durable.
    broker = start(data, flush="async", flushIntervalCommitLog=60_000, flushCommitLogThoroughInterval=60_000,
                   flushCommitLogLeastPages=10_000)
    try:
        populate(broker)
        before = snapshot(broker, ["alpha", "beta"])
        assert broker.terminate() == 0
        cp = json.loads((data / "checkpoint").read_text())
        assert cp["clean"] and cp["log_flushed"] == cp["write_offset"] > 0
        broker = start(data, flush="async")
        assert "clean start" in last_start_line(broker)
        assert snapshot(broker, ["alpha", "beta"]) == before
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.terminate()


def test_a_data_dir_serves_one_broker_at_a_time(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(data)
    try:
        with pytest.raises(RuntimeError, match="in use"):
            BrokerProcess(data, flush="sync", config=CONFIG).start(timeout=15)
        assert broker.call("GET", "/v1/health")[0] == 200
    finally:
        broker.terminate()
