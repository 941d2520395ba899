"""Transactions and send-back over raw TCP frames against a real broker process: END_TRANSACTION,
CHECK_TRANSACTION_STATE to a live producer of the group when the sending producer died, and
CONSUMER_SEND_MSG_BACK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from message_types_support import FAST_LEVELS, SMALL_STORE, RawTcpClient, pull_all, pull_topic
from support import BrokerProcess, wait_until

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.common import record
from ferrymq.common.message import parse_offset_msg_id

CONFIG = {**SMALL_STORE, "transactionCheckInterval": 200, "transactionTimeOut": 500, "messageDelayLevel": FAST_LEVELS}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("txtcp")) / "data", config=CONFIG).start()
    assert b.call("PUT", "/v1/topics/pay", {"readQueueNums": 2, "writeQueueNums": 2})[0] == 200
    yield b
    b.terminate()


def _half(c: RawTcpClient, body: bytes, uniq: str, group: str = "tpg") -> int:
    r = c.request(RequestCode.SEND_MESSAGE, {"topic": "pay", "props": {"TRAN_MSG": "true", "PGROUP": group,
                                                                       "UNIQ_KEY": uniq}}, body)
    assert r.code == 0, r.remark
    return parse_offset_msg_id(r.ext["msgId"])


def _visible(b: BrokerProcess, body: str) -> list[dict]:
    return [m for m in pull_topic(b.url, "pay", 2) if m["body"] == body]


def test_end_transaction_commit_and_rollback(broker: BrokerProcess) -> None:
    c = RawTcpClient(broker.tcp_port)
    try:
        c.heartbeat("p-1", ["tpg"])
        off = _half(c, b"tcp-commit", "U-C")
        assert _visible(broker, "tcp-commit") == []
        wrong = c.request(RequestCode.END_TRANSACTION, {"producerGroup": "other", "commitLogOffset": off,
                                                        "commitOrRollback": "COMMIT"})
        assert wrong.code != 0 and wrong.ext["error"] == "NO_PERMISSION"
        r = c.request(RequestCode.END_TRANSACTION, {"producerGroup": "tpg", "commitLogOffset": off,
                                                    "commitOrRollback": "COMMIT"})
        assert r.code == 0 and r.ext["state"] == "COMMIT" and r.ext["transactionId"] == "U-C", r.remark
        again = c.request(RequestCode.END_TRANSACTION, {"producerGroup": "tpg", "commitLogOffset": off,
                                                        "commitOrRollback": 8})
        assert again.code == 0 and again.ext["alreadyResolved"] is True
        assert len(_visible(broker, "tcp-commit")) == 1
        off = _half(c, b"tcp-rollback", "U-R")
        r = c.request(RequestCode.END_TRANSACTION, {"producerGroup": "tpg", "commitLogOffset": off,
                                                    "commitOrRollback": 12})  # RocketMQ's ROLLBACK number
        assert r.code == 0 and r.ext["state"] == "ROLLBACK"
        bad = c.request(RequestCode.END_TRANSACTION, {"producerGroup": "tpg", "commitLogOffset": off,
                                                      "commitOrRollback": "MAYBE"})
        assert bad.code != 0 and bad.ext["error"] == "INVALID_REQUEST"
        assert _visible(broker, "tcp-rollback") == []
    finally:
        c.close()


def test_dead_producers_transaction_is_answered_by_a_peer(broker: BrokerProcess) -> None:
    dying, peer = RawTcpClient(broker.tcp_port), RawTcpClient(broker.tcp_port)
    try:
        dying.heartbeat("p-dying", ["tpg2"])
        peer.heartbeat("p-peer", ["tpg2"])
        _half(dying, b"orphan", "U-ORPHAN", group="tpg2")
        dying.close()  # dies with its transaction open
        notice = peer.wait_notice(RequestCode.CHECK_TRANSACTION_STATE, 15)
        assert notice is not None and notice.is_oneway
        assert notice.ext["transactionId"] == "U-ORPHAN" and notice.ext["producerGroup"] == "tpg2"
        assert notice.ext["topic"] == "pay"
        half = record.decode(notice.body)
        assert half.body == b"orphan" and half.properties["REAL_TOPIC"] == "pay"
        assert half.physical_offset == notice.ext["commitLogOffset"]
        assert half.properties["TRANSACTION_CHECK_TIMES"] == "1"
        peer.oneway(RequestCode.END_TRANSACTION, {
            "producerGroup": "tpg2", "commitLogOffset": notice.ext["commitLogOffset"],
            "tranStateTableOffset": notice.ext["tranStateTableOffset"], "commitOrRollback": "COMMIT",
            "fromTransactionCheck": True})
        wait_until(lambda: _visible(broker, "orphan"), 10, what="the peer's commit")
        assert len(_visible(broker, "orphan")) == 1
    finally:
        peer.close()


def test_consumer_send_back(broker: BrokerProcess) -> None:
    status, out = broker.call("POST", "/v1/topics/pay/messages", {"body": "fail-me", "queueId": 0})
    assert status == 200, out
    off = parse_offset_msg_id(out["results"][0]["msgId"])
    c = RawTcpClient(broker.tcp_port)
    try:
        r = c.request(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "tcg", "offset": off, "delayLevel": 0,
                                                           "maxReconsumeTimes": 16})
        assert r.code == 0 and r.ext["topic"] == "%RETRY%tcg" and r.ext["delayLevel"] == 3, r.remark
        [m] = wait_until(lambda: pull_all(broker.url, "%RETRY%tcg", 0)[0], 10, what="the retry")
        assert m["body"] == "fail-me" and m["reconsumeTimes"] == 1 and m["properties"]["RETRY_TOPIC"] == "pay"
        missing = c.request(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "tcg"})
        assert missing.code != 0 and missing.ext["error"] == "INVALID_REQUEST"
    finally:
        c.close()
