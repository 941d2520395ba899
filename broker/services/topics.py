"""Topic configs: read/write queue counts and permission, as RocketMQ's TopicConfigManager.

writeQueueNums bounds where producers may send (queueId -1 picks among them); readQueueNums bounds
what consumers may pull. Shrinking is done in two steps (write first, read once drained); the operator
drives that. Configs are persisted with write-fsync-rename on every change.
"""

from __future__ import annotations

import itertools
import threading
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ferrymq.common.durable import read_json, write_json_atomic
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import check_topic

PERM_READ = 4
PERM_WRITE = 2
MAX_QUEUE_NUMS = 1024
_PERM_NAMES = {"RW": 6, "WR": 6, "R": 4, "W": 2, "": 0, "DENY": 0, "NONE": 0}


class MessageType(StrEnum):
    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"


def perm_name(perm: int) -> str:
    return ("R" if perm & PERM_READ else "") + ("W" if perm & PERM_WRITE else "") or "DENY"


class TopicConfigIn(BaseModel):
    """The body of ``PUT /v1/topics/{topic}``."""

    model_config = ConfigDict(extra="forbid")

    readQueueNums: int = Field(8, ge=1, le=MAX_QUEUE_NUMS)
    writeQueueNums: int = Field(8, ge=1, le=MAX_QUEUE_NUMS)
    # validate_default: the validator turns the default "RW" into its bit mask like any given value
    perm: str | int = Field("RW", validate_default=True)
    messageType: MessageType = MessageType.NORMAL

    @field_validator("perm")
    @classmethod
    def _perm(cls, v: str | int) -> int:
        if isinstance(v, int):
            if v not in (0, 2, 4, 6, 7, 3, 5, 1):
                raise ValueError("perm is RW, R, W or DENY (or RocketMQ's 6, 4, 2, 0)")
            return v & (PERM_READ | PERM_WRITE)
        key = v.strip().upper()
        if key not in _PERM_NAMES:
            raise ValueError("perm is RW, R, W or DENY")
        return _PERM_NAMES[key]


class TopicConfig(BaseModel):
    topicName: str
    readQueueNums: int
    writeQueueNums: int
    perm: int = 6
    messageType: MessageType = MessageType.NORMAL
    system: bool = False

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_api(self) -> dict[str, object]:
        return {
            "topicName": self.topicName,
            "readQueueNums": self.readQueueNums,
            "writeQueueNums": self.writeQueueNums,
            "perm": perm_name(self.perm),
            "messageType": self.messageType.value,
        }


class TopicManager:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.topics: dict[str, TopicConfig] = {}
        self.version = 0  # bumps on every change, so registrations can tell what is new
        self._rr: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        raw = read_json(self.path, {}) or {}
        for name, cfg in raw.get("topics", {}).items():
            try:
                self.topics[name] = TopicConfig.model_validate(cfg)
            except ValidationError as exc:
                raise RuntimeError(f"{self.path}: topic {name!r} is invalid: {exc}") from exc
        self.version = raw.get("version", 0)

    def _persist(self) -> None:
        self.version += 1
        write_json_atomic(self.path, {"version": self.version,
                                      "topics": {n: c.model_dump(mode="json") for n, c in self.topics.items()}})

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def require(self, topic: str) -> TopicConfig:
        cfg = self.topics.get(topic)
        if cfg is None:
            check_topic(topic)
            raise FerryError("TOPIC_NOT_EXIST", f"topic {topic!r} does not exist on this broker")
        return cfg

    def upsert(self, topic: str, spec: TopicConfigIn, *, system: bool = False) -> tuple[TopicConfig, bool]:
        """Create or update; returns (config, changed). Persists before returning."""
        check_topic(topic)
        new = TopicConfig(topicName=topic, readQueueNums=spec.readQueueNums,
                          writeQueueNums=spec.writeQueueNums, perm=int(spec.perm),
                          messageType=spec.messageType, system=system)
        with self._lock:
            old = self.topics.get(topic)
            if old == new:
                return old, False
            self.topics[topic] = new
            try:
                self._persist()
            except OSError:
                if old is None:
                    self.topics.pop(topic, None)
                else:
                    self.topics[topic] = old
                raise
        return new, True

    def delete(self, topic: str) -> bool:
        with self._lock:
            if self.topics.pop(topic, None) is None:
                return False
            self._rr.pop(topic, None)
            self._persist()
        return True

    def next_queue(self, cfg: TopicConfig) -> int:
        """Round-robin among the writable queues (queueId -1)."""
        counter = self._rr.get(cfg.topicName)
        if counter is None:
            counter = self._rr[cfg.topicName] = itertools.count()
        return next(counter) % cfg.writeQueueNums
