"""TransactionProducer against a real broker process (checks every 200 ms, first check after 500 ms):
the contract's example as written, commit / rollback / UNKNOWN resolved by check-back, an execute that
raises, the asyncio twin, and a producer process killed with its transaction open, answered for by
another producer process of the same group.

Run as a script, this file is that producer process:
    python test_client_transaction.py URL GROUP TOPIC OUT (--dying | --peer)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from message_types_support import SMALL_STORE, pull_topic
from support import BrokerProcess, wait_until

from ferrymq.client import (
    AsyncTransactionProducer,
    Message,
    ReceivedMessage,
    TransactionProducer,
    TransactionState,
)

CONFIG = {"transactionCheckInterval": 200, "transactionTimeOut": 500}


def _visible(url: str, topic: str, body: str, queues: int = 2) -> list[dict[str, Any]]:
    return [m for m in pull_topic(url, topic, queues) if m["body"] == body]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("ctx")) / "data", config={**SMALL_STORE, **CONFIG}).start()
    assert b.call("PUT", "/v1/topics/pay", {"readQueueNums": 2, "writeQueueNums": 2})[0] == 200
    yield b
    b.terminate()


CONTRACT_EXAMPLE = '''
import sys
from ferrymq.client import Admin, Message, TransactionProducer, TransactionState
URL = sys.argv[1]
Admin(URL).create_topic("orders", read_queues=8, write_queues=8)
tx = TransactionProducer("%s", group="txg",
                         execute=lambda msg, arg: TransactionState.COMMIT,   # or ROLLBACK / UNKNOWN
                         check=lambda msg: TransactionState.COMMIT)
tx.start(); tx.send_in_transaction(Message(topic="orders", body=b"x"), arg=None); tx.shutdown()
'''


def test_contract_example_runs(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "tx_example.py"
    script.write_text(CONTRACT_EXAMPLE % broker.url)
    out = subprocess.run([sys.executable, str(script), broker.url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert len(_visible(broker.url, "orders", "x", 8)) == 1


def test_commit_rollback_and_check_back(broker: BrokerProcess) -> None:
    checked: list[ReceivedMessage] = []
    answers = {"unknown": TransactionState.COMMIT, "raises": TransactionState.ROLLBACK}

    def execute(msg: Message, arg: Any) -> TransactionState:
        if arg == "raise":
            raise RuntimeError("local transaction failed")
        return arg

    def check(msg: ReceivedMessage) -> TransactionState:
        checked.append(msg)
        return answers[msg.body.decode()]

    tx = TransactionProducer(broker.url, group="tx-app", execute=execute, check=check)
    tx.start()
    try:
        r = tx.send_in_transaction(Message(topic="pay", body=b"commit", keys=["o-1"]), arg=TransactionState.COMMIT)
        assert r.status == "SEND_OK" and r.local_state is TransactionState.COMMIT and r.transaction_id
        [seen] = _visible(broker.url, "pay", "commit")
        assert seen["msgId"] == r.committed_msg_id and seen["keys"] == ["o-1"]
        assert seen["properties"]["UNIQ_KEY"] == r.transaction_id

        r = tx.send_in_transaction(Message(topic="pay", body=b"rollback"), arg=TransactionState.ROLLBACK)
        assert r.local_state is TransactionState.ROLLBACK and r.committed_msg_id is None

        unknown = tx.send_in_transaction(Message(topic="pay", body=b"unknown", tags="t", properties={"k": "v"}),
                                         arg=TransactionState.UNKNOWN)
        raising = tx.send_in_transaction(Message(topic="pay", body=b"raises"), arg="raise")
        assert unknown.local_state is TransactionState.UNKNOWN and raising.local_state is TransactionState.UNKNOWN
        assert _visible(broker.url, "pay", "unknown") == []
        wait_until(lambda: _visible(broker.url, "pay", "unknown"), 15, what="the check-back's commit")
        wait_until(lambda: {m.body for m in checked} >= {b"unknown", b"raises"}, 15, what="both checks")
        m = next(m for m in checked if m.body == b"unknown")
        assert (m.topic, m.tags, m.properties["k"], m.broker_group) == ("pay", "t", "v", "standalone")
        assert m.properties["UNIQ_KEY"] == unknown.transaction_id
        time.sleep(1.0)  # a few more check rounds: nothing is asked or delivered twice
        assert len(_visible(broker.url, "pay", "unknown")) == 1
        assert _visible(broker.url, "pay", "rollback") == [] and _visible(broker.url, "pay", "raises") == []
        assert {m.body for m in checked} == {b"unknown", b"raises"}  # decided transactions are never checked
        assert len(checked) == 2
    finally:
        tx.shutdown()


async def test_async_twin(broker: BrokerProcess) -> None:
    async def execute(msg: Message, arg: Any) -> TransactionState:
        await asyncio.sleep(0)
        return TransactionState.UNKNOWN

    async def check(msg: ReceivedMessage) -> TransactionState:
        return TransactionState.COMMIT

    async with AsyncTransactionProducer(broker.url, "tx-async", execute, check) as tx:
        r = await tx.send_in_transaction(Message(topic="pay", body=b"async"))
        assert r.local_state is TransactionState.UNKNOWN
        for _ in range(150):
            if await asyncio.to_thread(_visible, broker.url, "pay", "async"):
                break
            await asyncio.sleep(0.1)
        assert len(await asyncio.to_thread(_visible, broker.url, "pay", "async")) == 1


class ProducerProcess:
    def __init__(self, url: str, group: str, topic: str, out: Path, role: str) -> None:
        self.out = out
        self.log = open(out.with_suffix(".log"), "ab")
        self.proc = subprocess.Popen([sys.executable, __file__, url, group, topic, str(out), f"--{role}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def events(self) -> list[dict[str, Any]]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.endswith("}")]

    def has(self, event: str) -> bool:
        return any(e["event"] == event for e in self.events())

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


@pytest.mark.slow
def test_dead_producers_transaction_is_answered_by_a_peer_process(broker: BrokerProcess, tmp_path: Path) -> None:
    peer = ProducerProcess(broker.url, "tx-pair", "pay", tmp_path / "peer.jsonl", "peer")
    dying = None
    try:
        wait_until(lambda: peer.has("started"), 30, what="the peer producer")
        dying = ProducerProcess(broker.url, "tx-pair", "pay", tmp_path / "dying.jsonl", "dying")
        wait_until(lambda: dying.has("executing"), 30, what="the dying producer's local transaction")
        dying.stop(signal.SIGKILL)  # dies with its transaction open
        wait_until(lambda: _visible(broker.url, "pay", "orphan"), 20, what="the peer's commit")
        checks = [e for e in peer.events() if e["event"] == "check"]
        assert checks and {e["body"] for e in checks} == {"orphan"}
        time.sleep(1.0)
        assert len(_visible(broker.url, "pay", "orphan")) == 1
    finally:
        if dying is not None:
            dying.stop(signal.SIGKILL)
        peer.stop()


def _main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("group")
    p.add_argument("topic")
    p.add_argument("out")
    role = p.add_mutually_exclusive_group(required=True)
    role.add_argument("--dying", action="store_true")
    role.add_argument("--peer", action="store_true")
    a = p.parse_args()

    out = open(a.out, "a", buffering=1)
    lock = threading.Lock()

    def emit(event: str, **fields: Any) -> None:
        with lock:
            out.write(json.dumps({"event": event, **fields}) + "\n")

    def execute(msg: Message, arg: Any) -> TransactionState:
        emit("executing")
        time.sleep(3600)  # killed in here
        return TransactionState.ROLLBACK

    def check(msg: ReceivedMessage) -> TransactionState:
        emit("check", body=msg.body.decode(), txid=msg.properties.get("UNIQ_KEY"))
        # the peer knows the outcome (say, from the shared database); the dying one is still deciding
        return TransactionState.COMMIT if a.peer else TransactionState.UNKNOWN

    tx = TransactionProducer(a.url, group=a.group, execute=execute, check=check, topics=[a.topic])
    tx.start()
    emit("started")
    if a.dying:
        tx.send_in_transaction(Message(topic=a.topic, body=b"orphan"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    tx.shutdown()


if __name__ == "__main__":
    _main()
