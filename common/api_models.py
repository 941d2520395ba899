"""Payloads of the HTTP API (pydantic) and their conversion to and from the message model."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
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
        return build_message(topic, self.body, self.bodyBase64, self.tags, self.keys, self.properties, self.queueId,
                             self.delayLevel, self.deliverAtMs)


def build_message(topic: str, body: str | None, body_base64: str | None, tags: str | None,
                  keys: list[str] | str | None, properties: dict[str, str] | None, queue_id: int | None,
                  delay_level: int | None, deliver_at_ms: int | None) -> Message:
    """A validated message object's fields → the store's Message (properties in RocketMQ's names)."""
    if body is not None:
        data = body.encode()
    else:
        try:
            data = base64.b64decode(body_base64 or "", validate=True)
        except (binascii.Error, ValueError) as exc:
            raise FerryError("MESSAGE_ILLEGAL", f"bodyBase64 is not valid base64: {exc}") from exc
    props: dict[str, str] = {}
    if properties:
        for k in properties:
            if k in SYSTEM_PROPERTIES:
                raise FerryError("MESSAGE_ILLEGAL", f"property {k!r} is reserved; use the {k.lower()} field")
            if not k:
                raise FerryError("MESSAGE_ILLEGAL", "property names must not be empty")
        props.update(properties)
    if tags:
        props[PROPERTY_TAGS] = tags
    key_list = [keys] if isinstance(keys, str) else keys
    if key_list:
        for k in key_list:
            if not k or KEY_SEPARATOR in k:
                raise FerryError("MESSAGE_ILLEGAL", f"key {k!r} must be non-empty and contain no spaces")
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(key_list)
    if delay_level:
        props[PROPERTY_DELAY_LEVEL] = str(delay_level)
    if deliver_at_ms is not None:
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver_at_ms)
    return Message(topic=topic, body=data, queue_id=-1 if queue_id is None else queue_id, properties=props)


def _is_str_dict(v: object) -> bool:
    return type(v) is dict and all(type(k) is str and type(x) is str for k, x in v.items())


# MessageIn's fields and constraints for values of exactly the declared type (None is always allowed).
# tests/test_api_models.py checks that these accept nothing MessageIn would refuse or change.
_PLAIN_CHECKS: dict[str, Callable[[Any], bool]] = {
    "body": lambda v: type(v) is str,
    "bodyBase64": lambda v: type(v) is str,
    "tags": lambda v: type(v) is str and len(v) <= 255,
    "keys": lambda v: type(v) is str or (type(v) is list and all(type(k) is str for k in v)),
    "properties": _is_str_dict,
    "queueId": lambda v: type(v) is int and v >= -1,
    "delayLevel": lambda v: type(v) is int and 0 <= v <= 255,
    "deliverAtMs": lambda v: type(v) is int and v >= 0,
}


def _plain_message(topic: str, item: object) -> Message | None:
    """The common case without pydantic (about twice as fast per message): every field present has
    exactly the type MessageIn declares and passes its checks, so pydantic would accept it unchanged.
    Anything else returns None and goes through MessageIn, which also words the error."""
    if type(item) is not dict:
        return None
    for k, v in item.items():
        check = _PLAIN_CHECKS.get(k)
        if check is None or (v is not None and not check(v)):
            return None
    get = item.get
    body, body_base64, delay_level, deliver_at_ms = get("body"), get("bodyBase64"), get("delayLevel"), \
        get("deliverAtMs")
    if (body is None) == (body_base64 is None) or (delay_level and deliver_at_ms is not None):
        return None
    return build_message(topic, body, body_base64, get("tags"), get("keys"), get("properties"), get("queueId"),
                         delay_level, deliver_at_ms)


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
            out.append(_plain_message(topic, item) or _validated_message(topic, item))
        except FerryError as exc:
            exc.details.setdefault("index", i)
            exc.message = f"message {i}: {exc.message}"
            raise
    return out


def _validated_message(topic: str, item: object) -> Message:
    try:
        return MessageIn.model_validate(item).to_message(topic)
    except ValidationError as exc:
        raise FerryError("MESSAGE_ILLEGAL", _first_error(exc)) from exc


def _first_error(exc: ValidationError) -> str:
    errs = exc.errors()
    if not errs:
        return str(exc)
    e = errs[0]
    where = ".".join(str(p) for p in e.get("loc", ())) or "body"
    return f"{where}: {e.get('msg', 'invalid')}"


def validation_message(exc: ValidationError) -> str:
    return _first_error(exc)


_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def stored_json(m: StoredMessage) -> str:
    """``stored_to_api(m)`` as JSON text, formatted directly: a pull answers with many of these, and
    building then dumping the dicts cost more than reading the records. Every string that may need
    escaping goes through the json module; the rest are hex ids, base64 and integers."""
    props = m.properties
    user_props = {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}
    keys = props.get(PROPERTY_KEYS)
    try:
        text = ',"body":' + _compact_json(m.body.decode("utf-8"))
    except UnicodeDecodeError:
        text = ""
    return (f'{{"msgId":"{m.msg_id}","topic":{_compact_json(m.topic)},"queueId":{m.queue_id},'
            f'"queueOffset":{m.queue_offset},"bodyBase64":"{base64.b64encode(m.body).decode()}",'
            f'"tags":{_compact_json(props.get(PROPERTY_TAGS))},'
            f'"keys":{_compact_json(keys.split(KEY_SEPARATOR) if keys else [])},'
            f'"properties":{_compact_json(user_props)},"bornTimestamp":{m.born_timestamp},'
            f'"storeTimestamp":{m.store_timestamp},"reconsumeTimes":{m.reconsume_times},'
            f'"commitLogOffset":{m.physical_offset}{text}}}')


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
