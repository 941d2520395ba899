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
