"""HTTP routes for transactional messages, consumer send-back and dead-letter queues (issue #4).

Delay levels and delivery times need no route of their own: they are fields of the message object of
``POST /v1/topics/{topic}/messages``. docs/message-types.md describes every route here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from ferrymq.broker.services.transaction import COMMIT, PROPERTY_CHECK_URL, PROPERTY_TRANSACTION_ID, ROLLBACK
from ferrymq.common.api_models import parse_messages, stored_to_api
from ferrymq.common.errors import FerryError
from ferrymq.common.http import int_param, json_ok, read_json, read_model
from ferrymq.common.limits import check_group, check_user_topic
from ferrymq.common.message import PROPERTY_PRODUCER_GROUP, PROPERTY_TRANSACTION_PREPARED, parse_offset_msg_id

if TYPE_CHECKING:
    from ferrymq.broker.server import Broker

TRANSACTION_FIELDS = ("producerGroup", "checkUrl", "transactionId")


class EndTransactionIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    producerGroup: str = Field(min_length=1, max_length=255)


class SendBackIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    msgId: str = Field(min_length=1, max_length=64)
    delayLevel: int | None = Field(None, ge=-1, le=255)
    maxReconsumeTimes: int | None = Field(None, ge=0, le=10_000)


class ResendIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    msgId: str = Field(min_length=1, max_length=64)


def routes(broker: Broker) -> list[web.RouteDef]:
    types = broker.message_types

    async def prepare(request: web.Request) -> web.Response:
        """A half message: the message object plus producerGroup and, optionally, checkUrl (where the
        broker asks for the state of a transaction left open) and transactionId."""
        topic = request.match_info["topic"]
        check_user_topic(topic)
        payload = await read_json(request)
        if not isinstance(payload, dict) or "messages" in payload:
            raise FerryError("INVALID_REQUEST", "the body is one message object with producerGroup (and checkUrl)")
        extra: dict[str, Any] = {k: payload.pop(k) for k in TRANSACTION_FIELDS if k in payload}
        group = extra.get("producerGroup")
        if not isinstance(group, str):
            raise FerryError("INVALID_REQUEST", "producerGroup (a string) is required")
        check_group(group)
        msg = parse_messages(topic, payload)[0]
        msg.properties[PROPERTY_PRODUCER_GROUP] = group
        msg.properties[PROPERTY_TRANSACTION_PREPARED] = "true"
        for field, prop in (("checkUrl", PROPERTY_CHECK_URL), ("transactionId", PROPERTY_TRANSACTION_ID)):
            value = extra.get(field)
            if value is not None:
                if not isinstance(value, str) or not value or len(value) > 2048:
                    raise FerryError("INVALID_REQUEST", f"{field} must be a non-empty string")
                msg.properties[prop] = value
        result = (await broker.messaging.send(topic, [msg]))[0]
        return json_ok({**result.to_api(), "transactionId": msg.properties[PROPERTY_TRANSACTION_ID],
                        "commitLogOffset": result.physical_offset})

    def _end(state: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            body = await read_model(request, EndTransactionIn)
            check_group(body.producerGroup)
            txid = request.match_info["transactionId"]
            return json_ok(await types.transactions.end_by_id(txid, body.producerGroup, state))

        return handler

    async def send_back(request: web.Request) -> web.Response:
        group = request.match_info["group"]
        check_group(group)
        body = await read_model(request, SendBackIn)
        phys = parse_offset_msg_id(body.msgId)
        return json_ok(await types.retry.send_back(group, phys, delay_level=body.delayLevel,
                                                   max_reconsume_times=body.maxReconsumeTimes))

    async def dlq_list(request: web.Request) -> web.Response:
        group = request.match_info["group"]
        msgs, next_offset, max_offset = await types.retry.list_dead(
            group, int_param(request, "offset", 0), int_param(request, "maxMessages", 32))
        return json_ok({"messages": [stored_to_api(m) for m in msgs], "nextOffset": next_offset,
                        "maxOffset": max_offset})

    async def dlq_resend(request: web.Request) -> web.Response:
        group = request.match_info["group"]
        body = await read_model(request, ResendIn)
        return json_ok(await types.retry.resend_dead(group, body.msgId))

    async def stats(request: web.Request) -> web.Response:
        return json_ok(types.stats())

    async def progress(request: web.Request) -> web.Response:
        # For slaves copying the master's delay offsets, timer checkpoint and transaction scan offset.
        return json_ok(types.progress_snapshot())

    return [
        web.post("/v1/topics/{topic}/transactions", prepare),
        web.post(r"/v1/transactions/{transactionId}/commit", _end(COMMIT)),
        web.post(r"/v1/transactions/{transactionId}/rollback", _end(ROLLBACK)),
        web.post("/v1/groups/{group}/send-back", send_back),
        web.get("/v1/groups/{group}/dlq/messages", dlq_list),
        web.post("/v1/groups/{group}/dlq/resend", dlq_resend),
        web.get("/v1/message-types/stats", stats),
        web.get("/v1/internal/message-type-progress", progress),
    ]
