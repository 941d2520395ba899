"""The controller's error codes.

They live here rather than in ``common.errors`` because only the controller raises them; the class carries
its own HTTP status, so the shared error middleware turns them into the contract's error body unchanged.
"""

from __future__ import annotations

from typing import Any

from ferrymq.common.errors import FerryError

CONTROLLER_HTTP_STATUS: dict[str, int] = {
    "INVALID_REQUEST": 400,
    "BROKER_NOT_REGISTERED": 404,
    "GROUP_NOT_FOUND": 404,
    "BROKER_ID_CONFLICT": 409,
    "FENCED_MASTER_EPOCH": 409,
    "FENCED_SYNC_STATE_SET_EPOCH": 409,
    "NOT_IN_SYNC_STATE_SET": 409,
    "SWITCH_IN_PROGRESS": 409,
    "SWITCH_ABANDONED": 409,
    "NOT_LEADER": 503,
    "STORE_UNAVAILABLE": 503,
}


class ControllerError(FerryError):
    @property
    def http_status(self) -> int:
        return CONTROLLER_HTTP_STATUS.get(self.code, super().http_status)


def invalid(message: str, **details: Any) -> ControllerError:
    return ControllerError("INVALID_REQUEST", message, **details)
