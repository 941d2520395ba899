"""The push consumer's retries against a real broker process (delay levels scaled down to level N =
N x 100 ms): send-back to %RETRY%{group}, redelivery with the original topic and id, the dead-letter
queue after max_reconsume_times, consume timeouts, the local fallback when a send-back is refused, and
orderly consumers, which retry in place and then dead-letter."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from message_types_support import FAST_LEVELS, SMALL_STORE
from support import BrokerProcess, wait_until

from ferrymq.client import (
    Admin,
    ClientError,
    ConsumeResult,
    Message,
    MessageQueue,
    Producer,
    PushConsumer,
    ReceivedMessage,
)

CONFIG = {**SMALL_STORE, "messageDelayLevel": FAST_LEVELS}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("cretry")) / "data", config=CONFIG).start()
    yield b
    b.terminate()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    a = Admin(broker.url)
    yield a
    a.shutdown()


@pytest.fixture(scope="module")
def producer(broker: BrokerProcess) -> Iterator[Producer]:
    p = Producer(broker.url, group="retry-pg")
    p.start()
    yield p
    p.shutdown()


@dataclass
class Delivery:
    at: float
    body: bytes
    msg_id: str
    topic: str
    reconsume_times: int


class Recorder:
    """A listener that records every delivery and answers with ``decide(message, nth delivery of it)``."""

    def __init__(self, decide: Callable[[ReceivedMessage, int], ConsumeResult]) -> None:
        self.decide = decide
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()

    def __call__(self, msgs: list[ReceivedMessage]) -> ConsumeResult:
        m = msgs[0]
        with self.lock:
            self.deliveries.append(Delivery(time.monotonic(), m.body, m.msg_id, m.topic, m.reconsume_times))
            nth = len(self.of(m.body))
        return self.decide(m, nth)

    def of(self, body: bytes) -> list[Delivery]:
        return [d for d in self.deliveries if d.body == body]


def _consumer(broker: BrokerProcess, group: str, topic: str, rec: Recorder, **options: object) -> PushConsumer:
    c = PushConsumer(broker.url, group=group, topic=topic, listener=rec, consume_from="earliest",
                     auto_commit_interval=0.2, **options)
    c.start()
    return c


def _dead_letters(broker: BrokerProcess, group: str) -> list[dict]:
    status, out = broker.call("GET", f"/v1/groups/{group}/dlq/messages?offset=0&maxMessages=32")
    assert status == 200, out
    return out["messages"]


def _offset(admin: Admin, group: str, mq: MessageQueue) -> int:
    try:
        return admin.consumer_offsets(group, mq.topic)[mq]
    except ClientError:  # the broker is restarting
        return -1


def test_always_failing_message_is_redelivered_then_dead_lettered(broker: BrokerProcess, admin: Admin,
                                                                  producer: Producer) -> None:
    admin.create_topic("rt-poison", read_queues=1, write_queues=1)
    rec = Recorder(lambda m, n: ConsumeResult.RECONSUME_LATER if m.body == b"poison" else ConsumeResult.SUCCESS)
    c = _consumer(broker, "rg-poison", "rt-poison", rec, max_reconsume_times=3)
    try:
        sent = producer.send(Message(topic="rt-poison", body=b"poison", keys=["k1"]))
        producer.send(Message(topic="rt-poison", body=b"fine"))
        [dead] = wait_until(lambda: _dead_letters(broker, "rg-poison"), 20, what="the dead letter")
        time.sleep(1.0)  # anything still coming would arrive within the next delay levels
        poison = rec.of(b"poison")
        assert len(poison) == 3 + 1 and len(rec.of(b"fine")) == 1
        assert [d.reconsume_times for d in poison] == [0, 1, 2, 3]
        # the listener always sees the message as first sent, though copies 2..4 come from the retry topic
        assert {(d.topic, d.msg_id) for d in poison} == {("rt-poison", sent.msg_id)}
        # growing intervals: the k-th retry waits delay level 3 + k (300, 400, 500 ms here)
        gaps = [b.at - a.at for a, b in itertools.pairwise(poison)]
        for k, gap in enumerate(gaps):
            assert gap >= (3 + k) * 0.1 - 0.03, gaps
        assert dead["body"] == "poison" and dead["keys"] == ["k1"] and dead["reconsumeTimes"] == 4
        assert dead["properties"]["RETRY_TOPIC"] == "rt-poison"
        assert dead["properties"]["ORIGIN_MESSAGE_ID"] == sent.msg_id
        # both queues' offsets move past it: nothing is consumed again after a restart
        wait_until(lambda: admin.consumer_offsets("rg-poison", "rt-poison")[MessageQueue("rt-poison", "standalone", 0)]
                   == 2, 10, what="the topic's offset")
        retry_mq = MessageQueue("%RETRY%rg-poison", "standalone", 0)
        wait_until(lambda: admin.consumer_offsets("rg-poison", "%RETRY%rg-poison")[retry_mq] == 3, 10,
                   what="the retry topic's offset")
    finally:
        c.shutdown()


def _retry_messages(broker: BrokerProcess, group: str) -> int:
    """Messages ever put to the group's retry topic (created when the group first heartbeats)."""
    status, body = broker.call("GET", f"/v1/topics/%25RETRY%25{group}")
    return sum(q["maxOffset"] for q in body["queues"]) if status == 200 else 0


def test_listener_that_raises_once_gets_the_message_exactly_twice(broker: BrokerProcess, admin: Admin,
                                                                 producer: Producer) -> None:
    admin.create_topic("rt-once", read_queues=2, write_queues=2)

    def decide(m: ReceivedMessage, nth: int) -> ConsumeResult:
        if nth == 1:
            raise RuntimeError("first attempt fails")
        return ConsumeResult.SUCCESS

    rec = Recorder(decide)
    c = _consumer(broker, "rg-once", "rt-once", rec)
    try:
        bodies = [f"m{i}".encode() for i in range(4)]
        for b in bodies:
            producer.send(Message(topic="rt-once", body=b))
        wait_until(lambda: all(len(rec.of(b)) >= 2 for b in bodies), 20, what="the redeliveries")
        time.sleep(1.0)
        for b in bodies:
            assert [d.reconsume_times for d in rec.of(b)] == [0, 1], rec.of(b)
            assert {d.topic for d in rec.of(b)} == {"rt-once"}
        assert _dead_letters(broker, "rg-once") == []
    finally:
        c.shutdown()


def test_listener_past_its_consume_timeout_is_retried(broker: BrokerProcess, admin: Admin,
                                                      producer: Producer) -> None:
    admin.create_topic("rt-slow", read_queues=1, write_queues=1)

    def decide(m: ReceivedMessage, nth: int) -> ConsumeResult:
        if nth == 1:
            time.sleep(1.5)  # well past consume_timeout; this answer is ignored
        return ConsumeResult.SUCCESS

    rec = Recorder(decide)
    c = _consumer(broker, "rg-slow", "rt-slow", rec, consume_timeout=0.3)
    try:
        producer.send(Message(topic="rt-slow", body=b"slow"))
        wait_until(lambda: len(rec.of(b"slow")) == 2, 10, what="the redelivery after the timeout")
        first, second = rec.of(b"slow")
        assert second.reconsume_times == 1 and second.at - first.at >= 0.3 + 0.3 - 0.03
        wait_until(lambda: admin.consumer_offsets("rg-slow", "rt-slow")[MessageQueue("rt-slow", "standalone", 0)]
                   == 1, 10, what="the offset")
    finally:
        c.shutdown()


def test_failed_send_back_falls_back_to_local_retry(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data", config=CONFIG).start()
    admin = Admin(b.url)
    admin.create_topic("rt-local", read_queues=1, write_queues=1)

    def decide(m: ReceivedMessage, nth: int) -> ConsumeResult:
        if nth == 1:
            b.terminate()  # the send-back that follows cannot reach the broker
            return ConsumeResult.RECONSUME_LATER
        b.start()
        return ConsumeResult.SUCCESS

    rec = Recorder(decide)
    try:
        with Producer(b.url, group="retry-pg") as p:
            p.send(Message(topic="rt-local", body=b"stay"))
        c = _consumer(b, "rg-local", "rt-local", rec)
        try:
            wait_until(lambda: len(rec.of(b"stay")) == 2, 30, what="the local retry")
            mq = MessageQueue("rt-local", "standalone", 0)
            wait_until(lambda: _offset(admin, "rg-local", mq) == 1, 20, what="the offset")
        finally:
            c.shutdown()
        assert [d.reconsume_times for d in rec.of(b"stay")] == [0, 1]
        assert _retry_messages(b, "rg-local") == 0  # never went through the broker
    finally:
        admin.shutdown()
        b.terminate()


def test_orderly_consumer_retries_in_place_then_dead_letters(broker: BrokerProcess, admin: Admin,
                                                             producer: Producer) -> None:
    admin.create_topic("rt-order", read_queues=1, write_queues=1)
    rec = Recorder(lambda m, n: ConsumeResult.RECONSUME_LATER if m.body == b"A" else ConsumeResult.SUCCESS)
    c = _consumer(broker, "rg-order", "rt-order", rec, orderly=True, max_reconsume_times=2)
    try:
        for body in (b"A", b"B", b"C"):
            producer.send(Message(topic="rt-order", body=body))
        [dead] = wait_until(lambda: _dead_letters(broker, "rg-order"), 20, what="the dead letter")
        wait_until(lambda: len(rec.of(b"C")) == 1, 10, what="the rest of the queue")
        time.sleep(0.5)
        # A three times in place (1 + max_reconsume_times), then B and C, in order; never via a retry topic
        assert [(d.body, d.reconsume_times) for d in rec.deliveries] == [
            (b"A", 0), (b"A", 1), (b"A", 2), (b"B", 0), (b"C", 0)]
        assert dead["body"] == "A" and dead["properties"]["RETRY_TOPIC"] == "rt-order"
        assert _retry_messages(broker, "rg-order") == 0
        wait_until(lambda: admin.consumer_offsets("rg-order", "rt-order")[MessageQueue("rt-order", "standalone", 0)]
                   == 3, 10, what="the offset")
    finally:
        c.shutdown()
