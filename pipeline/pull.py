"""Executor side of reading: pull one queue's offset range over the broker's HTTP API.

An input partition carries everything the task needs (group, master address, topic, queue, range,
and the endpoint to find a new master after a failover), so executors never call back to the driver.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from ferrymq.pipeline.broker_http import BrokerHttp, BrokerUnavailable, RetryPolicy
from ferrymq.pipeline.offsets import QueueKey, QueueRange
from ferrymq.pipeline.schema import to_batch

log = logging.getLogger(__name__)

PAST_THE_END = frozenset({"NO_NEW_MSG", "OFFSET_OVERFLOW_ONE", "OFFSET_OVERFLOW_BADLY"})


class DataLossError(RuntimeError):
    """Offsets the query needs are gone from the broker (retention removed them, or a failover lost
    them). Raised only when failOnDataLoss is true."""


@dataclass
class QueueRangePartition(InputPartition):
    topic: str
    group: str
    address: str
    queue_id: int
    start: int
    end: int
    endpoint: str

    @classmethod
    def of(cls, r: QueueRange, address: str, endpoint: str) -> QueueRangePartition:
        return cls(r.key.topic, r.key.group, address, r.key.queue_id, r.start, r.end, endpoint)

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.topic, self.group, self.queue_id)

    def where(self) -> str:
        return f"{self.topic}/{self.group}/queue {self.queue_id}"


def data_loss(p: QueueRangePartition, lost_from: int, lost_to: int, reason: str, fail: bool) -> None:
    text = (f"data loss in {p.where()}: offsets [{lost_from}, {lost_to}) that this query needs are no longer "
            f"on the broker ({reason})")
    if fail:
        raise DataLossError(f"{text}. Set failOnDataLoss=false to skip them with a warning, or restart the "
                            "query from a later position.")
    log.warning("%s; skipped because failOnDataLoss=false", text)


class _Fetcher:
    """Pulls for one partition; after a failed connection it asks the endpoint once for a new master."""

    def __init__(self, p: QueueRangePartition, policy: RetryPolicy, batch_size: int) -> None:
        self.p = p
        self.policy = policy
        self.batch_size = batch_size
        self.client = BrokerHttp(p.address, policy)
        self.path = f"/v1/topics/{p.topic}/queues/{p.queue_id}/messages"
        self.rerouted = False

    def fetch(self, offset: int) -> dict[str, Any]:
        while True:
            try:
                return self.client.get(self.path, offset=offset,
                                       maxMessages=min(self.batch_size, self.p.end - offset))
            except BrokerUnavailable:
                new_address = None if self.rerouted else _current_master(self.p, self.policy)
                if new_address is None or new_address == self.client.url:
                    raise
                log.warning("%s: master moved from %s to %s", self.p.where(), self.client.url, new_address)
                self.client.close()
                self.client = BrokerHttp(new_address, self.policy)
                self.rerouted = True

    def close(self) -> None:
        self.client.close()


def read_range(p: QueueRangePartition, *, fail_on_data_loss: bool, batch_size: int,
               policy: RetryPolicy) -> Iterator[pa.RecordBatch]:
    """Every message of [start, end) in order, as record batches; gaps per failOnDataLoss.

    The next pull is in flight (on a helper thread; the socket wait releases the GIL) while this
    thread decodes the previous answer into Arrow, so the broker's time and ours overlap.
    """
    if p.start >= p.end:
        return
    fetcher = _Fetcher(p, policy, batch_size)
    pool = ThreadPoolExecutor(1, thread_name_prefix="ferrymq-pull")
    offset = p.start
    pending: Future[dict[str, Any]] | None = pool.submit(fetcher.fetch, offset)
    try:
        while pending is not None:
            ans = pending.result()
            pending = None
            status = ans.get("status")
            if status == "OFFSET_TOO_SMALL":
                lowest = int(ans["minOffset"])
                data_loss(p, offset, min(lowest, p.end), f"the queue now starts at {lowest}", fail_on_data_loss)
                offset = lowest
                if offset < p.end:
                    pending = pool.submit(fetcher.fetch, offset)
                continue
            if status in PAST_THE_END:
                top = int(ans["maxOffset"])
                data_loss(p, max(offset, top), p.end, f"the queue now ends at {top}", fail_on_data_loss)
                return
            next_offset = int(ans["nextOffset"])
            if next_offset <= offset:
                raise RuntimeError(f"{p.where()}: the broker did not advance past offset {offset} ({status})")
            if next_offset < p.end:
                pending = pool.submit(fetcher.fetch, next_offset)
            msgs = []
            expected = offset
            for m in ans["messages"]:
                qoff = int(m["queueOffset"])
                if qoff < offset or qoff >= p.end:
                    continue
                if qoff > expected:
                    data_loss(p, expected, qoff, "records missing from the commit log", fail_on_data_loss)
                msgs.append(m)
                expected = qoff + 1
            if min(next_offset, p.end) > expected:
                data_loss(p, expected, min(next_offset, p.end), "records missing from the commit log",
                          fail_on_data_loss)
            if msgs:
                yield to_batch(p.topic, p.group, msgs)
            offset = next_offset
    finally:
        # Let an in-flight pull finish (bounded by the request timeout) before closing its socket.
        pool.shutdown(wait=True, cancel_futures=True)
        fetcher.close()


def _current_master(p: QueueRangePartition, policy: RetryPolicy) -> str | None:
    from ferrymq.pipeline.routes import discover

    try:
        for r in discover(p.endpoint, p.topic, policy):
            if r.group == p.group:
                return r.address
    except Exception as exc:
        log.warning("%s: could not look up the current master: %s", p.where(), exc)
    return None
