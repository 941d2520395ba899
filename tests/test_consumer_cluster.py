"""Clustering consumption with real processes: three members of one group share eight queues; one is
kill -9ed mid-stream; every message is still consumed at least once, and once the group has settled
no queue is consumed by two members. Orderly consumption keeps each queue's order across a
rebalance and never lets two members consume one queue at the same time."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_support import Worker, wait_for
from support import BrokerProcess

from ferrymq.client import Admin, Message, Producer, select_by_hash


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("cluster")) / "data").start()
    yield b
    b.terminate()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop()


def _members(admin: Admin, group: str, topic: str) -> int:
    return len(admin.consumer_ids(group, topic))


@pytest.mark.slow
def test_three_members_share_queues_and_survive_a_kill(broker: BrokerProcess, workers: list[Worker],
                                                       tmp_path: Path) -> None:
    admin = Admin(broker.url)
    admin.create_topic("cluster", read_queues=8, write_queues=8)
    for i in range(3):
        workers.append(Worker(broker.url, "cg", "cluster", tmp_path / f"w{i}.jsonl", sleep_ms=2))
    wait_for(lambda: all(w.ready() for w in workers) and _members(admin, "cg", "cluster") == 3, 30, "3 members")
    producer = Producer(broker.url, group="pg")
    producer.start()
    try:
        sent = []
        for i in range(600):
            if i == 300:
                workers[0].kill9()
            sent.append(f"p1-{i}")
            producer.send(Message(topic="cluster", body=sent[-1].encode()))
        wait_for(lambda: _members(admin, "cg", "cluster") == 2, 20, "the broker to drop the killed member")
        time.sleep(2.5)  # let both survivors rebalance (the broker notified them at once)
        for i in range(400):
            sent.append(f"p2-{i}")
            producer.send(Message(topic="cluster", body=sent[-1].encode()))
    finally:
        producer.shutdown()

    def seen() -> set[str]:
        return {r["body"] for w in workers for r in w.records()}

    wait_for(lambda: seen() >= set(sent), 60, "every message to be consumed")
    records = [r for w in workers for r in w.records()]
    assert {r["body"] for r in records} >= set(sent)
    owners: dict[int, set[str]] = defaultdict(set)
    for r in records:
        if r["body"].startswith("p2-"):
            owners[r["q"]].add(r["cid"])
    assert sorted(owners) == list(range(8))
    assert all(len(cids) == 1 for cids in owners.values()), owners  # one member per queue once settled
    killed = next(r["cid"] for r in workers[0].records()) if workers[0].records() else None
    assert killed not in {c for cids in owners.values() for c in cids}
    per_member = defaultdict(int)
    for cids in owners.values():
        per_member[next(iter(cids))] += 1
    assert sorted(per_member.values()) == [4, 4]  # averagely: 8 queues over 2 members
    admin.shutdown()


@pytest.mark.slow
def test_orderly_keeps_queue_order_across_a_rebalance(broker: BrokerProcess, workers: list[Worker],
                                                      tmp_path: Path) -> None:
    admin = Admin(broker.url)
    admin.create_topic("ordered", read_queues=4, write_queues=4)
    workers.append(Worker(broker.url, "og", "ordered", tmp_path / "a.jsonl", orderly=True, sleep_ms=3))
    wait_for(lambda: workers[0].ready(), 30, "first member")
    producer = Producer(broker.url, group="opg")
    producer.start()
    total = 400
    try:
        for i in range(total):
            if i == 150:
                workers.append(Worker(broker.url, "og", "ordered", tmp_path / "b.jsonl", orderly=True, sleep_ms=3))
                # The rest is produced once the second member is up, so it always takes queues over
                # mid-stream, however fast the first member drained the first 150.
                wait_for(lambda: workers[1].ready(), 30, "second member")
            key = f"k{i % 8}"
            producer.send(Message(topic="ordered", body=f"{key}:{i}".encode(), keys=[key]), selector=select_by_hash)
    finally:
        producer.shutdown()
    wait_for(lambda: workers[1].ready(), 30, "second member")
    wait_for(lambda: len({r["body"] for w in workers for r in w.records()}) == total, 60, "all consumed")
    time.sleep(0.5)
    by_queue: dict[int, list[dict]] = defaultdict(list)
    for w in workers:
        for r in w.records():
            by_queue[r["q"]].append(r)
    both = 0
    for q, recs in by_queue.items():
        recs.sort(key=lambda r: r["t"])
        # per queue: every offset once, in order, even across the hand-over
        assert [r["o"] for r in recs] == list(range(len(recs))), q
        # and the per-key sequence numbers (several keys hash to one queue) only grow
        last: dict[str, int] = {}
        for r in recs:
            key, seq = r["body"].split(":")
            assert int(seq) > last.get(key, -1)
            last[key] = int(seq)
        cids = [r["cid"] for r in recs]
        changes = sum(1 for a, b in itertools.pairwise(cids) if a != b)
        assert changes <= 1, q  # handed over at most once, never interleaved
        both += changes
    assert both >= 1  # the second member did take queues over mid-stream
    assert {r["cid"] for r in workers[1].records()}  # and consumed
    admin.shutdown()
