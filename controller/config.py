"""Controller settings: one pydantic model with RocketMQ-style camelCase keys (``--config FILE``, flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel


class ControllerConfig(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    listen: str = Field("127.0.0.1:9876", description="HOST:PORT the HTTP API binds")
    store: str = Field("file://./ferrymq-controller", description="file:///dir, etcd://h:p[,h:p][/prefix], "
                       "kubernetes://namespace/name")
    advertise_address: str | None = Field(None, description="the URL other controllers redirect to; "
                                          "default http://<listen>")
    controller_broker_heartbeat_timeout: int = Field(10_000, ge=100, description="ms without a heartbeat "
                                                     "before a broker counts as dead")
    scan_interval: int = Field(500, ge=10, description="ms between the leader's expiry scans")
    enable_elect_unclean_master: bool = Field(False, description="elect outside the SyncStateSet when no "
                                              "in-sync replica is alive (may lose acknowledged messages)")
    switch_timeout: int = Field(10_000, ge=100, description="ms a graceful master switch may take before "
                                "it is abandoned")
    leader_lease_seconds: int = Field(10, ge=1, le=3600, description="leadership lease (etcd lease TTL, "
                                      "Kubernetes Lease duration)")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("listen must be HOST:PORT")
        return v

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> ControllerConfig:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a map of settings")
        # flags win over the file; both spell keys the camelCase way so neither shadows the other
        raw.update({to_camel(k): v for k, v in overrides.items() if v is not None})
        return cls.model_validate(raw)
