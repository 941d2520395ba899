"""AllocateMessageQueueAveragely, exhaustively for small groups, plus client-side pieces that are pure:
process-queue commit offsets and latency fault avoidance."""

from __future__ import annotations

from ferrymq.client.allocate import allocate_averagely
from ferrymq.client.fault import LatencyFaultTolerance, QueueSelector
from ferrymq.client.message import MessageQueue, ReceivedMessage
from ferrymq.client.process_queue import ProcessQueue


def test_allocation_is_a_disjoint_even_cover() -> None:
    for n in range(0, 25):
        queues = [MessageQueue("t", "g", q) for q in range(n)]
        for m in range(1, 12):
            members = [f"c{i:02d}" for i in range(m)]
            shares = [allocate_averagely(queues, members, c) for c in members]
            flat = [q for s in shares for q in s]
            assert sorted(flat) == queues, (n, m)  # every queue exactly once
            sizes = [len(s) for s in shares]
            assert max(sizes) - min(sizes) <= 1
            for s in shares:  # contiguous ranges, as RocketMQ
                assert s == queues[queues.index(s[0]):queues.index(s[0]) + len(s)] if s else True


def test_allocation_known_values_and_strangers() -> None:
    qs = list(range(8))
    members = ["a", "b", "c"]
    assert [allocate_averagely(qs, members, c) for c in members] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert allocate_averagely(qs, members, "zz") == []
    assert allocate_averagely(qs[:2], members, "c") == []


def _msg(off: int) -> ReceivedMessage:
    return ReceivedMessage("m", "t", 0, off, b"", None, [], {}, 0, 0, 0, "g")


def test_process_queue_commits_the_lowest_offset_not_done() -> None:
    pq = ProcessQueue(MessageQueue("t", "g", 0), 10)
    assert pq.commit_offset() == 10
    msgs = [_msg(o) for o in range(10, 15)]
    pq.put(msgs)
    pq.put([_msg(12)])  # a duplicate from a re-pull is ignored
    assert len(pq) == 5
    assert pq.remove([msgs[1], msgs[3]]) == 10
    assert pq.remove([msgs[0]]) == 12
    assert pq.head(2) == [msgs[2], msgs[4]]
    assert pq.remove([msgs[4]]) == 12
    assert pq.remove([msgs[2]]) == 15


def test_fault_avoidance_skips_slow_and_failed_groups() -> None:
    now = [0.0]
    fault = LatencyFaultTolerance(clock=lambda: now[0])
    sel = QueueSelector(fault)
    queues = [MessageQueue("t", g, q) for g in ("a", "b") for q in range(2)]
    fault.update("a", 700, False)  # 550 ms step: avoided for 30 s
    assert {sel.select(queues, None).broker_group for _ in range(10)} == {"b"}
    fault.update("b", 10, True)  # isolated after a failure
    picked = {sel.select(queues, None).broker_group for _ in range(10)}
    assert picked == {"a"}  # both avoided: the one that recovers first
    assert {sel.select(queues, "a").broker_group for _ in range(10)} == {"b"}  # never the one that just failed
    now[0] += 31
    assert {sel.select(queues, None).broker_group for _ in range(10)} == {"a"}
    now[0] += 600
    assert {sel.select(queues, None).broker_group for _ in range(20)} == {"a", "b"}
