"""Broker configuration: one pydantic model, RocketMQ's camelCase keys and defaults.

A ``--config FILE`` (YAML or JSON) and the Kubernetes ConfigMap use the same keys as RocketMQ's
broker.conf (``flushDiskType``, ``syncFlushTimeout``, ``fileReservedTime`` ...); Python code uses the
snake_case attribute names.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

GiB = 1024**3
MiB = 1024**2


class FlushDiskType(StrEnum):
    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


class ReplicationMode(StrEnum):
    SYNC = "SYNC"
    ASYNC = "ASYNC"


class StoreConfig(BaseModel):
    """What the message store needs; a subset of the broker's settings."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    store_path_root_dir: str = "./data"
    mapped_file_size_commit_log: int = Field(GiB, ge=64 * 1024)
    consume_queue_entries_per_file: int = Field(300_000, ge=16)
    preallocate_commit_log: bool = True
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    sync_flush_timeout: int = Field(5000, ge=1, description="ms a SYNC_FLUSH put waits for its fsync")
    flush_interval_commit_log: int = Field(500, ge=1, description="ms between ASYNC_FLUSH flushes")
    flush_commit_log_least_pages: int = Field(4, ge=0)
    flush_commit_log_thorough_interval: int = Field(10_000, ge=1)
    flush_interval_consume_queue: int = Field(1000, ge=1)
    file_reserved_time: float = Field(72, gt=0, description="hours a commit-log segment is kept")
    delete_when: str = Field("04", description="hours of day (';'-separated) when expired files go")
    disk_max_used_space_ratio: int = Field(75, ge=10, le=95, description="percent; above it expire now")
    disk_space_clean_forcibly_ratio: float = Field(0.85, gt=0, le=1)
    disk_space_warning_level_ratio: float = Field(0.90, gt=0, le=1)
    clean_resource_interval: int = Field(10_000, ge=10, description="ms between retention passes")
    max_message_size: int = Field(4 * MiB, ge=1024)

    @field_validator("delete_when")
    @classmethod
    def _hours(cls, v: str) -> str:
        for part in v.split(";"):
            if not part.strip().isdigit() or not 0 <= int(part) <= 23:
                raise ValueError("deleteWhen is a ';'-separated list of hours 0-23")
        return v

    def delete_hours(self) -> set[int]:
        return {int(p) for p in self.delete_when.split(";")}


class BrokerConfig(StoreConfig):
    """Every broker setting. Unknown keys are an error, so a typo in a ConfigMap is caught at start."""

    broker_name: str = "standalone"
    broker_ip: str = "127.0.0.1"
    listen_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=0, le=65535)
    tcp_port: int = Field(10911, ge=0, le=65535)
    ha_port: int = Field(10912, ge=0, le=65535)
    auto_create_topic_enable: bool = False
    default_topic_queue_nums: int = Field(4, ge=1, le=1024)
    max_pull_messages: int = Field(1024, ge=1)
    long_polling_max_ms: int = Field(30_000, ge=0)
    max_http_body_size: int = Field(64 * MiB, ge=1024)
    replication_mode: ReplicationMode = ReplicationMode.ASYNC
    in_sync_replicas: int = Field(1, ge=1)
    min_in_sync_replicas: int = Field(1, ge=1)
    all_ack_in_sync_state_set: bool = False
    # TCP protocol and consumer groups (issue #3)
    server_channel_max_idle_time_seconds: float = Field(120, gt=0, description="close TCP connections idle so long")
    channel_expired_timeout: int = Field(120_000, ge=100, description="ms without heartbeat before a client is dropped")
    rebalance_lock_max_live_time: int = Field(60_000, ge=100, description="ms an unrenewed queue lock lives")
    server_max_inflight_requests_per_channel: int = Field(1024, ge=1, description="past it: SYSTEM_BUSY")
    frame_max_length: int = Field(64 * MiB + 64 * 1024, ge=64 * 1024, description="largest TCP frame accepted")
    # controller mode (RocketMQ 5 names where they exist)
    controller_addr: str | None = None
    broker_replica_name: str = Field("", description="stable replica name (the pod name); default hostname")
    advertise_host: str | None = None
    election_priority: int = 0
    ha_transfer_batch_size: int = Field(32 * 1024, ge=4096)
    ha_max_time_slave_not_catchup: int = Field(15_000, ge=100, description="ms before a lagging slave leaves ISR")
    controller_heartbeat_interval: int = Field(1000, ge=50, description="ms between heartbeats to the controller")
    master_lease: int = Field(
        7000, ge=100,
        description="ms a master keeps taking writes without a controller confirmation; must stay below "
        "the controller's heartbeat timeout so a deposed master is fenced before a new one is elected",
    )
    slave_sync_interval: int = Field(3000, ge=100, description="ms between topic/offset syncs from the master")
    # delay, timer, transaction and retry messages (issue #4); RocketMQ's keys and defaults
    message_delay_level: str = Field("1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
                                     description="durations of delay levels 1..N (units ms, s, m, h, d)")
    timer_max_delay_sec: int = Field(3 * 86_400, ge=1, description="latest deliverAtMs accepted, from now")
    timer_precision_ms: int = Field(1000, ge=10, le=1000, description="tick of the timing wheel")
    transaction_check_interval: int = Field(30_000, ge=10, description="ms between half-message check rounds")
    transaction_time_out: int = Field(6_000, ge=0, description="ms a half message waits before its first check")
    transaction_check_max: int = Field(15, ge=1, description="checks before a half message is discarded")
    transaction_check_url_prefixes: list[str] = Field(
        default_factory=list, description="allowed prefixes of HTTP producers' checkUrl; empty = any http(s) URL")
    transaction_check_callback_timeout: int = Field(3000, ge=10, description="ms an HTTP check callback may take")
    max_reconsume_times: int = Field(16, ge=0, description="deliveries after the first before the DLQ")

    @field_validator("message_delay_level")
    @classmethod
    def _delay_levels(cls, v: str) -> str:
        from ferrymq.common.durations import parse_delay_levels

        parse_delay_levels(v)
        return v

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> BrokerConfig:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a map of settings")
        raw = {k: v for k, v in raw.items()}
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(raw)

    def store_config(self) -> StoreConfig:
        return StoreConfig.model_validate(self.model_dump(include=set(StoreConfig.model_fields)))
