"""Errors the client raises. Every one is a FerryError: ``code`` is machine-readable (the broker's own
code when the broker answered, e.g. TOPIC_NOT_EXIST or SYSTEM_BUSY), ``message`` is for people."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferrymq.common.errors import FerryError


class ClientError(FerryError):
    """Base of everything the client raises."""


class BrokerError(ClientError):
    """The broker (or the controller's route API) answered with an error; code and message are theirs."""

    def __init__(self, code: str, message: str, *, broker: str | None = None, **details: Any) -> None:
        super().__init__(code, message, **details)
        self.broker = broker

    @property
    def retriable(self) -> bool:
        """Worth retrying on another broker group (RocketMQ's retryResponseCodes)."""
        return self.code in RETRIABLE_CODES


# Codes after which a send may go to another broker group; others (bad message, no permission on the
# topic everywhere) would fail the same way again.
RETRIABLE_CODES = frozenset({"SYSTEM_BUSY", "SYSTEM_ERROR", "SERVICE_NOT_AVAILABLE", "TOPIC_NOT_EXIST",
                             "NO_PERMISSION", "SLAVE_NOT_AVAILABLE", "IN_SYNC_REPLICAS_NOT_ENOUGH",
                             "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT"})


class RemotingError(ClientError):
    """Talking to a broker failed below the protocol: connect, send or receive."""

    def __init__(self, message: str, *, address: str | None = None, code: str = "REMOTING_ERROR") -> None:
        super().__init__(code, message)
        self.address = address


class RemotingConnectError(RemotingError):
    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message, address=address, code="CONNECT_FAILED")


class RemotingTimeoutError(RemotingError):
    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message, address=address, code="TIMEOUT")


class ClientStateError(ClientError):
    """The object is not started, already shut down, or misused."""

    def __init__(self, message: str) -> None:
        super().__init__("CLIENT_STATE", message)


def client_checked(check: Callable[[str], None], value: str) -> None:
    """Run one of common.limits' validators; its error becomes a ClientError with the same code."""
    try:
        check(value)
    except ClientError:
        raise
    except FerryError as exc:
        raise ClientError(exc.code, exc.message) from None
