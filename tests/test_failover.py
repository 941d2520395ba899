"""Controller mode with real processes: a 3-replica SYNC group survives repeated master kills.

Every acknowledged message must be present exactly once, at the offset it was acknowledged with, on
every replica, with per-queue order intact; the killed master comes back as a slave after cutting its
unacknowledged tail.
"""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import ControllerProcess, ReplicaProcess, http, wait_until

GROUP = "g1"
TOPIC = "ft"
QUEUES = 4
HEARTBEAT_TIMEOUT_MS = 2000
BROKER_CONFIG: dict[str, Any] = {
    "mappedFileSizeCommitLog": 256 * 1024,
    "consumeQueueEntriesPerFile": 2000,
    "controllerHeartbeatInterval": 200,
    "masterLease": 1200,
    "haMaxTimeSlaveNotCatchup": 3000,
    "syncFlushTimeout": 3000,
    "allAckInSyncStateSet": True,
    "slaveSyncInterval": 300,
}


class Cluster:
    def __init__(self, root: Path, n: int = 3, broker_config: dict[str, Any] | None = None,
                 controller_extra: list[str] | None = None, replication: str = "sync") -> None:
        self.controller = ControllerProcess(root / "ctl", extra=[
            "--heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS), *(controller_extra or [])]).start()
        cfg = {**BROKER_CONFIG, **(broker_config or {})}
        self.replicas = [ReplicaProcess(root, f"r{i}", GROUP, self.controller.url, config=cfg,
                                        replication=replication) for i in range(n)]
        for r in self.replicas:
            r.start()

    def group(self) -> dict[str, Any]:
        status, body = self.controller.call("GET", f"/v1/groups/{GROUP}")
        assert status == 200, body
        return body

    def master(self) -> ReplicaProcess | None:
        m = self.group().get("master")
        if not m:
            return None
        return next((r for r in self.replicas if r.name == m["name"] and r.alive()), None)

    def wait_master(self, timeout: float = 20) -> ReplicaProcess:
        def ready() -> ReplicaProcess | None:
            m = self.master()
            if m is None:
                return None
            status, health = m.call("GET", "/v1/health", timeout=2)
            return m if status == 200 and health.get("role") == "master" else None

        return wait_until(ready, timeout, 0.1, "a master")

    def wait_in_sync(self, size: int, timeout: float = 30) -> None:
        wait_until(lambda: len(self.group()["syncStateSet"]) == size, timeout, 0.1, f"a SyncStateSet of {size}")


class Sender(threading.Thread):
    """Sends unique messages to whoever is master; records what was acknowledged, and by whom."""

    def __init__(self, cluster: Cluster, sid: int) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.sid = sid
        self.seq = 0
        self.acked: list[tuple[int, int, str, str, float]] = []  # queueId, queueOffset, body, master, time
        self.stop_flag = threading.Event()
        self.master: ReplicaProcess | None = None

    def run(self) -> None:
        while not self.stop_flag.is_set():
            if self.master is None:
                try:
                    self.master = self.cluster.master()
                except (OSError, AssertionError):
                    self.master = None
                if self.master is None:
                    time.sleep(0.05)
                    continue
            self.seq += 1
            body = f"s{self.sid}-{self.seq}"
            try:
                status, ans = http("POST", f"{self.master.url}/v1/topics/{TOPIC}/messages", {"body": body}, timeout=10)
            except OSError:
                status, ans = 0, None
            if status == 200:
                r = ans["results"][0]
                self.acked.append((r["queueId"], r["queueOffset"], body, self.master.name, time.monotonic()))
            else:
                self.master = None
                time.sleep(0.05)


def _read_queue(replica: ReplicaProcess, qid: int) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    offset = 0
    while True:
        status, ans = replica.call("GET", f"/v1/topics/{TOPIC}/queues/{qid}/messages?offset={offset}&maxMessages=500")
        assert status == 200, ans
        out += [(m["queueOffset"], m["body"]) for m in ans["messages"]]
        if not ans["messages"]:
            return out
        offset = ans["nextOffset"]


def _queue_maxes(replica: ReplicaProcess) -> list[int]:
    status, ans = replica.call("GET", f"/v1/topics/{TOPIC}")
    return [q["maxOffset"] for q in ans["queues"]] if status == 200 else []


@pytest.mark.slow
def test_repeated_master_kills_lose_no_acknowledged_message(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    master = cluster.wait_master()
    status, body = master.call("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": QUEUES, "writeQueueNums": QUEUES})
    assert status == 200, body
    cluster.wait_in_sync(3)
    senders = [Sender(cluster, i) for i in range(2)]
    for s in senders:
        s.start()
    failovers: list[float] = []
    try:
        for _round in range(10):
            time.sleep(0.8)
            victim = cluster.wait_master()
            acked_before = sum(len(s.acked) for s in senders)
            killed_at = time.monotonic()
            victim.kill9()
            wait_until(lambda v=victim, k=killed_at: any(a[3] != v.name and a[4] > k for s in senders for a in s.acked),
                       30, 0.02, "an acknowledged send on a new master")
            first = min(a[4] for s in senders for a in s.acked if a[4] > killed_at and a[3] != victim.name)
            failovers.append(first - killed_at)
            assert sum(len(s.acked) for s in senders) > acked_before
            victim.start()
            cluster.wait_in_sync(3)
    finally:
        for s in senders:
            s.stop_flag.set()
        for s in senders:
            s.join(20)
    print(f"failover times: median {statistics.median(failovers):.2f} s, max {max(failovers):.2f} s")
    assert max(failovers) < 15

    acked = [a for s in senders for a in s.acked]
    assert len(acked) > 50
    master = cluster.wait_master()
    wait_until(lambda: all(_queue_maxes(r) == _queue_maxes(master) for r in cluster.replicas), 30, 0.2,
               "every replica serving the master's queues")
    for replica in cluster.replicas:
        stored: dict[tuple[int, int], str] = {}
        seen_bodies: dict[str, int] = {}
        for q in range(QUEUES):
            entries = _read_queue(replica, q)
            assert [o for o, _ in entries] == list(range(len(entries))), f"{replica.name}: gap in queue {q}"
            for off, body in entries:
                stored[(q, off)] = body
                seen_bodies[body] = seen_bodies.get(body, 0) + 1
        for qid, qoff, body, _m, _t in acked:
            assert stored.get((qid, qoff)) == body, f"{replica.name}: acknowledged {body} missing at {qid}/{qoff}"
            assert seen_bodies[body] == 1, f"{replica.name}: {body} stored {seen_bodies[body]} times"
        # Per-queue order: each sender's acknowledged messages keep their send order within a queue.
        for s in senders:
            for q in range(QUEUES):
                offs = [a[1] for a in s.acked if a[0] == q]
                assert offs == sorted(offs)
