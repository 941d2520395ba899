"""Consumer send-back, %RETRY% and %DLQ% against a real broker process (delay levels scaled down to
level N = N x 100 ms; maxReconsumeTimes 3), driven over HTTP; the CLI lists and re-sends DLQ messages."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from message_types_support import FAST_LEVELS, SMALL_STORE, pull_all
from support import BrokerProcess, wait_until

MAX_RECONSUME = 3
CONFIG = {**SMALL_STORE, "messageDelayLevel": FAST_LEVELS, "maxReconsumeTimes": MAX_RECONSUME}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("retry")) / "data", config=CONFIG).start()
    yield b
    b.terminate()


def _topic(b: BrokerProcess, name: str) -> None:
    assert b.call("PUT", f"/v1/topics/{name}", {"readQueueNums": 1, "writeQueueNums": 1})[0] == 200


def _send(b: BrokerProcess, topic: str, body: str) -> str:
    status, out = b.call("POST", f"/v1/topics/{topic}/messages", {"body": body, "keys": ["k-" + body]})
    assert status == 200, out
    return str(out["results"][0]["msgId"])


def _always_failing_consumer(b: BrokerProcess, topic: str, group: str, body: str,
                             send_back: dict[str, Any] | None = None, timeout: float = 20) -> list[dict[str, Any]]:
    """Consume ``topic`` and the group's retry topic, failing every message: each delivery is sent
    back. Returns the deliveries of ``body`` in order, until it is dead-lettered."""
    offsets = {topic: 0, f"%RETRY%{group}": 0}
    deliveries: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for t in offsets:
            msgs, offsets[t] = pull_all(b.url, t, 0, offsets[t])
            for m in msgs:
                if m["body"] != body:
                    continue
                deliveries.append({**m, "seenAt": time.time()})
                status, out = b.call("POST", f"/v1/groups/{group}/send-back",
                                     {"msgId": m["msgId"], **(send_back or {})})
                assert status == 200, out
                if out["deadLetter"]:
                    return deliveries
        time.sleep(0.02)
    raise AssertionError(f"{body} was not dead-lettered; deliveries: {len(deliveries)}")


def test_always_failing_message_is_retried_then_dead_lettered(broker: BrokerProcess) -> None:
    _topic(broker, "work")
    original = _send(broker, "work", "poison")
    deliveries = _always_failing_consumer(broker, "work", "cg", "poison")
    assert len(deliveries) == MAX_RECONSUME + 1
    assert [d["reconsumeTimes"] for d in deliveries] == list(range(MAX_RECONSUME + 1))
    assert deliveries[0]["topic"] == "work" and {d["topic"] for d in deliveries[1:]} == {"%RETRY%cg"}
    for d in deliveries[1:]:
        assert d["properties"]["RETRY_TOPIC"] == "work" and d["properties"]["ORIGIN_MESSAGE_ID"] == original
        assert d["keys"] == ["k-poison"]
    # growing intervals: retry k waits delay level 3 + (k - 1), i.e. 300, 400, 500 ms here
    gaps = [b["storeTimestamp"] - a["storeTimestamp"] for a, b in itertools.pairwise(deliveries)]
    for k, gap in enumerate(gaps):
        assert gap >= (3 + k) * 100 - 20, gaps
    status, dead = broker.call("GET", "/v1/groups/cg/dlq/messages")
    assert status == 200 and len(dead["messages"]) == 1
    d = dead["messages"][0]
    assert d["topic"] == "%DLQ%cg" and d["body"] == "poison" and d["reconsumeTimes"] == MAX_RECONSUME + 1
    assert d["properties"]["RETRY_TOPIC"] == "work" and d["properties"]["ORIGIN_MESSAGE_ID"] == original
    assert d["properties"]["RECONSUME_TIME"] == str(MAX_RECONSUME + 1)
    # the DLQ is write-only as in RocketMQ: no consumer reads it by accident
    assert broker.call("GET", "/v1/topics/%25DLQ%25cg/queues/0/messages?offset=0")[0] == 403
    status, cfg = broker.call("GET", "/v1/topics/%25RETRY%25cg")
    assert status == 200 and cfg["perm"] == "RW" and cfg["readQueueNums"] == 1


def test_per_subscription_max_and_direct_dead_letter(broker: BrokerProcess) -> None:
    _topic(broker, "work2")
    _send(broker, "work2", "twice")
    deliveries = _always_failing_consumer(broker, "work2", "cg2", "twice", {"maxReconsumeTimes": 1})
    assert len(deliveries) == 2
    msg_id = _send(broker, "work2", "hopeless")
    status, out = broker.call("POST", "/v1/groups/cg2/send-back", {"msgId": msg_id, "delayLevel": -1})
    assert status == 200 and out["deadLetter"] is True and out["topic"] == "%DLQ%cg2"


def test_bad_send_back_requests(broker: BrokerProcess) -> None:
    for body in ({}, {"msgId": "zz"}, {"msgId": "7F000001000000000000000000000000", "delayLevel": "x"}):
        status, out = broker.call("POST", "/v1/groups/cg/send-back", body)
        assert status == 400 and "error" in out, out
    status, out = broker.call("POST", "/v1/groups/cg/send-back", {"msgId": "7F0000010000000000000000FFFFFFFF"})
    assert status == 404
    status, out = broker.call("POST", "/v1/groups/bad%20group/send-back", {"msgId": "7F000001000000000000000000000000"})
    assert status == 400


def _cli(b: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferrymq", "dlq", *args, "--server", b.url],
                          capture_output=True, text=True, timeout=60)


def test_cli_lists_and_resends(broker: BrokerProcess) -> None:
    _topic(broker, "work3")
    original = _send(broker, "work3", "revive")
    out = broker.call("POST", "/v1/groups/cg3/send-back", {"msgId": original, "delayLevel": -1})[1]
    assert out["deadLetter"] is True
    listed = _cli(broker, "list", "--group", "cg3")
    assert listed.returncode == 0, listed.stderr
    [entry] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert entry["originTopic"] == "work3" and entry["originMsgId"] == original and entry["body"] == "revive"
    resent = _cli(broker, "resend", "--group", "cg3", "--msg-id", entry["msgId"])
    assert resent.returncode == 0, resent.stderr
    assert json.loads(resent.stdout)["topic"] == "work3"
    msgs = wait_until(lambda: [m for m in pull_all(broker.url, "work3", 0)[0] if m["body"] == "revive"], 5)
    assert len(msgs) == 2 and msgs[1]["properties"]["ORIGIN_MESSAGE_ID"] == original
    assert msgs[1]["reconsumeTimes"] == 0 and "RETRY_TOPIC" not in msgs[1]["properties"]
    bad = _cli(broker, "resend", "--group", "cg3", "--msg-id", original)  # not a DLQ message
    assert bad.returncode == 1 and "INVALID_REQUEST" in bad.stderr
