"""Push-consumer modes against a real broker: broadcasting (every member gets every message, offsets
kept by the client), the broker-side tag filter, and starting from a timestamp."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_support import wait_for
from support import BrokerProcess

from ferrymq.client import Admin, ConsumeResult, Message, Producer, PushConsumer, ReceivedMessage


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("modes")) / "data").start()
    yield b
    b.terminate()


@pytest.fixture(scope="module")
def producer(broker: BrokerProcess) -> Iterator[Producer]:
    p = Producer(broker.url, group="mpg")
    p.start()
    yield p
    p.shutdown()


class Collector:
    def __init__(self) -> None:
        self.msgs: list[ReceivedMessage] = []
        self.lock = threading.Lock()

    def __call__(self, msgs: list[ReceivedMessage]) -> ConsumeResult:
        with self.lock:
            self.msgs.extend(msgs)
        return ConsumeResult.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.msgs]


def test_broadcasting_gives_every_member_every_message(broker: BrokerProcess, producer: Producer,
                                                       tmp_path: Path) -> None:
    with Admin(broker.url) as admin:
        admin.create_topic("bcast", read_queues=4, write_queues=4)
    collectors = [Collector(), Collector()]
    consumers = [PushConsumer(broker.url, group="bg", topic="bcast", listener=c, broadcast=True,
                              consume_from="earliest", offset_store_dir=tmp_path / f"m{i}", auto_commit_interval=0.2)
                 for i, c in enumerate(collectors)]
    for c in consumers:
        c.start()
    try:
        assert [len(c.assigned_queues()) for c in consumers] == [4, 4]
        sent = {f"b{i}".encode() for i in range(40)}
        for body in sorted(sent):
            producer.send(Message(topic="bcast", body=body))
        for col in collectors:
            wait_for(lambda col=col: set(col.bodies()) == sent, 20, "every member to get every message")
        time.sleep(0.5)
    finally:
        for c in consumers:
            c.shutdown()
    for i in range(2):  # progress stayed with each member, none on the broker
        stored = json.loads((tmp_path / f"m{i}" / "bg" / "offsets.json").read_text())
        assert sum(stored.values()) == 40
    with Admin(broker.url) as admin:
        assert set(admin.consumer_offsets("bg", "bcast").values()) == {-1}


def test_tag_filter_on_the_broker(broker: BrokerProcess, producer: Producer) -> None:
    with Admin(broker.url) as admin:
        admin.create_topic("tagged", read_queues=2, write_queues=2)
    col = Collector()
    c = PushConsumer(broker.url, group="tg", topic="tagged", tags="a || c", listener=col, consume_from="earliest")
    c.start()
    try:
        for i in range(30):
            producer.send(Message(topic="tagged", body=f"{'abc'[i % 3]}{i}".encode(), tags="abc"[i % 3]))
        wait_for(lambda: len(col.bodies()) >= 20, 20, "the a and c messages")
        time.sleep(0.3)
        assert sorted(col.bodies()) == sorted(f"{'abc'[i % 3]}{i}".encode() for i in range(30) if i % 3 != 1)
        assert {m.tags for m in col.msgs} == {"a", "c"}
    finally:
        c.shutdown()


def test_consume_from_timestamp(broker: BrokerProcess, producer: Producer) -> None:
    with Admin(broker.url) as admin:
        admin.create_topic("timed", read_queues=2, write_queues=2)
    for i in range(10):
        producer.send(Message(topic="timed", body=f"old{i}".encode()))
    time.sleep(0.05)
    since = int(time.time() * 1000)
    time.sleep(0.05)
    new = {f"new{i}".encode() for i in range(10)}
    for body in sorted(new):
        producer.send(Message(topic="timed", body=body))
    col = Collector()
    c = PushConsumer(broker.url, group="tsg", topic="timed", listener=col, consume_from="timestamp",
                     consume_timestamp_ms=since)
    c.start()
    try:
        wait_for(lambda: set(col.bodies()) >= new, 20, "the messages stored after the timestamp")
        time.sleep(0.3)
        assert sorted(col.bodies()) == sorted(new)
    finally:
        c.shutdown()
