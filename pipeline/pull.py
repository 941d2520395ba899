"""Executor side of reading: pull one queue's offset range over the broker's HTTP API.

An input partition carries everything the task needs (group, master address, topic, queue, range,
and the endpoint to find a new master after a failover), so executors never call back to the driver.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

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


def read_range(p: QueueRangePartition, *, fail_on_data_loss: bool, batch_size: int,
               policy: RetryPolicy) -> Iterator[pa.RecordBatch]:
    """Every message of [start, end) in order, as record batches; gaps per failOnDataLoss."""
    client = BrokerHttp(p.address, policy)
    path = f"/v1/topics/{p.topic}/queues/{p.queue_id}/messages"
    offset = p.start
    rerouted = False
    try:
        while offset < p.end:
            try:
                ans = client.get(path, offset=offset, maxMessages=min(batch_size, p.end - offset))
            except BrokerUnavailable:
                # The master may have moved (failover): ask the endpoint once where it is now.
                new_address = None if rerouted else _current_master(p, policy)
                if new_address is None or new_address == client.url:
                    raise
                log.warning("%s: master moved from %s to %s", p.where(), client.url, new_address)
                client.close()
                client = BrokerHttp(new_address, policy)
                rerouted = True
                continue
            status = ans.get("status")
            if status == "OFFSET_TOO_SMALL":
                lowest = int(ans["minOffset"])
                data_loss(p, offset, min(lowest, p.end), f"the queue now starts at {lowest}", fail_on_data_loss)
                offset = lowest
                continue
            if status in PAST_THE_END:
                top = int(ans["maxOffset"])
                data_loss(p, max(offset, top), p.end, f"the queue now ends at {top}", fail_on_data_loss)
                return
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
            next_offset = int(ans["nextOffset"])
            if next_offset <= offset:
                raise RuntimeError(f"{p.where()}: the broker did not advance past offset {offset} ({status})")
            if min(next_offset, p.end) > expected:
                data_loss(p, expected, min(next_offset, p.end), "records missing from the commit log",
                          fail_on_data_loss)
            if msgs:
                yield to_batch(p.topic, p.group, msgs)
            offset = next_offset
    finally:
        client.close()


def _current_master(p: QueueRangePartition, policy: RetryPolicy) -> str | None:
    from ferrymq.pipeline.routes import discover

    try:
        for r in discover(p.endpoint, p.topic, policy):
            if r.group == p.group:
                return r.address
    except Exception as exc:
        log.warning("%s: could not look up the current master: %s", p.where(), exc)
    return None
