"""Validation of names and sizes, as RocketMQ's Validators and TopicValidator do."""

from __future__ import annotations

import re

from ferrymq.common.errors import FerryError

TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127
GROUP_PATTERN = TOPIC_PATTERN
GROUP_MAX_LENGTH = 255
PROPERTIES_MAX_LENGTH = 32767
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024

# Topics the broker keeps for itself; users may not create, send to or delete them directly.
SYSTEM_TOPICS = frozenset(
    {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC",
        "rmq_sys_wheel_timer",
        "TBW102",
    }
)


def check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not topic:
        raise FerryError("TOPIC_ILLEGAL", "topic name is empty")
    if len(topic) > TOPIC_MAX_LENGTH:
        raise FerryError(
            "TOPIC_ILLEGAL", f"topic name is {len(topic)} characters; the limit is {TOPIC_MAX_LENGTH}"
        )
    if not TOPIC_PATTERN.match(topic):
        raise FerryError(
            "TOPIC_ILLEGAL", f"topic name {topic!r} may only contain letters, digits, '%', '|', '_' and '-'"
        )


def check_user_topic(topic: str) -> None:
    check_topic(topic)
    if topic in SYSTEM_TOPICS:
        raise FerryError("NO_PERMISSION", f"topic {topic!r} is a system topic")


def check_group(group: str) -> None:
    if not isinstance(group, str) or not group:
        raise FerryError("INVALID_REQUEST", "group name is empty")
    if len(group) > GROUP_MAX_LENGTH or not GROUP_PATTERN.match(group):
        raise FerryError(
            "INVALID_REQUEST",
            f"group name {group!r} must be 1-{GROUP_MAX_LENGTH} letters, digits, '%', '|', '_' or '-'",
        )
