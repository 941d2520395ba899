"""Prometheus metrics of one broker, in a registry of its own (several brokers may share a process)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ferrymq.broker.store.commitlog import Appended
from ferrymq.common.record import peek_size_magic

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class BrokerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.messages_in = Counter("ferrymq_messages_in", "Messages stored, per topic", ["topic"], registry=r)
        self.bytes_in = Counter("ferrymq_bytes_in", "Record bytes stored, per topic", ["topic"], registry=r)
        self.messages_out = Counter("ferrymq_messages_out", "Messages served to pulls, per topic",
                                    ["topic"], registry=r)
        self.bytes_out = Counter("ferrymq_bytes_out", "Record bytes served to pulls, per topic", ["topic"],
                                 registry=r)
        self.put_latency = Histogram("ferrymq_put_latency_seconds",
                                     "Time from append to acknowledgement (flush and replication included)",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.flush_latency = Histogram("ferrymq_flush_latency_seconds", "Duration of commit-log fdatasync calls",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.commitlog_size = Gauge("ferrymq_commitlog_size_bytes",
                                    "Bytes between the commit log's first and last offset", registry=r)
        self.commitlog_max_offset = Gauge("ferrymq_commitlog_max_offset", "Commit-log write offset", registry=r)
        self.commitlog_flushed_offset = Gauge("ferrymq_commitlog_flushed_offset", "Commit-log fsync'd offset",
                                              registry=r)
        self.disk_used_ratio = Gauge("ferrymq_disk_used_ratio", "Used fraction of the data directory's disk",
                                     registry=r)
        self.corrupt_records = Gauge("ferrymq_corrupt_records_skipped",
                                     "Damaged records found on read and never served", registry=r)
        self.role = Gauge("ferrymq_broker_role", "1 for the current role", ["role"], registry=r)
        self._collect_hooks: list[Callable[[], None]] = []

    def observe_put(self, recs: list[Appended], seconds: float) -> None:
        self.put_latency.observe(seconds)
        by_topic: dict[str, list[int]] = {}
        for a in recs:
            agg = by_topic.setdefault(a.topic, [0, 0])
            agg[0] += 1
            agg[1] += a.size
        for topic, (n, size) in by_topic.items():
            self.messages_in.labels(topic).inc(n)
            self.bytes_in.labels(topic).inc(size)

    def observe_get(self, topic: str, records: list[bytes]) -> None:
        if records:
            self.messages_out.labels(topic).inc(len(records))
            self.bytes_out.labels(topic).inc(sum(peek_size_magic(r)[0] for r in records))

    def on_collect(self, hook: Callable[[], None]) -> None:
        self._collect_hooks.append(hook)

    def render(self) -> bytes:
        for hook in self._collect_hooks:
            hook()
        return generate_latest(self.registry)
