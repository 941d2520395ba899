"""A small synchronous HTTP client for the broker's JSON API.

Spark runs our code in plain Python worker processes (planner and executors) that have no event loop,
so this is ``http.client`` with one keep-alive connection per client, timeouts, and retries with
exponential backoff for the failures that a retry can cure (connection trouble, 429 and 5xx).
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# Codes that mean "not now" rather than "never": a retry (or another broker group) may succeed.
RETRYABLE_CODES = frozenset({
    "SERVICE_NOT_AVAILABLE", "SLAVE_NOT_AVAILABLE", "IN_SYNC_REPLICAS_NOT_ENOUGH", "SYSTEM_BUSY",
    "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT",
})
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})


class BrokerError(Exception):
    """The broker answered with the contract's error body (or an unexpected status)."""

    def __init__(self, code: str, message: str, status: int = 0, details: dict[str, Any] | None = None,
                 url: str = "") -> None:
        super().__init__(f"{code}: {message}" + (f" ({url})" if url else ""))
        self.code = code
        self.message = message
        self.status = status
        self.details = details or {}
        self.url = url

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE_CODES or self.status in RETRYABLE_STATUSES


class BrokerUnavailable(BrokerError):
    """No answer at all after every retry: connection refused, reset, or timed out."""


def base_url(address: str) -> str:
    """``127.0.0.1:8080`` (a route's httpAddress) or ``http://host:port/`` → ``http://host:port``."""
    address = address.strip().rstrip("/")
    if "://" not in address:
        address = f"http://{address}"
    parts = urllib.parse.urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an HTTP address: {address!r}")
    return address


@dataclass(frozen=True)
class RetryPolicy:
    timeout_s: float = 30.0
    retries: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        # Full jitter keeps many executors from hammering a recovering broker in lockstep.
        return random.uniform(0, min(self.max_backoff_s, self.backoff_s * (2 ** attempt)))


class BrokerHttp:
    """One broker (or controller) base URL, one keep-alive connection. Not thread-safe."""

    def __init__(self, address: str, policy: RetryPolicy | None = None) -> None:
        self.url = base_url(address)
        self.policy = policy or RetryPolicy()
        parts = urllib.parse.urlsplit(self.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> BrokerHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=self.policy.timeout_s)
        return self._conn

    def _once(self, method: str, path: str, payload: bytes | None) -> tuple[int, bytes]:
        conn = self._connection()
        headers = {"Connection": "keep-alive", "Accept": "application/json"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.will_close:
            self.close()
        return resp.status, data

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                *, retry: bool = True) -> Any:
        """One JSON call; returns the parsed answer (None for an empty one) or raises BrokerError."""
        full = self._prefix + path
        if query:
            full += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        url = self.url + path
        attempts = self.policy.retries + 1 if retry else 1
        last: BrokerError | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.policy.delay(attempt - 1))
            try:
                status, data = self._once(method, full, payload)
            except (OSError, http.client.HTTPException) as exc:  # TimeoutError is an OSError
                self.close()
                last = BrokerUnavailable("UNREACHABLE", f"{type(exc).__name__}: {exc}", 0, url=url)
                log.debug("%s %s failed (attempt %d): %s", method, url, attempt + 1, exc)
                continue
            if 200 <= status < 300:
                return json.loads(data) if data else None
            err = _error_of(status, data, url)
            if not err.retryable:
                raise err
            last = err
            log.debug("%s %s answered %s (attempt %d)", method, url, err, attempt + 1)
        assert last is not None
        raise last

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)


def _error_of(status: int, data: bytes, url: str) -> BrokerError:
    try:
        err = json.loads(data)["error"]
        details = {k: v for k, v in err.items() if k not in ("code", "message")}
        return BrokerError(str(err["code"]), str(err["message"]), status, details, url)
    except (ValueError, KeyError, TypeError):
        text = data[:200].decode(errors="replace").strip()
        return BrokerError(f"HTTP_{status}", text or http.client.responses.get(status, "error"), status, url=url)
