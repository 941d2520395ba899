"""Crash loop: kill -9 a SYNC_FLUSH standalone broker while clients send, restart it, and check that
every acknowledged message is still there, with its body, at the offset it was acknowledged with.

Small segments (256 KiB commit log, 64-entry consume-queue files) make the kills land across many
segment rollovers. Delays are random but seeded (FERRYMQ_CRASH_SEED overrides the seed), so a failure
can be replayed.
"""

from __future__ import annotations

import base64
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import BrokerProcess

pytestmark = pytest.mark.slow

TOPIC = "crash"
QUEUES = 4
ROUNDS = 22
SENDERS = 4
SEGMENT = 256 * 1024
CONFIG = {
    "mappedFileSizeCommitLog": SEGMENT,
    "consumeQueueEntriesPerFile": 64,
    # checkpoints move often, so recovery starts from many different places
    "flushIntervalConsumeQueue": 100,
}


@dataclass(frozen=True)
class Ack:
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes


def _post(url: str, payload: object, timeout: float = 10) -> tuple[int, object]:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


class Sender(threading.Thread):
    """Sends single and batched messages with unique bodies; remembers what was acknowledged."""

    def __init__(self, url: str, name: str, seed: int, acks: list[Ack], lock: threading.Lock) -> None:
        super().__init__(name=name, daemon=True)
        self.url = f"{url}/v1/topics/{TOPIC}/messages"
        self.tag = name
        self.rng = random.Random(seed)
        self.acks = acks
        self.lock = lock
        self.stop = threading.Event()
        self.seq = 0
        self.unexpected: list[str] = []

    def _body(self) -> bytes:
        self.seq += 1
        head = f"{self.tag}-{self.seq}-".encode()
        return head + self.rng.randbytes(self.rng.randint(16, 700))

    def run(self) -> None:
        while not self.stop.is_set():
            n = 1 if self.rng.random() < 0.5 else self.rng.randint(2, 8)
            bodies = [self._body() for _ in range(n)]
            items: list[dict[str, object]] = [{"bodyBase64": base64.b64encode(b).decode()} for b in bodies]
            if self.rng.random() < 0.5:  # an explicit queue sometimes, -1 (broker's choice) otherwise
                qid = self.rng.randint(0, QUEUES - 1)
                for it in items:
                    it["queueId"] = qid
            payload: object = items[0] if n == 1 else {"messages": items}
            try:
                status, answer = _post(self.url, payload)
            except OSError:
                continue  # killed mid-request, or not listening any more: not acknowledged
            if status != 200:
                # A dying broker may answer 5xx (not acknowledged); anything else is a real failure.
                if status < 500:
                    self.unexpected.append(f"status {status} for {payload!r:.200}")
                continue
            assert isinstance(answer, dict)
            results = answer["results"]
            if len(results) != n:
                self.unexpected.append(f"{n} messages sent, {len(results)} results")
                continue
            with self.lock:
                for r, body in zip(results, bodies, strict=True):
                    self.acks.append(Ack(r["queueId"], r["queueOffset"], r["msgId"], body))


def pull_queue(broker: BrokerProcess, queue_id: int) -> tuple[list[dict[str, object]], int, int]:
    """Every message of one queue, in order, with its min and max offsets."""
    out: list[dict[str, object]] = []
    offset = 0
    while True:
        status, page = broker.call("GET", f"/v1/topics/{TOPIC}/queues/{queue_id}/messages"
                                          f"?offset={offset}&maxMessages=1024")
        assert status == 200, page
        out.extend(page["messages"])
        if page["nextOffset"] >= page["maxOffset"] or page["nextOffset"] == offset:
            return out, page["minOffset"], page["maxOffset"]
        offset = page["nextOffset"]


def verify(broker: BrokerProcess, acks: list[Ack], label: str) -> int:
    """Every ack at its offset with its body and id; per queue no duplicates and no gaps."""
    stored: dict[tuple[int, int], dict[str, object]] = {}
    for q in range(QUEUES):
        msgs, mn, mx = pull_queue(broker, q)
        offsets = [m["queueOffset"] for m in msgs]
        assert mn == 0, f"{label}: queue {q} lost its head (minOffset {mn})"
        assert offsets == list(range(mx)), f"{label}: queue {q} offsets are not 0..{mx - 1} without gaps"
        for m in msgs:
            assert m["queueId"] == q
            stored[(q, m["queueOffset"])] = m  # type: ignore[index]
    for a in acks:
        m = stored.get((a.queue_id, a.queue_offset))
        assert m is not None, f"{label}: acknowledged message {a.msg_id} at {a.queue_id}/{a.queue_offset} is gone"
        assert base64.b64decode(m["bodyBase64"]) == a.body, (  # type: ignore[arg-type]
            f"{label}: message at {a.queue_id}/{a.queue_offset} has another body than acknowledged")
        assert m["msgId"] == a.msg_id, f"{label}: message at {a.queue_id}/{a.queue_offset} changed its id"
    return len(stored)


def last_start_line(broker: BrokerProcess) -> str:
    starts = [ln for ln in broker.log_path.read_text(errors="replace").splitlines() if " started on " in ln]
    assert starts, broker.log_tail()
    return starts[-1]


def test_kill9_loop_keeps_every_acknowledged_message(tmp_path: Path) -> None:
    seed = int(os.environ.get("FERRYMQ_CRASH_SEED", "20261121"))
    rng = random.Random(seed)
    data = tmp_path / "data"
    acks: list[Ack] = []
    lock = threading.Lock()

    broker = BrokerProcess(data, flush="sync", config=CONFIG).start()
    assert broker.call("PUT", f"/v1/topics/{TOPIC}",
                       {"readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": "RW"})[0] == 200
    recovered_rounds = 0
    try:
        for rnd in range(ROUNDS):
            label = f"seed {seed} round {rnd}"
            senders = [Sender(broker.url, f"r{rnd}w{i}", rng.getrandbits(32), acks, lock) for i in range(SENDERS)]
            for s in senders:
                s.start()
            # Mostly mid-stream kills; now and then one right after the senders start.
            time.sleep(rng.choice([0.05, rng.uniform(0.2, 1.4)]))
            broker.kill9()
            for s in senders:
                s.stop.set()
            for s in senders:
                s.join(15)
                assert not s.is_alive(), f"{label}: sender {s.name} hangs"
                assert not s.unexpected, f"{label}: {s.unexpected[:3]}"

            broker = BrokerProcess(data, flush="sync", config=CONFIG).start()
            if "recovered" in last_start_line(broker):
                recovered_rounds += 1
            verify(broker, acks, label)

        segments = sorted(p.name for p in (data / "commitlog").iterdir())
        assert len(segments) >= 8, f"only {len(segments)} commit-log segments: the loop never rolled over much"
        assert all(len(n) == 20 and n.isdigit() and int(n) % SEGMENT == 0 for n in segments)
        assert recovered_rounds == ROUNDS, "every restart after kill -9 must run crash recovery"
        assert len(acks) > 1000, f"only {len(acks)} acknowledged messages: the senders barely ran"

        # A clean SIGTERM afterwards: the next start is a clean (fast) start, with the same data.
        assert broker.terminate() == 0
        broker = BrokerProcess(data, flush="sync", config=CONFIG).start()
        assert "clean start" in last_start_line(broker), last_start_line(broker)
        verify(broker, acks, f"seed {seed} after SIGTERM")
        assert not (data / "corrupt").exists(), "kill -9 alone must not damage any record"
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.terminate()
