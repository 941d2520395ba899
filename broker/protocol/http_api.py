"""The broker's HTTP API (the contract's table), a thin layer over the services."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ferrymq.broker.services.topics import TopicConfigIn
from ferrymq.common import record
from ferrymq.common.api_models import parse_messages, stored_json, stored_to_api
from ferrymq.common.errors import FerryError
from ferrymq.common.http import int_param, json_ok, read_json, read_model
from ferrymq.common.limits import check_group, check_topic, check_user_topic
from ferrymq.common.message import parse_offset_msg_id, split_tag_filter

if TYPE_CHECKING:
    from ferrymq.broker.server import Broker


def routes(broker: Broker) -> list[web.RouteDef]:
    svc = broker.messaging

    async def health(request: web.Request) -> web.Response:
        return json_ok(broker.health())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=broker.metrics.render(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})

    async def list_topics(request: web.Request) -> web.Response:
        return json_ok({"topics": [c.to_api() for n, c in sorted(broker.topics.topics.items()) if not c.system]})

    async def put_topic(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_user_topic(topic)
        spec = await read_model(request, TopicConfigIn)
        broker.check_admin_writable()
        cfg, changed = broker.topics.upsert(topic, spec)
        if changed:
            broker.on_topics_changed()
        return json_ok(broker.describe_topic(cfg))

    async def get_topic(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        return json_ok(broker.describe_topic(broker.topics.require(topic)))

    async def delete_topic(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_user_topic(topic)
        broker.check_admin_writable()
        broker.topics.require(topic)
        broker.delete_topic(topic)
        return web.Response(status=204)

    async def send(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_user_topic(topic)
        msgs = parse_messages(topic, await read_json(request))
        results = await svc.send(topic, msgs)
        return web.Response(text='{"results":[' + ",".join([r.to_json() for r in results]) + "]}",
                            content_type="application/json")

    async def pull(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        check_topic(topic)
        qid = int_param(request, "queueId", source="path")
        offset = int_param(request, "offset", 0)
        max_messages = int_param(request, "maxMessages", 32)
        wait_ms = int_param(request, "waitMs", 0)
        tags = split_tag_filter(request.query.get("tags"))
        res = await svc.pull(topic, qid, offset, max_messages, tags, wait_ms)
        # Formatted directly (stored_json): for a full batch, dumping dicts was most of a pull's cost.
        messages = ",".join([stored_json(record.decode(r, verify=False)) for r in res.records])
        return web.Response(text=f'{{"status":"{res.status}","messages":[{messages}],"nextOffset":{res.next_offset},'
                                 f'"minOffset":{res.min_offset},"maxOffset":{res.max_offset}}}',
                            content_type="application/json")

    async def offset_by_time(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        qid = int_param(request, "queueId", source="path")
        broker.messaging.readable_topic(topic, qid)
        ts = int_param(request, "timestamp")
        return json_ok({"topic": topic, "queueId": qid,
                        "offset": broker.store.lookup_offset_by_time(topic, qid, ts)})

    async def topic_groups(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        broker.topics.require(topic)
        groups = broker.offsets.groups_of_topic(topic)
        return json_ok({"groups": {g: {str(q): o for q, o in qs.items()} for g, qs in groups.items()}})

    def _offset_target(request: web.Request) -> tuple[str, str, int]:
        group, topic = request.match_info["group"], request.match_info["topic"]
        check_group(group)
        check_topic(topic)
        return group, topic, int_param(request, "queueId", source="path")

    async def get_offset(request: web.Request) -> web.Response:
        group, topic, qid = _offset_target(request)
        broker.topics.require(topic)
        return json_ok({"group": group, "topic": topic, "queueId": qid,
                        "offset": broker.offsets.query(group, topic, qid)})

    async def put_offset(request: web.Request) -> web.Response:
        group, topic, qid = _offset_target(request)
        payload = await read_json(request)
        if not isinstance(payload, dict) or not isinstance(payload.get("offset"), int) \
                or isinstance(payload.get("offset"), bool):
            raise FerryError("INVALID_REQUEST", 'the body is {"offset": <integer>}')
        svc.commit_offset(group, topic, qid, payload["offset"])
        return json_ok({"group": group, "topic": topic, "queueId": qid, "offset": payload["offset"]})

    async def get_message(request: web.Request) -> web.Response:
        phys = parse_offset_msg_id(request.match_info["msgId"])
        raw = broker.store.read_message(phys)
        if raw is None:
            raise FerryError("NOT_FOUND", f"no message {request.match_info['msgId']} on this broker")
        return json_ok(stored_to_api(record.decode(raw, verify=False)))

    async def all_offsets(request: web.Request) -> web.Response:
        # For slaves copying the master's state (RocketMQ's SlaveSynchronize).
        return json_ok({"offsets": broker.offsets.snapshot()})

    return [
        web.get("/v1/health", health),
        web.get("/v1/internal/offsets", all_offsets),
        web.get("/metrics", metrics),
        web.get("/v1/topics", list_topics),
        web.put("/v1/topics/{topic}", put_topic),
        web.get("/v1/topics/{topic}", get_topic),
        web.delete("/v1/topics/{topic}", delete_topic),
        web.post("/v1/topics/{topic}/messages", send),
        web.get("/v1/topics/{topic}/queues/{queueId}/messages", pull),
        web.get("/v1/topics/{topic}/queues/{queueId}/offset-by-time", offset_by_time),
        web.get("/v1/topics/{topic}/groups", topic_groups),
        web.get("/v1/groups/{group}/offsets/{topic}/{queueId}", get_offset),
        web.put("/v1/groups/{group}/offsets/{topic}/{queueId}", put_offset),
        web.get("/v1/messages/{msgId}", get_message),
    ]
