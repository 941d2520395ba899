"""Delay-level and timer messages across broker restarts: pending ones are never lost; a clean
restart re-delivers none that was already delivered; after kill -9 each is delivered at least once."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from message_types_support import SMALL_STORE, pull_topic
from support import BrokerProcess, wait_until

CONFIG = {**SMALL_STORE, "messageDelayLevel": "300ms 1s 3s", "timerPrecisionMs": 100}


def _send_mix(b: BrokerProcess, n: int) -> set[str]:
    now = int(time.time() * 1000)
    msgs = [{"body": f"fast-{i}", "delayLevel": 1} for i in range(n)]
    msgs += [{"body": f"slow-{i}", "delayLevel": 3} for i in range(n)]
    msgs += [{"body": f"timer-{i}", "deliverAtMs": now + 2500 + 10 * i} for i in range(n)]
    for i in range(0, len(msgs), 10):
        status, out = b.call("POST", "/v1/topics/d/messages", {"messages": msgs[i:i + 10]})
        assert status == 200, out
    return {m["body"] for m in msgs}


def _bodies(b: BrokerProcess) -> collections.Counter[str]:
    return collections.Counter(m["body"] for m in pull_topic(b.url, "d", 2))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm", "kill9"])
def test_restart_with_pending_delays(tmp_path: Path, how: str) -> None:
    b = BrokerProcess(tmp_path / "data", config=CONFIG).start()
    try:
        assert b.call("PUT", "/v1/topics/d", {"readQueueNums": 2, "writeQueueNums": 2})[0] == 200
        sent = _send_mix(b, 20)
        # the 300 ms level is through, the 3 s level and the timer messages are still pending
        wait_until(lambda: sum(1 for k in _bodies(b) if k.startswith("fast-")) == 20, 10, what="the fast level")
        assert not any(k.startswith(("slow-", "timer-")) for k in _bodies(b))
        if how == "sigterm":
            assert b.terminate() == 0
        else:
            b.kill9()
        b.start()
        wait_until(lambda: set(_bodies(b)) == sent, 20, what="every message")
        time.sleep(0.5)  # anything re-delivered by mistake would show up by now
        got = _bodies(b)
        assert set(got) == sent
        if how == "sigterm":
            assert max(got.values()) == 1, [k for k, v in got.items() if v > 1]
        status, stats = b.call("GET", "/v1/message-types/stats")
        assert status == 200 and stats["delay"]["pending"] == {} and stats["timer"]["pending"] == 0
    finally:
        if b.proc is not None and b.proc.poll() is None:
            b.terminate()
