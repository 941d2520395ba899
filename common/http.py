"""aiohttp plumbing shared by the broker and the controller: the contract's error body everywhere."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from ferrymq.common.errors import FerryError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

_AIOHTTP_CODES = {
    400: "INVALID_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
}


def error_response(err: FerryError) -> web.Response:
    return web.json_response(err.to_body(), status=err.http_status)


@web.middleware
async def error_middleware(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except FerryError as err:
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _AIOHTTP_CODES.get(exc.status, "INVALID_REQUEST" if exc.status < 500 else "SYSTEM_ERROR")
        msg = exc.reason or exc.text or "request failed"
        if exc.status == 404:
            msg = f"no such endpoint: {request.method} {request.path}"
        elif exc.status == 405:
            msg = f"{request.method} is not allowed on {request.path}"
        return web.json_response({"error": {"code": code, "message": msg}}, status=exc.status)
    except Exception as exc:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return web.json_response(
            {"error": {"code": "SYSTEM_ERROR", "message": f"internal error: {type(exc).__name__}"}}, status=500
        )


async def read_json(request: web.Request) -> Any:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise FerryError("PAYLOAD_TOO_LARGE", f"request body exceeds {request.app._client_max_size} bytes") from exc
    if not raw:
        raise FerryError("INVALID_REQUEST", "the request needs a JSON body")
    try:
        payload = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError, bad UTF-8 and integers past Python's digit limit;
        # RecursionError a body nested too deeply to parse.
        raise FerryError("INVALID_REQUEST", f"the body is not valid JSON: {str(exc)[:200]}") from exc
    if b"\\u" in raw:
        # A \uD800-style escape yields a lone surrogate, which no later .encode() accepts: refuse it here.
        try:
            json.dumps(payload, ensure_ascii=False).encode()
        except UnicodeEncodeError as exc:
            raise FerryError("INVALID_REQUEST", "the body contains a lone UTF-16 surrogate escape; "
                                                "strings must be valid Unicode") from exc
    return payload


async def read_model(request: web.Request, model: type[M]) -> M:
    payload = await read_json(request)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(p) for p in e.get("loc", ())) or "body"
        raise FerryError("INVALID_REQUEST", f"{where}: {e.get('msg', 'invalid')}") from exc


def int_param(request: web.Request, name: str, default: int | None = None, *, source: str = "query") -> int:
    raw = request.match_info.get(name) if source == "path" else request.query.get(name)
    if raw is None or raw == "":
        if default is None:
            raise FerryError("INVALID_REQUEST", f"{name} is required")
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise FerryError("INVALID_REQUEST", f"{name} must be an integer, got {raw!r}") from exc


def json_ok(obj: Any, status: int = 200) -> web.Response:
    return web.json_response(obj, status=status, dumps=_dumps)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
