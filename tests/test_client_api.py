"""The Python client against a real standalone broker: producer sends (sync, async, oneway, batch,
queue selectors), errors that keep the broker's code, admin, the pull consumer, the asyncio twins,
reconnection after a broker restart, the contract's example as written, and the CLI."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_support import wait_for
from message_types_support import FAST_LEVELS
from support import BrokerProcess

from ferrymq.client import (
    Admin,
    AsyncAdmin,
    AsyncProducer,
    AsyncPushConsumer,
    BrokerError,
    ClientError,
    ConsumeResult,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    ReceivedMessage,
    select_by_hash,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # fast delay levels: a RECONSUME_LATER goes through the retry topic at level 3 + n
    b = BrokerProcess(Path(tmp_path_factory.mktemp("client")) / "data",
                      config={"messageDelayLevel": FAST_LEVELS}).start()
    yield b
    b.terminate()


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[Admin]:
    a = Admin(broker.url)
    yield a
    a.shutdown()


@pytest.fixture
def producer(broker: BrokerProcess) -> Iterator[Producer]:
    p = Producer(broker.url, group="pg")
    p.start()
    yield p
    p.shutdown()


def test_admin_topic_lifecycle_and_errors(admin: Admin) -> None:
    desc = admin.create_topic("adm", read_queues=3, write_queues=2)
    assert (desc["readQueueNums"], desc["writeQueueNums"], desc["perm"]) == (3, 2, "RW")
    assert len(desc["brokerGroups"]["standalone"]["queues"]) == 3
    assert admin.update_topic("adm", read_queues=4)["readQueueNums"] == 4
    assert admin.update_topic("adm", perm="R")["perm"] == "R"
    admin.delete_topic("adm")
    with pytest.raises(BrokerError) as err:
        admin.describe_topic("adm")
    assert err.value.code == "TOPIC_NOT_EXIST"
    with pytest.raises(ClientError) as err2:
        admin.create_topic("bad topic!")
    assert err2.value.code == "TOPIC_ILLEGAL"
    with pytest.raises(BrokerError) as err:
        admin.create_topic("zero", read_queues=0)
    assert err.value.code == "INVALID_REQUEST"


def test_send_variants(admin: Admin, producer: Producer) -> None:
    admin.create_topic("sends", read_queues=4, write_queues=4)
    r = producer.send(Message(topic="sends", body=b"one", tags="t", keys=["k1"], properties={"a": "b"}))
    assert r.status == "SEND_OK" and r.broker_group == "standalone" and len(r.msg_id) == 32
    futs = [producer.send_async(Message(topic="sends", body=f"a{i}".encode())) for i in range(20)]
    assert all(f.result(10).status == "SEND_OK" for f in futs)
    batch = producer.send_batch([Message(topic="sends", body=f"b{i}".encode()) for i in range(10)])
    assert len({b.queue_id for b in batch}) == 1
    assert [b.queue_offset for b in batch] == list(range(batch[0].queue_offset, batch[0].queue_offset + 10))
    producer.send_oneway(Message(topic="sends", body=b"oneway", tags="ow"))
    keyed = [producer.send(Message(topic="sends", body=b"k", keys=["order-7"]), selector=select_by_hash)
             for _ in range(5)]
    assert len({k.queue_id for k in keyed}) == 1
    picked = producer.send(Message(topic="sends", body=b"q3"), selector=lambda qs, m, arg: qs[arg], arg=3)
    assert picked.queue_id == 3
    offsets = admin.queue_offsets("sends")
    assert sum(mx for _, mx in offsets.values()) == 1 + 20 + 10 + 1 + 5 + 1 or wait_for(
        lambda: sum(mx for _, mx in admin.queue_offsets("sends").values()) == 38, 5, "the oneway message")


def test_send_errors_keep_the_broker_code(admin: Admin, producer: Producer) -> None:
    with pytest.raises(BrokerError) as err:
        producer.send(Message(topic="nowhere", body=b"x"))
    assert err.value.code == "TOPIC_NOT_EXIST" and "nowhere" in err.value.message
    admin.create_topic("errs", read_queues=1, write_queues=1)
    with pytest.raises(BrokerError) as err:
        producer.send(Message(topic="errs", body=b""))
    assert err.value.code == "MESSAGE_ILLEGAL" and err.value.broker
    with pytest.raises(ClientError) as cerr:
        Message(topic="errs", body=b"x", properties={"TAGS": "no"}).wire_properties()
    assert cerr.value.code == "MESSAGE_ILLEGAL"
    with pytest.raises(ClientError):
        producer.send_batch([Message(topic="errs", body=b"a"), Message(topic="other", body=b"b")])
    stopped = Producer(admin.impl.instance.http.urls[0])
    with pytest.raises(ClientError) as cerr:
        stopped.send(Message(topic="errs", body=b"x"))
    assert cerr.value.code == "CLIENT_STATE"
    stopped.shutdown()


def test_pull_consumer_offsets_and_tags(admin: Admin, producer: Producer) -> None:
    admin.create_topic("pulls", read_queues=1, write_queues=1)
    t0 = int(time.time() * 1000)
    for i in range(6):
        producer.send(Message(topic="pulls", body=f"p{i}".encode(), tags="even" if i % 2 == 0 else "odd"))
    pc = PullConsumer(admin.impl.instance.http.urls[0], group="pullg")
    pc.start()
    try:
        (mq,) = pc.fetch_queues("pulls")
        assert mq == MessageQueue("pulls", "standalone", 0)
        res = pc.pull(mq, 0, 32)
        assert res.status == "FOUND" and [m.body for m in res.messages] == [f"p{i}".encode() for i in range(6)]
        m = res.messages[0]
        assert (m.topic, m.queue_id, m.queue_offset, m.tags, m.broker_group) == ("pulls", 0, 0, "even", "standalone")
        assert m.store_timestamp >= m.born_timestamp >= t0 - 1000 and m.reconsume_times == 0
        odd = pc.pull(mq, 0, 32, tags="odd")
        assert [x.body for x in odd.messages] == [b"p1", b"p3", b"p5"] and odd.next_offset == 6
        assert pc.pull(mq, 6, 32).status == "NO_NEW_MSG"
        assert pc.committed_offset(mq) == -1
        pc.commit_offset(mq, 4)
        assert pc.committed_offset(mq) == 4 and admin.consumer_offsets("pullg", "pulls") == {mq: 4}
        assert (pc.min_offset(mq), pc.max_offset(mq)) == (0, 6)
        assert pc.search_offset(mq, t0 - 60_000) == 0
        with pytest.raises(BrokerError) as err:
            pc.commit_offset(mq, 99)
        assert err.value.code == "OFFSET_ILLEGAL"
    finally:
        pc.shutdown()


def test_reconsume_later_and_raising_listeners_redeliver_never_skip(admin: Admin, producer: Producer,
                                                                    broker: BrokerProcess) -> None:
    admin.create_topic("retry", read_queues=1, write_queues=1)
    seen: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
        m = msgs[0]
        with lock:
            seen.append((m.body, m.reconsume_times))
        if m.body == b"flaky" and m.reconsume_times < 2:
            return ConsumeResult.RECONSUME_LATER
        if m.body == b"boom" and m.reconsume_times < 1:
            raise RuntimeError("listener failure")
        return ConsumeResult.SUCCESS

    from ferrymq.client import PushConsumer

    c = PushConsumer(broker.url, group="rg", topic="retry", listener=listener, consume_from="earliest",
                     auto_commit_interval=0.2)
    c.start()
    try:
        for body in (b"flaky", b"ok", b"boom"):
            producer.send(Message(topic="retry", body=body))
        wait_for(lambda: (b"flaky", 2) in seen and (b"boom", 1) in seen and (b"ok", 0) in seen, 20, "redeliveries")
        mq = MessageQueue("retry", "standalone", 0)
        wait_for(lambda: admin.consumer_offsets("rg", "retry")[mq] == 3, 10, "the offset to pass all three")
    finally:
        c.shutdown()
    assert [s for s in seen if s[0] == b"flaky"] == [(b"flaky", 0), (b"flaky", 1), (b"flaky", 2)]


async def test_async_twins(broker: BrokerProcess) -> None:
    async with AsyncAdmin(broker.url) as adm:
        await adm.create_topic("asyncs", read_queues=2, write_queues=2)
    got: list[bytes] = []

    async def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
        got.extend(m.body for m in msgs)
        return ConsumeResult.SUCCESS

    async with AsyncProducer(broker.url, group="apg") as p, AsyncPushConsumer(
            broker.url, "ag", "asyncs", listener, consume_from="earliest") as c:
        results = await p.send_batch([Message(topic="asyncs", body=b"x"), Message(topic="asyncs", body=b"y")])
        task = p.send_async(Message(topic="asyncs", body=b"z"))
        assert (await task).status == "SEND_OK" and len(results) == 2
        for _ in range(200):
            if len(got) >= 3:
                break
            await __import__("asyncio").sleep(0.05)
        assert sorted(got) == [b"x", b"y", b"z"]
        # the topic's two queues, and the group's retry queue (subscribed from the first heartbeat)
        assert sorted(q.topic for q in c.assigned_queues()) == ["%RETRY%ag", "asyncs", "asyncs"]


def test_producer_and_consumer_survive_a_broker_restart(tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data").start()
    try:
        with Admin(b.url) as adm:
            adm.create_topic("restart", read_queues=2, write_queues=2)
        got: set[bytes] = set()
        lock = threading.Lock()

        def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
            with lock:
                got.update(m.body for m in msgs)
            return ConsumeResult.SUCCESS

        from ferrymq.client import PushConsumer

        with Producer(b.url) as p, PushConsumer(b.url, group="rsg", topic="restart", listener=listener,
                                                consume_from="earliest", rebalance_interval=1.0):
            p.send(Message(topic="restart", body=b"before"))
            wait_for(lambda: b"before" in got, 10, "first message")
            b.terminate()
            b.start()
            p.send(Message(topic="restart", body=b"after"))  # reconnects (retries within its 3 s)
            wait_for(lambda: b"after" in got, 30, "the consumer to reconnect and re-register")
    finally:
        b.terminate()


CONTRACT_EXAMPLE = '''
import sys, time
from ferrymq.client import (Admin, Message, Producer, TransactionProducer, PushConsumer,
                            PullConsumer, ConsumeResult, TransactionState)
URL = sys.argv[1]
Admin(URL).create_topic("orders", read_queues=8, write_queues=8)
producer = Producer(URL, group="pg")
producer.start()
result = producer.send(Message(topic="orders", body=b"...", tags="paid", keys=["o-1"],
                               properties={"k": "v"}, delay_level=0, deliver_at_ms=None))
assert result.msg_id and result.queue_id >= 0 and result.queue_offset >= 0 and result.status == "SEND_OK"
producer.send_batch([Message(topic="orders", body=b"a"), Message(topic="orders", body=b"b")])
producer.shutdown()
got = []
consumer = PushConsumer(URL, group="cg", topic="orders", tags="paid||refund",
                        listener=lambda msgs: (got.extend(msgs), ConsumeResult.SUCCESS)[1],
                        orderly=False, broadcast=False, max_reconsume_times=16, consume_from="earliest")
consumer.start()
deadline = time.time() + 20
while not got and time.time() < deadline:
    time.sleep(0.05)
consumer.shutdown()
m = got[0]
print(m.msg_id, m.topic, m.queue_id, m.queue_offset, m.body, m.tags, m.keys, m.properties,
      m.born_timestamp > 0, m.store_timestamp > 0, m.reconsume_times)
'''


def test_contract_example_runs(broker: BrokerProcess, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(CONTRACT_EXAMPLE)
    out = subprocess.run([sys.executable, str(script), broker.url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "orders" in out.stdout and "b'...' paid ['o-1'] {'k': 'v'} True True 0" in out.stdout


def test_cli_produce_and_consume(broker: BrokerProcess, admin: Admin) -> None:
    admin.create_topic("clit", read_queues=2, write_queues=2)
    ferry = [sys.executable, "-m", "ferrymq"]
    out = subprocess.run([*ferry, "produce", "clit", "--server", broker.url, "--count", "3", "--tags", "cli",
                          "--keys", "a,b", "--body", "hello"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    sent = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(sent) == 3 and {s["status"] for s in sent} == {"SEND_OK"}
    out = subprocess.run([*ferry, "consume", "clit", "--server", broker.url, "--group", "clig", "--from", "earliest",
                          "--max-messages", "3"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    msgs = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(m["msgId"] for m in msgs) == sorted(s["msgId"] for s in sent)
    assert {(m["body"], m["tags"], tuple(m["keys"])) for m in msgs} == {("hello", "cli", ("a", "b"))}
    out = subprocess.run([*ferry, "consume", "clit", "--server", broker.url, "--group", "clig",
                          "--idle-exit-seconds", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == ""  # the group's offsets were committed
    out = subprocess.run([*ferry, "produce", "nope", "--server", broker.url], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and "TOPIC_NOT_EXIST" in out.stderr and len(out.stderr.strip().splitlines()) == 1
