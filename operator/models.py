"""Pydantic models of the ferrymq.io/v1alpha1 custom resources.

These models are the single source of truth: the CRD YAML is generated from them
(see :mod:`ferrymq.operator.crds`), and the operator parses objects with them.
Field names are the contract's (camelCase on the wire, via aliases).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP = "ferrymq.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# Kubernetes names used as label values, service names and pod DNS labels must stay
# short enough that "<name>-headless" and "<name>-<ordinal>" remain valid DNS labels.
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# RocketMQ's topic name rule (TopicValidator): letters, digits, '%', '|', '-', '_'.
TOPIC_PATTERN = r"^[%|a-zA-Z0-9_-]+$"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# Quantities such as "500m" or 2 are int-or-string in Kubernetes.
Quantity = int | str


class StorageSpec(_Model):
    size: Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")] = "10Gi"
    storage_class_name: str | None = Field(default=None, description="Empty: the cluster's default class.")


class ReplicationSpec(_Model):
    mode: Literal["SYNC", "ASYNC"] = "SYNC"
    in_sync_replicas: Annotated[int, Field(ge=1, le=16)] = 2
    min_in_sync_replicas: Annotated[int, Field(ge=1, le=16)] = 1
    all_ack_in_sync_state_set: bool = False

    @model_validator(mode="after")
    def _min_not_above_target(self) -> ReplicationSpec:
        if self.min_in_sync_replicas > self.in_sync_replicas:
            raise ValueError("minInSyncReplicas must not exceed inSyncReplicas")
        return self


class ResourcesSpec(_Model):
    limits: dict[str, Quantity] | None = None
    requests: dict[str, Quantity] | None = None


class BrokerGroupSpec(_Model):
    replicas: Annotated[int, Field(ge=1, le=16)] = 3
    image: str = Field(default="ferrymq:latest", min_length=1)
    storage: StorageSpec = Field(default_factory=StorageSpec, json_schema_extra={"default": {}})
    flush_disk_type: Literal["SYNC_FLUSH", "ASYNC_FLUSH"] = "ASYNC_FLUSH"
    replication: ReplicationSpec = Field(default_factory=ReplicationSpec, json_schema_extra={"default": {}})
    resources: ResourcesSpec | None = None
    config: dict[str, str] | None = Field(
        default=None, description="Broker settings (RocketMQ camelCase keys), written to the ConfigMap."
    )
    # Beyond the contract: knobs a cluster admin needs without editing the operator.
    controller_url: str | None = Field(
        default=None, description="Controller URL; default: the operator's FERRYMQ_CONTROLLER_URL."
    )
    termination_grace_period_seconds: Annotated[int, Field(ge=10, le=3600)] = 60
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None

    @model_validator(mode="after")
    def _replication_fits(self) -> BrokerGroupSpec:
        if self.replication.min_in_sync_replicas > self.replicas:
            raise ValueError("replication.minInSyncReplicas must not exceed replicas")
        return self


# The same cross-field rules, for the API server (CEL, Kubernetes >= 1.25).
BROKER_GROUP_CEL_RULES = [
    {
        "rule": "self.replication.minInSyncReplicas <= self.replicas",
        "message": "replication.minInSyncReplicas must not exceed replicas",
    },
    {
        "rule": "self.replication.minInSyncReplicas <= self.replication.inSyncReplicas",
        "message": "minInSyncReplicas must not exceed inSyncReplicas",
    },
]


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = Field(default=None, json_schema_extra={"format": "date-time"})
    observed_generation: int | None = None


class BrokerGroupStatus(_Model):
    phase: str | None = Field(default=None, description="Pending, Running, Rolling, Scaling or Degraded.")
    replicas: int | None = None
    ready_replicas: int | None = None
    master: str | None = Field(default=None, description="Pod name of the current master.")
    master_epoch: int | None = None
    sync_state_set: list[str] | None = Field(default=None, description="Pod names in the SyncStateSet.")
    sync_state_set_epoch: int | None = None
    update_revision: str | None = None
    updated_replicas: int | None = None
    rolling: str | None = Field(default=None, description="What the rolling update waits for, if any.")
    conditions: list[Condition] | None = None
    observed_generation: int | None = None


class TopicSpec(_Model):
    topic_name: Annotated[str, Field(pattern=TOPIC_PATTERN, max_length=127)] | None = Field(
        default=None, description="Default: metadata.name."
    )
    read_queue_nums: Annotated[int, Field(ge=1, le=1024)] = 8
    write_queue_nums: Annotated[int, Field(ge=1, le=1024)] = 8
    perm: Literal["RW", "R", "W"] = "RW"
    message_type: Literal["NORMAL", "FIFO", "DELAY", "TRANSACTION"] = "NORMAL"
    broker_groups: list[Annotated[str, Field(pattern=NAME_PATTERN)]] | None = Field(
        default=None, description="BrokerGroup names; default: every BrokerGroup in the namespace."
    )

    @model_validator(mode="after")
    def _no_unread_queues(self) -> TopicSpec:
        # Queues written but never read would strand messages.
        if self.write_queue_nums > self.read_queue_nums:
            raise ValueError("writeQueueNums must not exceed readQueueNums")
        return self


TOPIC_CEL_RULES = [
    {
        "rule": "self.writeQueueNums <= self.readQueueNums",
        "message": "writeQueueNums must not exceed readQueueNums",
    }
]


class TopicGroupStatus(_Model):
    read_queue_nums: int | None = None
    write_queue_nums: int | None = None
    phase: str | None = Field(default=None, description="Ready, Shrinking or Error.")
    draining_queues: list[int] | None = Field(
        default=None, description="Queues waiting for every consumer group before readQueueNums drops."
    )
    remaining_messages: int | None = None
    write_shrunk_at: str | None = None
    message: str | None = None


class TopicStatus(_Model):
    topic_name: str | None = None
    groups: dict[str, TopicGroupStatus] | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = None
