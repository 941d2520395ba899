"""Payloads of the HTTP API (pydantic) and their conversion to and from the message model."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ferrymq.common.errors import FerryError
from ferrymq.common.message import (
    KEY_SEPARATOR,
    PROPERTY_DELAY_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    SYSTEM_PROPERTIES,
    Message,
    StoredMessage,
)


class MessageIn(BaseModel):
    """One message object of ``POST /v1/topics/{topic}/messages``."""

    model_config = ConfigDict(extra="forbid")

    body: str | None = None
    bodyBase64: str | None = None
    tags: str | None = Field(None, max_length=255)
    keys: list[str] | str | None = None
    properties: dict[str, str] | None = None
    queueId: int | None = Field(None, ge=-1)
    delayLevel: int | None = Field(None, ge=0, le=255)
    deliverAtMs: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_body(self) -> MessageIn:
        if (self.body is None) == (self.bodyBase64 is None):
            raise ValueError("give exactly one of body (UTF-8 text) and bodyBase64 (bytes)")
        if self.delayLevel and self.deliverAtMs is not None:
            raise ValueError("give delayLevel or deliverAtMs, not both")
        return self

    def to_message(self, topic: str) -> Message:
        if self.body is not None:
            body = self.body.encode()
        else:
            try:
                body = base64.b64decode(self.bodyBase64 or "", validate=True)
            except (binascii.Error, ValueError) as exc:
                raise FerryError("MESSAGE_ILLEGAL", f"bodyBase64 is not valid base64: {exc}") from exc
        props: dict[str, str] = {}
        if self.properties:
            for k in self.properties:
                if k in SYSTEM_PROPERTIES:
                    raise FerryError("MESSAGE_ILLEGAL", f"property {k!r} is reserved; use the {k.lower()} field")
                if not k:
                    raise FerryError("MESSAGE_ILLEGAL", "property names must not be empty")
            props.update(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        keys = [self.keys] if isinstance(self.keys, str) else self.keys
        if keys:
            for k in keys:
                if not k or KEY_SEPARATOR in k:
                    raise FerryError("MESSAGE_ILLEGAL", f"key {k!r} must be non-empty and contain no spaces")
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
        if self.delayLevel:
            props[PROPERTY_DELAY_LEVEL] = str(self.delayLevel)
        if self.deliverAtMs is not None:
            props[PROPERTY_TIMER_DELIVER_MS] = str(self.deliverAtMs)
        return Message(topic=topic, body=body, queue_id=-1 if self.queueId is None else self.queueId,
                       properties=props)


def parse_messages(topic: str, payload: Any) -> list[Message]:
    """A single message object or ``{"messages": [...]}`` → messages; clear errors otherwise."""
    if not isinstance(payload, dict):
        raise FerryError("INVALID_REQUEST", "the body must be a JSON object")
    if "messages" in payload:
        items = payload["messages"]
        if set(payload) != {"messages"}:
            raise FerryError("INVALID_REQUEST", "a batch body has only the field 'messages'")
        if not isinstance(items, list) or not items:
            raise FerryError("INVALID_REQUEST", "'messages' must be a non-empty list of message objects")
    else:
        items = [payload]
    out = []
    for i, item in enumerate(items):
        try:
            m = MessageIn.model_validate(item)
        except ValidationError as exc:
            raise FerryError("MESSAGE_ILLEGAL", f"message {i}: {_first_error(exc)}", index=i) from exc
        try:
            out.append(m.to_message(topic))
        except FerryError as exc:
            exc.details.setdefault("index", i)
            exc.message = f"message {i}: {exc.message}"
            raise
    return out


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors()
    if not errs:
        return str(exc)
    e = errs[0]
    where = ".".join(str(p) for p in e.get("loc", ())) or "body"
    return f"{where}: {e.get('msg', 'invalid')}"


def validation_message(exc: ValidationError) -> str:
    return _first_error(exc)


def stored_to_api(m: StoredMessage) -> dict[str, Any]:
    props = {k: v for k, v in m.properties.items() if k not in SYSTEM_PROPERTIES}
    out: dict[str, Any] = {
        "msgId": m.msg_id,
        "topic": m.topic,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "bodyBase64": base64.b64encode(m.body).decode(),
        "tags": m.tags,
        "keys": m.keys,
        "properties": props,
        "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp,
        "reconsumeTimes": m.reconsume_times,
        "commitLogOffset": m.physical_offset,
    }
    try:
        out["body"] = m.body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    return out
