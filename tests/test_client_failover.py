"""The Python client through a master failover (controller mode, real processes, kill -9).

A producer given the controller's URL keeps sending while the master dies: every send returns SEND_OK
or raises, every acknowledged message is stored exactly once where it was acknowledged, and sends
resume on the new master by themselves. A push consumer keeps receiving while the group has no master
(from a slave), commits to the new master afterwards, and a successor resumes from those commits. A
send the broker stored but could not replicate in time is reported, not resent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import http, wait_until
from test_failover import GROUP, Cluster

from ferrymq.client import (
    Admin,
    BrokerError,
    ClientError,
    ConsumeResult,
    Message,
    Producer,
    PullConsumer,
    PushConsumer,
)
from ferrymq.client.errors import RemotingConnectError, RemotingError, RemotingTimeoutError
from ferrymq.client.fault import AddressHealth
from ferrymq.client.message import ReceivedMessage
from ferrymq.client.producer import Failure, classify
from ferrymq.client.routes import GroupRoute

TOPIC = "cft"
QUEUES = 2


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        for r in c.replicas:
            r.kill9()
        c.controller.stop()


def _create_topic(cluster: Cluster, topic: str = TOPIC) -> None:
    cluster.wait_master()
    admin = Admin(cluster.controller.url)
    try:
        admin.create_topic(topic, read_queues=QUEUES, write_queues=QUEUES)
    finally:
        admin.shutdown()
    cluster.wait_in_sync(len(cluster.replicas))
    # Slaves copy topic configs every slaveSyncInterval: a master killed before that leaves a successor
    # without the topic (a broker-side window these tests are not about).
    wait_until(lambda: all(r.call("GET", f"/v1/topics/{topic}")[0] == 200 for r in cluster.replicas), 10, 0.05,
               "every replica to have the topic")
    # the route appears once the master's next heartbeat reports the topic
    wait_until(lambda: cluster.controller.call("GET", f"/v1/routes/{topic}")[0] == 200, 10, 0.05, "the route")


def _stored(replica: Any, topic: str = TOPIC) -> dict[tuple[int, int], str]:
    out: dict[tuple[int, int], str] = {}
    for q in range(QUEUES):
        offset = 0
        while True:
            status, ans = replica.call("GET", f"/v1/topics/{topic}/queues/{q}/messages?offset={offset}&maxMessages=500")
            assert status == 200, ans
            out.update({(q, m["queueOffset"]): m["body"] for m in ans["messages"]})
            if not ans["messages"]:
                break
            offset = ans["nextOffset"]
    return out


def _messages_served(replica: Any) -> float:
    """ferrymq_messages_out for the topic: messages this replica served to pulls."""
    status, text = replica.call("GET", "/metrics")
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in str(text).splitlines()
               if line.startswith("ferrymq_messages_out_total{") and f'topic="{TOPIC}"' in line)


def _wait_new_master(cluster: Cluster, victim: Any) -> tuple[Any, float]:
    def elected() -> Any:
        m = cluster.group().get("master")
        return m if m and m["name"] != victim.name else None

    m = wait_until(elected, 20, 0.02, "a new master")
    at = time.monotonic()
    return next(r for r in cluster.replicas if r.name == m["name"]), at


class Sending(threading.Thread):
    """Sends unique messages through one Producer, sync or async (a window of futures)."""

    def __init__(self, producer: Producer, name: str, *, window: int = 0) -> None:
        super().__init__(daemon=True)
        self.producer, self.name, self.window = producer, name, window
        self.acked: list[tuple[str, int, int, float]] = []  # body, queueId, queueOffset, time
        self.failed: list[tuple[str, ClientError]] = []
        self.stop_flag = threading.Event()
        self.seq = 0

    def _record(self, body: str, result: Any) -> None:
        assert result.status == "SEND_OK" and result.broker_group == GROUP
        self.acked.append((body, result.queue_id, result.queue_offset, time.monotonic()))

    def run(self) -> None:
        inflight: list[tuple[str, Any]] = []
        while not self.stop_flag.is_set() or inflight:
            if not self.stop_flag.is_set() and (self.window == 0 or len(inflight) < self.window):
                self.seq += 1
                body = f"{self.name}-{self.seq}"
                msg = Message(topic=TOPIC, body=body.encode())
                if self.window == 0:
                    try:
                        self._record(body, self.producer.send(msg))
                    except ClientError as exc:
                        self.failed.append((body, exc))
                    continue
                inflight.append((body, self.producer.send_async(msg)))
                continue
            body, fut = inflight.pop(0)
            try:
                self._record(body, fut.result(60))
            except ClientError as exc:
                self.failed.append((body, exc))


@pytest.mark.slow
def test_producer_follows_the_new_master_and_every_acknowledged_message_is_stored_once(cluster: Cluster) -> None:
    _create_topic(cluster)
    producer = Producer(cluster.controller.url, group="fpg", send_timeout_ms=15_000)
    producer.start()
    senders = [Sending(producer, "sync"), Sending(producer, "async", window=8)]
    try:
        for s in senders:
            s.start()
        wait_until(lambda: all(len(s.acked) >= 20 for s in senders), 20, 0.05, "sends before the kill")
        victim = cluster.wait_master()
        killed_at = time.monotonic()
        victim.kill9()
        new_master, elected_at = _wait_new_master(cluster, victim)
        # both keep going on the new master, without anyone telling them
        try:
            wait_until(lambda: all(sum(1 for a in s.acked if a[3] > elected_at) >= 20 for s in senders), 30, 0.05,
                       "sends acknowledged by the new master")
        except AssertionError as exc:
            state = [(s.name, s.is_alive(), len(s.acked), sum(1 for a in s.acked if a[3] > elected_at),
                      [str(e) for _, e in s.failed[-3:]]) for s in senders]
            raise AssertionError(f"{exc}: {state}") from None
    finally:
        for s in senders:
            s.stop_flag.set()
        for s in senders:
            s.join(60)
        producer.shutdown()

    acked = [a for s in senders for a in s.acked]
    failed = [f for s in senders for f in s.failed]
    print(f"acknowledged {len(acked)}, raised {len(failed)}; election {elected_at - killed_at:.2f} s after the kill")
    # Only sends caught in flight by the kill may fail (their outcome is unknown); the rest waited out
    # the election within their send timeout.
    assert len(failed) <= 2 * 8 + 2, [str(e) for _, e in failed]
    assert all(e.code in ("REMOTING_ERROR", "TIMEOUT") for _, e in failed), [str(e) for _, e in failed]
    stored = _stored(new_master)
    where: dict[str, list[tuple[int, int]]] = {}
    for key, body in stored.items():
        where.setdefault(body, []).append(key)
    for body, qid, qoff, _t in acked:
        assert where.get(body) == [(qid, qoff)], f"{body}: acknowledged at {qid}/{qoff}, stored at {where.get(body)}"


@pytest.mark.slow
def test_push_consumer_reads_from_a_slave_during_the_failover_then_resumes_on_the_new_master(
        cluster: Cluster) -> None:
    _create_topic(cluster)
    url = cluster.controller.url
    with Producer(url, group="cpg") as p:
        before = [f"b-{i}" for i in range(240)]
        for b in before:
            p.send(Message(topic=TOPIC, body=b.encode()))

    seen: list[tuple[str, float]] = []
    lock = threading.Lock()

    def listener(msgs: list[ReceivedMessage]) -> ConsumeResult:
        time.sleep(0.02)  # slow enough that the backlog outlasts the failover
        with lock:
            seen.extend((m.body.decode(), time.monotonic()) for m in msgs)
        return ConsumeResult.SUCCESS

    # A small buffer per queue: consuming through the failover needs pulls during it.
    options: dict[str, Any] = {"consume_from": "earliest", "consume_thread_count": 1, "pull_batch_size": 4,
                               "pull_threshold_for_queue": 4, "auto_commit_interval": 0.5, "long_polling_ms": 2000}
    consumer = PushConsumer(url, group="fcg", topic=TOPIC, listener=listener, **options)
    consumer.start()
    try:
        wait_until(lambda: len(seen) >= 30, 20, 0.02, "consumption before the kill")
        victim = cluster.wait_master()
        killed_at = time.monotonic()
        victim.kill9()
        new_master, elected_at = _wait_new_master(cluster, victim)
        with lock:
            during = [b for b, t in seen if killed_at + 0.8 < t < elected_at]
        # the few messages buffered at the kill are long done by kill + 0.8 s: these came from slaves
        assert during, f"nothing consumed between the kill and the election ({elected_at - killed_at:.2f} s)"
        print(f"consumed {len(during)} between kill + 0.8 s and the election {elected_at - killed_at:.2f} s after it")
        served_by_slaves = sum(_messages_served(r) for r in cluster.replicas if r is not victim)
        assert served_by_slaves > 0

        with Producer(url, group="cpg", send_timeout_ms=15_000) as p:
            after = [f"a-{i}" for i in range(40)]
            for b in after:
                p.send(Message(topic=TOPIC, body=b.encode()))
        wait_until(lambda: {b for b, _ in seen} >= set(before) | set(after), 60, 0.1, "every message consumed")

        def committed_to_new_master() -> bool:
            for q in range(QUEUES):
                _, desc = new_master.call("GET", f"/v1/topics/{TOPIC}")
                status, off = new_master.call("GET", f"/v1/groups/fcg/offsets/{TOPIC}/{q}")
                if status != 200 or off["offset"] != desc["queues"][q]["maxOffset"]:
                    return False
            return True

        wait_until(committed_to_new_master, 15, 0.1, "the offsets committed to the new master")
    finally:
        consumer.shutdown()

    # A successor in the same group starts at the committed offsets: only what is new reaches it.
    fresh: list[str] = []
    successor = PushConsumer(url, group="fcg", topic=TOPIC,
                             listener=lambda msgs: fresh.extend(m.body.decode() for m in msgs) or ConsumeResult.SUCCESS,
                             consume_from="earliest")
    successor.start()
    try:
        with Producer(url, group="cpg") as p:
            for i in range(10):
                p.send(Message(topic=TOPIC, body=f"n-{i}".encode()))
        wait_until(lambda: len(fresh) >= 10, 20, 0.05, "the successor's messages")
        time.sleep(0.5)
        assert sorted(fresh) == sorted(f"n-{i}" for i in range(10))
    finally:
        successor.shutdown()


@pytest.mark.slow
def test_pull_consumer_reads_a_slave_and_keeps_commits_until_a_master_takes_them(cluster: Cluster) -> None:
    _create_topic(cluster)
    url = cluster.controller.url
    with Producer(url, group="ppg") as p:
        for i in range(20):
            p.send(Message(topic=TOPIC, body=f"m-{i}".encode()), selector=lambda qs, m, a: qs[0])
    pc = PullConsumer(url, group="fpc", auto_commit_interval=0.3)
    pc.start()
    try:
        mq = pc.fetch_queues(TOPIC)[0]
        assert len(pc.pull(mq, 0, 5).messages) == 5 and pc.commit_offset(mq, 5) is True
        victim = cluster.wait_master()
        victim.kill9()

        def pull_more() -> Any:
            try:
                return pc.pull(mq, 5, 32)
            except ClientError:  # the first pull may still try the dead master
                return None

        res = wait_until(pull_more, 10, 0.05, "a pull answered by a slave")
        assert [m.body for m in res.messages] == [f"m-{i}".encode() for i in range(5, 20)]
        # still no new master: the controller has not even noticed yet, or is between masters
        assert (cluster.group().get("master") or {}).get("name") in (None, victim.name)
        assert pc.commit_offset(mq, 20) is False  # no master to take it: kept
        assert pc.committed_offset(mq) == 20
        new_master, _ = _wait_new_master(cluster, victim)
        wait_until(lambda: new_master.call("GET", f"/v1/groups/fpc/offsets/{TOPIC}/{mq.queue_id}")[1].get("offset")
                   == 20, 15, 0.1, "the kept commit on the new master")
        assert pc.commit_offset(mq, 20) is True
    finally:
        pc.shutdown()


@pytest.mark.slow
def test_a_send_stored_but_not_replicated_in_time_is_reported_not_resent(tmp_path: Path) -> None:
    # haMaxTimeSlaveNotCatchup far above syncFlushTimeout: the paused slave stays in the SyncStateSet,
    # so the master keeps waiting for it and answers FLUSH_SLAVE_TIMEOUT
    cluster = Cluster(tmp_path, n=2, broker_config={"syncFlushTimeout": 800, "haMaxTimeSlaveNotCatchup": 60_000})
    try:
        _create_topic(cluster)
        master = cluster.wait_master()
        slave = next(r for r in cluster.replicas if r is not master)
        with Producer(cluster.controller.url, group="tpg", send_timeout_ms=10_000) as p:
            assert p.send(Message(topic=TOPIC, body=b"replicated")).status == "SEND_OK"
            slave.pause()
            try:
                with pytest.raises(BrokerError) as err:
                    p.send(Message(topic=TOPIC, body=b"unconfirmed"))
                assert err.value.code == "FLUSH_SLAVE_TIMEOUT"
            finally:
                slave.resume()
        # stored once on the master (not resent), and served once the slave has caught up
        wait_until(lambda: "unconfirmed" in _stored(master).values(), 20, 0.1, "the stored message")
        assert list(_stored(master).values()).count("unconfirmed") == 1
        status, ans = http("GET", f"{master.url}/v1/topics/{TOPIC}")
        assert status == 200 and sum(q["maxOffset"] for q in ans["queues"]) == 2
    finally:
        for r in cluster.replicas:
            r.kill9()
        cluster.controller.stop()


# ---- the pure rules behind the above ------------------------------------------------------------------------

def test_send_failures_are_classified_by_whether_the_message_may_be_stored() -> None:
    def kind(exc: ClientError, *, not_store_ok: bool = False, unknown: bool = False) -> Failure:
        return classify(exc, retry_not_store_ok=not_store_ok, retry_unknown=unknown)

    assert kind(RemotingConnectError("refused")) is Failure.MASTER_UNAVAILABLE
    assert kind(BrokerError("SERVICE_NOT_AVAILABLE", "slave")) is Failure.MASTER_UNAVAILABLE
    assert kind(BrokerError("IN_SYNC_REPLICAS_NOT_ENOUGH", "")) is Failure.MASTER_UNAVAILABLE
    assert kind(BrokerError("SYSTEM_BUSY", "")) is Failure.RETRY
    assert kind(BrokerError("MESSAGE_ILLEGAL", "")) is Failure.FATAL
    for code in ("FLUSH_SLAVE_TIMEOUT", "FLUSH_DISK_TIMEOUT", "SLAVE_NOT_AVAILABLE"):
        assert kind(BrokerError(code, "")) is Failure.RAISE
        assert kind(BrokerError(code, ""), not_store_ok=True) is Failure.RETRY
    for exc in (RemotingError("closed"), RemotingTimeoutError("late")):
        assert kind(exc) is Failure.RAISE
        assert kind(exc, unknown=True) is Failure.RETRY


def test_reads_go_to_a_slave_while_the_master_is_missing_or_just_failed() -> None:
    now = [100.0]
    health = AddressHealth(clock=lambda: now[0], down_s=5)
    g = GroupRoute("g", "m:1", "m:2", 4, 4, "RW", ("s1:1", "s2:1"))
    assert g.read_address(health) == "m:1" and g.writable and g.readable
    health.failed("m:1")
    assert g.read_address(health) == "s1:1"
    health.failed("s1:1")
    assert g.read_address(health) == "s2:1"
    now[0] += 1
    health.failed("s2:1")
    assert g.read_address(health) == "m:1"  # all failed: the one that failed longest ago
    now[0] += 5
    assert g.read_address(health) == "m:1"  # the master's mark expired: it is tried again first
    masterless = GroupRoute("g", None, None, 4, 4, "RW", ("s1:1",))
    assert masterless.readable and not masterless.writable and masterless.read_address(None) == "s1:1"
