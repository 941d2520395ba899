"""Delay levels and deliverAtMs against a real broker process, with the levels scaled down
(level N = N x 100 ms) and a 100 ms timer tick."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from message_types_support import FAST_LEVELS, SMALL_STORE, RawTcpClient, pull_topic
from support import BrokerProcess, wait_until

from ferrymq.broker.protocol.request_codes import RequestCode

CONFIG = {**SMALL_STORE, "messageDelayLevel": FAST_LEVELS, "timerPrecisionMs": 100, "timerMaxDelaySec": 60}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("delay")) / "data", config=CONFIG).start()
    yield b
    b.terminate()


def _topic(b: BrokerProcess, name: str, queues: int = 2) -> None:
    status, body = b.call("PUT", f"/v1/topics/{name}", {"readQueueNums": queues, "writeQueueNums": queues})
    assert status == 200, body


def _delivered(b: BrokerProcess, topic: str, n: int, queues: int = 2, timeout: float = 10) -> list[dict]:
    return wait_until(lambda: (m := pull_topic(b.url, topic, queues)) and len(m) >= n and m, timeout,
                      interval=0.05, what=f"{n} messages in {topic}")


def test_each_level_waits_its_delay(broker: BrokerProcess) -> None:
    _topic(broker, "lv")
    levels = [1, 2, 3, 5, 8, 12]
    held: dict[str, dict] = {}
    for lvl in levels:
        status, body = broker.call("POST", "/v1/topics/lv/messages", {"body": f"L{lvl}", "delayLevel": lvl})
        assert status == 200, body
        r = body["results"][0]
        assert r["status"] == "SEND_OK" and 0 <= r["queueId"] < 2
        status, stored = broker.call("GET", f"/v1/messages/{r['msgId']}")
        assert status == 200 and stored["topic"] == "SCHEDULE_TOPIC_XXXX" and stored["queueId"] == lvl - 1
        assert stored["properties"]["REAL_TOPIC"] == "lv" and stored["properties"]["REAL_QID"] == str(r["queueId"])
        held[f"L{lvl}"] = stored
    # nothing is visible before its time (the shorter levels may be through already)
    assert "L12" not in {m["body"] for m in pull_topic(broker.url, "lv", 2)}
    got = _delivered(broker, "lv", len(levels))
    assert sorted(m["body"] for m in got) == sorted(held)
    for m in got:
        lvl = int(m["body"][1:])
        waited = m["storeTimestamp"] - held[m["body"]]["storeTimestamp"]
        # never early (a few ms of clock reading between the router and the store aside); not stuck either
        assert lvl * 100 - 20 <= waited <= lvl * 100 + 1500, (lvl, waited)
        assert "DELAY" not in m["properties"] and "REAL_TOPIC" not in m["properties"]
        assert m["bornTimestamp"] == held[m["body"]]["bornTimestamp"]


def test_level_above_the_highest_is_capped(broker: BrokerProcess) -> None:
    _topic(broker, "cap", 1)
    status, body = broker.call("POST", "/v1/topics/cap/messages", {"body": "x", "delayLevel": 200})
    assert status == 200
    status, stored = broker.call("GET", f"/v1/messages/{body['results'][0]['msgId']}")
    assert stored["queueId"] == 17  # level 18, the last one


def test_deliver_at_ms(broker: BrokerProcess) -> None:
    _topic(broker, "at")
    now = int(time.time() * 1000)
    wanted = {f"T{d}": now + d for d in (300, 700, 1200, 1900)}
    batch = {"messages": [{"body": k, "deliverAtMs": v} for k, v in wanted.items()]}
    status, body = broker.call("POST", "/v1/topics/at/messages", batch)
    assert status == 200, body
    got = _delivered(broker, "at", len(wanted))
    for m in got:
        late = m["storeTimestamp"] - wanted[m["body"]]
        assert 0 <= late <= 1000, (m["body"], late)  # precision: one 100 ms tick, plus scheduling slack
        assert "TIMER_DELIVER_MS" not in m["properties"]


def test_deliver_at_in_the_past_is_immediate(broker: BrokerProcess) -> None:
    _topic(broker, "past", 1)
    assert broker.call("POST", "/v1/topics/past/messages", {"body": "now", "deliverAtMs": 1})[0] == 200
    assert [m["body"] for m in pull_topic(broker.url, "past", 1)] == ["now"]


def test_bad_delay_requests(broker: BrokerProcess) -> None:
    _topic(broker, "bad", 1)
    far = int(time.time() * 1000) + 61_000
    for msg in ({"body": "x", "deliverAtMs": far},
                {"body": "x", "delayLevel": 2, "deliverAtMs": far - 30_000},
                {"body": "x", "properties": {"DELAY": "soon"}}):
        status, body = broker.call("POST", "/v1/topics/bad/messages", msg)
        assert status == 400 and body["error"]["code"] == "MESSAGE_ILLEGAL", body
    assert pull_topic(broker.url, "bad", 1) == []


def test_system_topics_are_hidden_and_closed_to_users(broker: BrokerProcess) -> None:
    status, body = broker.call("GET", "/v1/topics")
    names = {t["topicName"] for t in body["topics"]}
    assert not names & {"SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "RMQ_SYS_TRANS_HALF_TOPIC"}
    assert broker.call("GET", "/v1/routes/SCHEDULE_TOPIC_XXXX")[0] == 404
    for topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "rmq_sys_wheel_timer"):
        status, body = broker.call("POST", f"/v1/topics/{topic}/messages", {"body": "x"})
        assert status == 403 and body["error"]["code"] == "NO_PERMISSION"
        status, body = broker.call("DELETE", f"/v1/topics/{topic}")
        assert status == 403


def test_delay_over_tcp(broker: BrokerProcess) -> None:
    _topic(broker, "tcpd", 1)
    c = RawTcpClient(broker.tcp_port)
    try:
        r = c.request(RequestCode.SEND_MESSAGE, {"topic": "tcpd", "queueId": 0, "props": {"DELAY": "4"}}, b"over tcp")
        assert r.code == 0, r.remark
        sent = time.time()
        got = _delivered(broker, "tcpd", 1, queues=1)
        assert got[0]["body"] == "over tcp" and time.time() - sent >= 0.3
    finally:
        c.close()
