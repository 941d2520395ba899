"""Transactional messages over HTTP against a real broker process: prepare, commit, rollback, the
check-back to a producer's checkUrl (UNKNOWN, then COMMIT), discard after transactionCheckMax, and the
producer-group and exactly-once rules. Intervals are scaled down by configuration."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from message_types_support import SMALL_STORE, CheckServer, pull_all, pull_topic
from support import BrokerProcess, wait_until

CONFIG = {**SMALL_STORE, "transactionCheckInterval": 200, "transactionTimeOut": 300, "transactionCheckMax": 3}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("tx")) / "data", config=CONFIG).start()
    assert b.call("PUT", "/v1/topics/orders", {"readQueueNums": 2, "writeQueueNums": 2})[0] == 200
    yield b
    b.terminate()


@pytest.fixture(scope="module")
def checker() -> Iterator[CheckServer]:
    s = CheckServer()
    yield s
    s.close()


def _prepare(b: BrokerProcess, body: str, group: str = "pg", **extra: Any) -> dict[str, Any]:
    status, out = b.call("POST", "/v1/topics/orders/transactions", {"body": body, "producerGroup": group, **extra})
    assert status == 200, out
    return out


def _visible(b: BrokerProcess, body: str) -> list[dict[str, Any]]:
    return [m for m in pull_topic(b.url, "orders", 2) if m["body"] == body]


def test_commit_makes_it_visible_exactly_once(broker: BrokerProcess) -> None:
    half = _prepare(broker, "c1", tags="paid", keys=["o-1"], properties={"k": "v"})
    assert _visible(broker, "c1") == []  # a half message is invisible
    status, stored = broker.call("GET", f"/v1/messages/{half['msgId']}")
    assert stored["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC" and stored["properties"]["REAL_TOPIC"] == "orders"
    txid = half["transactionId"]
    status, out = broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "pg"})
    assert status == 200 and out["state"] == "COMMIT" and out["alreadyResolved"] is False, out
    [m] = _visible(broker, "c1")
    assert m["tags"] == "paid" and m["keys"] == ["o-1"] and m["properties"]["k"] == "v"
    assert "TRAN_MSG" not in m["properties"] and m["queueId"] == half["queueId"]
    # Committing again (or answering a check late) never makes a second copy.
    status, again = broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "pg"})
    assert status == 200 and again["alreadyResolved"] is True
    status, err = broker.call("POST", f"/v1/transactions/{txid}/rollback", {"producerGroup": "pg"})
    assert status == 409 and err["error"]["code"] == "CONFLICT"
    assert len(_visible(broker, "c1")) == 1


def test_rollback_discards(broker: BrokerProcess) -> None:
    txid = _prepare(broker, "r1")["transactionId"]
    status, out = broker.call("POST", f"/v1/transactions/{txid}/rollback", {"producerGroup": "pg"})
    assert status == 200 and out["state"] == "ROLLBACK"
    status, _ = broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "pg"})
    assert status == 409
    assert _visible(broker, "r1") == []


def test_producer_group_must_match(broker: BrokerProcess) -> None:
    txid = _prepare(broker, "g1")["transactionId"]
    status, err = broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "intruder"})
    assert status == 403 and err["error"]["code"] == "NO_PERMISSION"
    status, err = broker.call("POST", "/v1/transactions/NOPE/commit", {"producerGroup": "pg"})
    assert status == 404
    assert broker.call("POST", f"/v1/transactions/{txid}/rollback", {"producerGroup": "pg"})[0] == 200


def test_bad_prepare_requests(broker: BrokerProcess) -> None:
    for body in ({"body": "x"}, {"body": "x", "producerGroup": "pg", "checkUrl": "file:///etc/passwd"},
                 {"body": "x", "producerGroup": "bad group"}, {"messages": [{"body": "x"}], "producerGroup": "pg"}):
        status, out = broker.call("POST", "/v1/topics/orders/transactions", body)
        assert 400 <= status < 500 and "error" in out, (body, out)
    status, out = broker.call("POST", "/v1/topics/nope/transactions", {"body": "x", "producerGroup": "pg"})
    assert status == 404


def test_unknown_then_check_back_commits(broker: BrokerProcess, checker: CheckServer) -> None:
    half = _prepare(broker, "u1", checkUrl=checker.url)
    txid = half["transactionId"]
    checker.script[txid] = ["UNKNOWN", "COMMIT"]
    # The producer does not know yet: UNKNOWN leaves the transaction open.
    assert broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "other"})[0] == 403
    wait_until(lambda: _visible(broker, "u1"), 15, what="the check-back to commit")
    calls = checker.calls_for(txid)
    assert len(calls) == 2 and calls[0]["topic"] == "orders" and calls[0]["producerGroup"] == "pg"
    assert calls[0]["message"]["body"] == "u1" and [c["checkTimes"] for c in calls] == [1, 2]
    assert len(_visible(broker, "u1")) == 1
    status, again = broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "pg"})
    assert status == 200 and again["alreadyResolved"] is True


def test_check_back_rollback(broker: BrokerProcess, checker: CheckServer) -> None:
    txid = _prepare(broker, "u2", checkUrl=checker.url)["transactionId"]
    checker.script[txid] = ["ROLLBACK"]
    wait_until(lambda: checker.calls_for(txid), 15, what="a check")
    wait_until(lambda: broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "pg"})[0] == 409,
               10, what="the rollback")
    assert _visible(broker, "u2") == []


def test_discarded_after_check_max(broker: BrokerProcess, checker: CheckServer) -> None:
    txid = _prepare(broker, "never", checkUrl=checker.url)["transactionId"]
    checker.script[txid] = ["UNKNOWN"]

    def discarded() -> list[dict[str, Any]]:
        msgs, _ = pull_all(broker.url, "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC", 0)
        return [m for m in msgs if m["body"] == "never"]

    [m] = wait_until(discarded, 20, what="the discard")
    assert m["properties"]["TRANSACTION_CHECK_TIMES"] == "3"
    assert len(checker.calls_for(txid)) == 3  # transactionCheckMax checks, then no more
    status, err = broker.call("POST", f"/v1/transactions/{txid}/commit", {"producerGroup": "pg"})
    assert status == 409 and "DISCARDED" in err["error"]["message"]
    assert _visible(broker, "never") == []


def test_check_immunity_delays_the_first_check(broker: BrokerProcess, checker: CheckServer) -> None:
    txid = _prepare(broker, "imm", checkUrl=checker.url,
                    properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "2"})["transactionId"]
    checker.script[txid] = ["COMMIT"]
    wait_until(lambda: checker.calls_for(txid), 15, what="the first check")
    call = checker.calls_for(txid)[0]
    # transactionTimeOut alone (300 ms) would have checked at once; the immunity holds it for 2 s, and
    # the put-backs while immune are not counted as checks
    assert call["receivedMs"] >= call["message"]["bornTimestamp"] + 2000
    assert call["checkTimes"] == 1
    wait_until(lambda: _visible(broker, "imm"), 10, what="the commit")
