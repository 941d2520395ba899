"""Request and response codes of the TCP protocol.

Numbers follow RocketMQ's RequestCode / ResponseCode where RocketMQ has the operation, so a packet
capture reads the same; codes from 2000 up are FerryMQ's own. docs/protocol.md lists every one with
its header fields and body.
"""

from __future__ import annotations

from enum import IntEnum


class RequestCode(IntEnum):
    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36  # issue #4
    END_TRANSACTION = 37  # issue #4
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39  # broker -> producer, oneway (issue #4)
    NOTIFY_CONSUMER_IDS_CHANGED = 40  # broker -> client, oneway
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_TOPIC_STATS_INFO = 202
    DELETE_TOPIC_IN_BROKER = 215
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    SEND_BATCH_MESSAGE = 320
    GET_METRICS = 2001


# FerryError code name <-> numeric response code. RocketMQ's numbers where it has the code.
SUCCESS = 0
RESPONSE_CODES: dict[str, int] = {
    "SYSTEM_ERROR": 1,
    "SYSTEM_BUSY": 2,
    "REQUEST_CODE_NOT_SUPPORTED": 3,
    "FLUSH_DISK_TIMEOUT": 10,
    "SLAVE_NOT_AVAILABLE": 11,
    "FLUSH_SLAVE_TIMEOUT": 12,
    "MESSAGE_ILLEGAL": 13,
    "SERVICE_NOT_AVAILABLE": 14,
    "NO_PERMISSION": 16,
    "TOPIC_NOT_EXIST": 17,
    "NOT_FOUND": 22,
    "SUBSCRIPTION_GROUP_NOT_EXIST": 26,
    "IN_SYNC_REPLICAS_NOT_ENOUGH": 30,
    "NOT_IMPLEMENTED": 3,
    "INVALID_REQUEST": 2001,
    "OFFSET_ILLEGAL": 2002,
    "TOPIC_ILLEGAL": 2003,
    "PROPERTIES_SIZE_EXCEEDED": 2004,
    "PAYLOAD_TOO_LARGE": 2005,
    "CONFLICT": 2006,
    "METHOD_NOT_ALLOWED": 2007,
}
CODE_NAMES: dict[int, str] = {}
for _name, _num in RESPONSE_CODES.items():
    CODE_NAMES.setdefault(_num, _name)


def response_code(name: str) -> int:
    return RESPONSE_CODES.get(name, RESPONSE_CODES["SYSTEM_ERROR"])
