"""The controller's state store: one small interface, three backends (file, etcd, kubernetes).

Modelled on Patroni's DCS modules: the whole controller state is one JSON document written with a
compare-and-swap on its version, and leadership is a lease the service renews from its own loop by calling
``campaign()``. A backend answers only these questions; every decision is made by the service.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

from ferrymq.controller.errors import ControllerError


class StoreConflict(ControllerError):
    """The stored state changed since it was read (or this controller is no longer allowed to write it)."""

    def __init__(self, message: str) -> None:
        super().__init__("NOT_LEADER", message)


class StoreUnavailable(ControllerError):
    def __init__(self, message: str) -> None:
        super().__init__("STORE_UNAVAILABLE", message)


@dataclass(frozen=True)
class Versioned:
    """A stored document and the version a compare-and-swap must name (None: nothing stored yet)."""

    data: dict[str, Any] | None
    version: Any


class ControllerStore(abc.ABC):
    """Implementations must be safe to call from one asyncio task at a time per method."""

    def __init__(self, identity: str) -> None:
        self.identity = identity  # this controller's advertised URL: what followers redirect to

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Connect; raise StoreUnavailable when the backend cannot be reached at all."""

    @abc.abstractmethod
    async def load(self) -> Versioned:
        """The current document and its version."""

    @abc.abstractmethod
    async def compare_and_swap(self, expected_version: Any, data: dict[str, Any]) -> Any:
        """Write ``data`` if the stored version is still ``expected_version`` and this controller still
        holds leadership; return the new version, or raise StoreConflict."""

    @abc.abstractmethod
    async def campaign(self) -> bool:
        """One leadership round: acquire or renew. True while this controller leads."""

    @abc.abstractmethod
    def is_leader(self) -> bool:
        """Whether leadership is held right now (false once the lease could have run out unrenewed)."""

    @abc.abstractmethod
    def leader_address(self) -> str | None:
        """The leader's advertised URL as last seen, None when unknown."""

    @property
    def leadership_term(self) -> Any:
        """Identifies the current tenure: it changes whenever leadership was lost and taken again, so the
        service notices a lapse it did not see between two rounds (and reloads the state)."""
        return 1 if self.is_leader() else None

    async def resign(self) -> None:  # noqa: B027 - optional hook
        """Give leadership up at once (clean shutdown), so another controller need not wait for the lease."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and locks."""

    @property
    def campaign_interval_s(self) -> float:
        """How often the service should call ``campaign()``."""
        return 1.0
