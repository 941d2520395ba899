"""Open transactions survive a broker restart: the check service finds them again, and transactions
resolved before the restart are neither checked nor committed a second time."""

from __future__ import annotations

from pathlib import Path

import pytest
from message_types_support import SMALL_STORE, CheckServer, pull_topic
from support import BrokerProcess, wait_until

CONFIG = {**SMALL_STORE, "transactionCheckInterval": 200, "transactionTimeOut": 2000, "transactionCheckMax": 5}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_open_transaction_is_checked_after_restart(tmp_path: Path, how: str) -> None:
    checker = CheckServer()
    b = BrokerProcess(tmp_path / "data", config=CONFIG).start()
    try:
        assert b.call("PUT", "/v1/topics/o", {"readQueueNums": 1, "writeQueueNums": 1})[0] == 200

        def prepare(body: str) -> str:
            status, out = b.call("POST", "/v1/topics/o/transactions",
                                 {"body": body, "producerGroup": "pg", "checkUrl": checker.url})
            assert status == 200, out
            return str(out["transactionId"])

        done, open_tx = prepare("done"), prepare("open")
        checker.script[done] = ["ROLLBACK"]  # it must never be asked: it is committed below
        checker.script[open_tx] = ["COMMIT"]
        assert b.call("POST", f"/v1/transactions/{done}/commit", {"producerGroup": "pg"})[0] == 200
        assert checker.calls == []  # both are younger than transactionTimeOut
        if how == "sigterm":
            assert b.terminate() == 0
        else:
            b.kill9()
        b.start()
        wait_until(lambda: any(m["body"] == "open" for m in pull_topic(b.url, "o", 1)), 15, what="the check-back")
        bodies = sorted(m["body"] for m in pull_topic(b.url, "o", 1))
        assert bodies == ["done", "open"]
        assert checker.calls_for(done) == []
        status, out = b.call("POST", f"/v1/transactions/{done}/commit", {"producerGroup": "pg"})
        assert status in (200, 409) and (status == 409 or out["alreadyResolved"] is True)
        assert sorted(m["body"] for m in pull_topic(b.url, "o", 1)) == ["done", "open"]
    finally:
        checker.close()
        if b.proc is not None and b.proc.poll() is None:
            b.terminate()
