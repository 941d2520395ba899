"""The small HTTP helper both admin clients share: JSON in and out, timeouts, contract errors."""

from __future__ import annotations

from typing import Any

import aiohttp

DEFAULT_TIMEOUT = aiohttp.ClientTimeout(total=10, connect=3)


class ApiError(Exception):
    """A non-2xx answer, or no answer at all (status 0), carrying the contract's error code."""

    def __init__(self, status: int, code: str, message: str, url: str = "") -> None:
        super().__init__(f"{code}: {message}" + (f" ({url})" if url else ""))
        self.status = status
        self.code = code
        self.message = message
        self.url = url

    @property
    def retriable(self) -> bool:
        # 4xx means the request itself is wrong (retrying will not help), except conflicts and throttling.
        return self.status == 0 or self.status >= 500 or self.status in (404, 409, 429)


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    *,
    body: Any = None,
    client_timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT,
) -> Any:
    """One request; JSON answer or None for 204; ApiError for everything that is not a 2xx."""
    try:
        async with session.request(method, url, json=body, timeout=client_timeout) as resp:
            text = await resp.text()
            data: Any = None
            if text:
                try:
                    data = await resp.json(content_type=None)
                except ValueError:
                    data = None
            if resp.status >= 400:
                err = (data or {}).get("error") if isinstance(data, dict) else None
                code = str(err.get("code", "HTTP_ERROR")) if isinstance(err, dict) else "HTTP_ERROR"
                message = str(err.get("message", "")) if isinstance(err, dict) else text[:200]
                raise ApiError(resp.status, code, message or resp.reason or "", url)
            return data
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ApiError(0, "UNREACHABLE", f"{type(exc).__name__}: {exc}", url) from exc
