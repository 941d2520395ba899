"""The data source's options, validated once (pydantic) so a typo'd value fails at planning time.

Spark hands options over as a case-insensitive map of strings; field names here are the documented
camelCase option names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ferrymq.common.limits import DEFAULT_MAX_MESSAGE_SIZE, check_group, check_topic
from ferrymq.pipeline.broker_http import RetryPolicy, base_url


class PipelineOptionError(ValueError):
    pass


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    endpoint: str = Field(description="controller or standalone broker URL")
    requestTimeoutMs: int = Field(30_000, ge=100)
    retries: int = Field(5, ge=0, le=50)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        return base_url(v)

    def policy(self) -> RetryPolicy:
        return RetryPolicy(timeout_s=self.requestTimeoutMs / 1000, retries=self.retries)


class ReadOptions(_Common):
    topic: str = Field(description="one topic or a comma-separated list")
    startingOffsets: str | None = None
    endingOffsets: str | None = None
    startingTimestamp: int | None = Field(None, ge=0, description="epoch ms; first message stored at/after")
    endingTimestamp: int | None = Field(None, ge=0, description="epoch ms; batch only: stop before")
    consumerGroup: str | None = None
    commitOffsets: bool = Field(False, description="streaming: commit each finished batch to consumerGroup")
    maxMessagesPerPartition: int | None = Field(None, ge=1)
    maxMessagesPerTrigger: int | None = Field(None, ge=1)
    failOnDataLoss: bool = True
    pullBatchSize: int = Field(1024, ge=1, le=65536)

    @field_validator("topic")
    @classmethod
    def _topics(cls, v: str) -> str:
        names = [t.strip() for t in v.split(",") if t.strip()]
        if not names:
            raise ValueError("give at least one topic")
        for t in names:
            check_topic(t)
        return ",".join(dict.fromkeys(names))

    @field_validator("consumerGroup")
    @classmethod
    def _group(cls, v: str | None) -> str | None:
        if v is not None:
            check_group(v)
        return v

    @property
    def topics(self) -> list[str]:
        return self.topic.split(",")


class WriteOptions(_Common):
    topic: str
    writeBatchSize: int = Field(128, ge=1, le=4096, description="messages per POST")
    writeBatchBytes: int = Field(4 * 1024 * 1024, ge=1024, description="approximate bytes per POST")
    maxMessageSize: int = Field(DEFAULT_MAX_MESSAGE_SIZE, ge=1, description="client-side body size limit")

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        check_topic(v.strip())
        return v.strip()


M = TypeVar("M", bound=_Common)


def parse(model: type[M], options: Mapping[str, Any]) -> M:
    lowered = {str(k).lower(): v for k, v in options.items()}
    data = {name: lowered[name.lower()] for name in model.model_fields if name.lower() in lowered}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e.get("loc", ())) or "options"
        msg = str(e.get("msg", "invalid"))
        raise PipelineOptionError(f"ferrymq data source: option {where}: {msg}") from None
    except Exception as exc:  # check_topic raises FerryError from inside a validator
        raise PipelineOptionError(f"ferrymq data source: {exc}") from None
