"""Error codes shared by every API surface.

Codes follow RocketMQ's names (ResponseCode / PutMessageStatus) where one exists, so operators who
know RocketMQ recognise them. Each code maps to one HTTP status; the TCP protocol carries the code
itself.
"""

from __future__ import annotations

from typing import Any

# code -> HTTP status
HTTP_STATUS: dict[str, int] = {
    "MESSAGE_ILLEGAL": 400,
    "PROPERTIES_SIZE_EXCEEDED": 400,
    "INVALID_REQUEST": 400,
    "OFFSET_ILLEGAL": 400,
    "TOPIC_ILLEGAL": 400,
    "NO_PERMISSION": 403,
    "TOPIC_NOT_EXIST": 404,
    "NOT_FOUND": 404,
    "SUBSCRIPTION_GROUP_NOT_EXIST": 404,
    "METHOD_NOT_ALLOWED": 405,
    "CONFLICT": 409,
    "PAYLOAD_TOO_LARGE": 413,
    "SYSTEM_BUSY": 429,
    "SYSTEM_ERROR": 500,
    "SERVICE_NOT_AVAILABLE": 503,
    "SLAVE_NOT_AVAILABLE": 503,
    "IN_SYNC_REPLICAS_NOT_ENOUGH": 503,
    "NOT_IMPLEMENTED": 501,
    "FLUSH_DISK_TIMEOUT": 504,
    "FLUSH_SLAVE_TIMEOUT": 504,
}


class FerryError(Exception):
    """An error with a machine-readable code, a human message and optional details.

    Raised anywhere in the broker; protocol layers turn it into the contract's error body.
    """

    def __init__(self, code: str, message: str, **details: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def to_body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        err.update(self.details)
        return {"error": err}


def illegal(message: str, **details: Any) -> FerryError:
    return FerryError("MESSAGE_ILLEGAL", message, **details)


def bad_request(message: str, **details: Any) -> FerryError:
    return FerryError("INVALID_REQUEST", message, **details)
