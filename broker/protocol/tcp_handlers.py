"""Request handlers of the TCP protocol: every HTTP API operation, plus batch send, heartbeats,
consumer-group membership and queue locks. Thin: they parse header fields and call the services that
the HTTP API calls too. docs/protocol.md is the reference for each code's fields.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgpack
from pydantic import ValidationError

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import Command
from ferrymq.broker.protocol.tcp_server import Handler, Reply, TcpConnection, unpack_body
from ferrymq.broker.services.consumer_groups import ConsumerGroupService, HeartbeatData, MessageModel
from ferrymq.broker.services.message_types import ROUTED_PROPERTIES
from ferrymq.broker.services.topics import TopicConfigIn
from ferrymq.common.api_models import validation_message
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import check_group, check_topic, check_user_topic
from ferrymq.common.message import PROPERTY_TAGS, Message, parse_offset_msg_id, split_tag_filter

if TYPE_CHECKING:
    from ferrymq.broker.server import Broker

_packb = msgpack.Packer(use_bin_type=True).pack
OK: Reply = (None, b"")
MAX_TAGS_LENGTH = 255


def _str(ext: dict[str, Any], name: str, default: str | None = None) -> str:
    v = ext.get(name, default)
    if not isinstance(v, str):
        raise FerryError("INVALID_REQUEST", f"header field {name!r} (a string) is required")
    return v


def _int(ext: dict[str, Any], name: str, default: int | None = None) -> int:
    v = ext.get(name, default)
    if not isinstance(v, int) or isinstance(v, bool):
        raise FerryError("INVALID_REQUEST", f"header field {name!r} (an integer) is required")
    return v


def _props(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise FerryError("MESSAGE_ILLEGAL", "message properties must be a map of strings to strings")
    tags = raw.get(PROPERTY_TAGS)
    if tags is not None and len(tags) > MAX_TAGS_LENGTH:
        raise FerryError("MESSAGE_ILLEGAL", f"tags are {len(tags)} characters; the limit is {MAX_TAGS_LENGTH}")
    return raw


def _mq_list(raw: Any) -> list[tuple[str, int]]:
    if not isinstance(raw, list):
        raise FerryError("INVALID_REQUEST", "the body must be a list of [topic, queueId] pairs")
    out = []
    for item in raw:
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str)
                or not isinstance(item[1], int) or isinstance(item[1], bool)):
            raise FerryError("INVALID_REQUEST", "the body must be a list of [topic, queueId] pairs")
        out.append((item[0], item[1]))
    return out


def build_handlers(broker: Broker, groups: ConsumerGroupService) -> dict[int, Handler]:
    svc = broker.messaging
    store = broker.store

    # ---- send ---------------------------------------------------------------------------------------------
    # Messages without a delay, timer or transaction property (nearly all) go from the frame to the commit
    # log as bodies, with no Message or SendResult per message; the rest go through the send router.
    async def send(conn: TcpConnection, cmd: Command) -> Reply:
        ext = cmd.ext
        topic = _str(ext, "topic")
        check_user_topic(topic)
        props = _props(ext.get("props"))
        qid, flag, born = _int(ext, "queueId", -1), _int(ext, "flag", 0), _int(ext, "bornTs", 0)
        if props and not ROUTED_PROPERTIES.isdisjoint(props):
            msg = Message(topic=topic, body=cmd.body, queue_id=qid, properties=props, flag=flag, born_timestamp=born)
            r = (await svc.send(topic, [msg]))[0]
            return {"msgId": r.msg_id, "queueId": r.queue_id, "queueOffset": r.queue_offset, "status": r.status}, b""
        b = await svc.send_plain(topic, qid, [cmd.body], [props] if props else None, born_timestamp=born, flag=flag)
        return {"msgId": f"{svc.host_id()}{b.offsets[0]:016X}", "queueId": b.queue_id,
                "queueOffset": b.queue_offset, "status": "SEND_OK"}, b""

    async def send_batch(conn: TcpConnection, cmd: Command) -> Reply:
        ext = cmd.ext
        topic = _str(ext, "topic")
        check_user_topic(topic)
        qid = _int(ext, "queueId", -1)
        born = _int(ext, "bornTs", 0)
        items = unpack_body(cmd.body)
        if not isinstance(items, list) or not items:
            raise FerryError("INVALID_REQUEST", "a batch body is a non-empty msgpack list of [body, properties]")
        bodies: list[bytes] = []
        props: list[dict[str, str] | None] | None = None
        routed = False
        for i, item in enumerate(items):
            if type(item) is not list or not 1 <= len(item) <= 2 or type(item[0]) is not bytes:
                raise FerryError("MESSAGE_ILLEGAL", f"message {i}: expected [body (bytes), properties (map)]",
                                 index=i)
            bodies.append(item[0])
            p = _props(item[1]) if len(item) > 1 else None
            if p:
                if props is None:
                    props = [None] * i
                routed = routed or not ROUTED_PROPERTIES.isdisjoint(p)
                props.append(p)
            elif props is not None:
                props.append(None)
        if routed:
            assert props is not None
            msgs = [Message(topic=topic, body=body, queue_id=qid, properties=p or {}, born_timestamp=born)
                    for body, p in zip(bodies, props, strict=True)]
            results = await svc.send(topic, msgs)
            return {"status": "SEND_OK", "queueId": results[0].queue_id}, _packb(
                [[r.msg_id, r.queue_offset] for r in results])
        b = await svc.send_plain(topic, qid, bodies, props, born_timestamp=born)
        host = svc.host_id()
        return {"status": "SEND_OK", "queueId": b.queue_id}, _packb(
            [[f"{host}{phys:016X}", qoff] for qoff, phys in enumerate(b.offsets, b.queue_offset)])

    # ---- pull ---------------------------------------------------------------------------------------------
    async def pull(conn: TcpConnection, cmd: Command) -> Reply:
        ext = cmd.ext
        topic = _str(ext, "topic")
        check_topic(topic)
        qid = _int(ext, "queueId")
        group = ext.get("group")
        commit = ext.get("commitOffset")
        if isinstance(group, str) and isinstance(commit, int) and not isinstance(commit, bool) and commit >= 0:
            # RocketMQ's FLAG_COMMIT_OFFSET: the consumer piggybacks its progress on the next pull.
            try:
                check_group(group)
                svc.commit_offset(group, topic, qid, commit)
            except FerryError:
                pass  # a stale commit must not fail the pull; the periodic commit retries
        expression = ext.get("tags")
        if expression is not None and not isinstance(expression, str):
            raise FerryError("INVALID_REQUEST", "header field 'tags' must be a string")
        res = await svc.pull(topic, qid, _int(ext, "offset"), _int(ext, "maxMsgs", 32),
                             split_tag_filter(expression), _int(ext, "waitMs", 0))
        return ({"status": res.status, "nextOffset": res.next_offset, "minOffset": res.min_offset,
                 "maxOffset": res.max_offset}, b"".join(res.records))

    # ---- offsets ------------------------------------------------------------------------------------------
    def _group_mq(ext: dict[str, Any]) -> tuple[str, str, int]:
        group, topic = _str(ext, "group"), _str(ext, "topic")
        check_group(group)
        check_topic(topic)
        return group, topic, _int(ext, "queueId")

    async def query_offset(conn: TcpConnection, cmd: Command) -> Reply:
        group, topic, qid = _group_mq(cmd.ext)
        broker.topics.require(topic)
        return {"offset": broker.offsets.query(group, topic, qid)}, b""

    async def update_offset(conn: TcpConnection, cmd: Command) -> Reply:
        group, topic, qid = _group_mq(cmd.ext)
        svc.commit_offset(group, topic, qid, _int(cmd.ext, "offset"))
        return OK

    def _topic_queue(ext: dict[str, Any]) -> tuple[str, int]:
        topic = _str(ext, "topic")
        check_topic(topic)
        qid = _int(ext, "queueId")
        svc.readable_topic(topic, qid)
        return topic, qid

    async def max_offset(conn: TcpConnection, cmd: Command) -> Reply:
        topic, qid = _topic_queue(cmd.ext)
        return {"offset": store.max_offset(topic, qid)}, b""

    async def min_offset(conn: TcpConnection, cmd: Command) -> Reply:
        topic, qid = _topic_queue(cmd.ext)
        return {"offset": store.min_offset(topic, qid)}, b""

    async def search_offset(conn: TcpConnection, cmd: Command) -> Reply:
        topic, qid = _topic_queue(cmd.ext)
        ts = _int(cmd.ext, "timestamp")
        loop = asyncio.get_running_loop()
        off = await loop.run_in_executor(svc.readers, store.lookup_offset_by_time, topic, qid, ts)
        return {"offset": off}, b""

    async def view_message(conn: TcpConnection, cmd: Command) -> Reply:
        msg_id = _str(cmd.ext, "msgId")
        phys = parse_offset_msg_id(msg_id)
        raw = await asyncio.get_running_loop().run_in_executor(svc.readers, store.read_message, phys)
        if raw is None:
            raise FerryError("NOT_FOUND", f"no message {msg_id} on this broker")
        return None, raw

    # ---- topics -------------------------------------------------------------------------------------------
    async def create_topic(conn: TcpConnection, cmd: Command) -> Reply:
        topic = _str(cmd.ext, "topic")
        check_user_topic(topic)
        fields = {k: cmd.ext[k] for k in ("readQueueNums", "writeQueueNums", "perm", "messageType")
                  if k in cmd.ext}
        try:
            spec = TopicConfigIn.model_validate(fields)
        except ValidationError as exc:
            raise FerryError("INVALID_REQUEST", validation_message(exc)) from exc
        broker.check_admin_writable()
        cfg, changed = await asyncio.to_thread(broker.topics.upsert, topic, spec)
        if changed:
            broker.on_topics_changed()
        return None, _packb(broker.describe_topic(cfg))

    async def describe_topic(conn: TcpConnection, cmd: Command) -> Reply:
        topic = _str(cmd.ext, "topic")
        check_topic(topic)
        return None, _packb(broker.describe_topic(broker.topics.require(topic)))

    async def delete_topic(conn: TcpConnection, cmd: Command) -> Reply:
        topic = _str(cmd.ext, "topic")
        check_user_topic(topic)
        broker.check_admin_writable()
        broker.topics.require(topic)
        broker.delete_topic(topic)
        return OK

    async def all_topics(conn: TcpConnection, cmd: Command) -> Reply:
        return None, _packb({"topics": [c.to_api() for _, c in sorted(broker.topics.topics.items())
                                        if not c.system]})

    async def topic_groups(conn: TcpConnection, cmd: Command) -> Reply:
        topic = _str(cmd.ext, "topic")
        check_topic(topic)
        broker.topics.require(topic)
        groups_of = broker.offsets.groups_of_topic(topic)
        return None, _packb({"groups": {g: {str(q): o for q, o in qs.items()} for g, qs in groups_of.items()}})

    async def runtime_info(conn: TcpConnection, cmd: Command) -> Reply:
        return None, _packb(broker.health())

    async def metrics(conn: TcpConnection, cmd: Command) -> Reply:
        return None, broker.metrics.render()

    # ---- clients and groups -------------------------------------------------------------------------------
    async def heartbeat(conn: TcpConnection, cmd: Command) -> Reply:
        try:
            hb = HeartbeatData.model_validate(unpack_body(cmd.body))
        except ValidationError as exc:
            raise FerryError("INVALID_REQUEST", f"heartbeat: {validation_message(exc)}") from exc
        for cd in hb.consumerGroups:
            check_group(cd.group)
        groups.heartbeat(conn, hb)
        if broker.role == "master":
            for cd in hb.consumerGroups:
                if cd.messageModel == MessageModel.CLUSTERING and not cd.group.startswith("%"):
                    await broker.message_types.retry.ensure_retry_topic(cd.group)
        return OK

    async def unregister(conn: TcpConnection, cmd: Command) -> Reply:
        pg, cg = cmd.ext.get("producerGroup"), cmd.ext.get("consumerGroup")
        groups.unregister(_str(cmd.ext, "clientId"), pg if isinstance(pg, str) else None,
                          cg if isinstance(cg, str) else None)
        return OK

    async def consumer_list(conn: TcpConnection, cmd: Command) -> Reply:
        group = _str(cmd.ext, "group")
        check_group(group)
        return None, _packb(groups.consumer_ids(group))

    async def lock_batch(conn: TcpConnection, cmd: Command) -> Reply:
        group, cid = _str(cmd.ext, "group"), _str(cmd.ext, "clientId")
        check_group(group)
        held = groups.lock_batch(group, cid, _mq_list(unpack_body(cmd.body)))
        return None, _packb([list(mq) for mq in held])

    async def unlock_batch(conn: TcpConnection, cmd: Command) -> Reply:
        group, cid = _str(cmd.ext, "group"), _str(cmd.ext, "clientId")
        check_group(group)
        groups.unlock_batch(group, cid, _mq_list(unpack_body(cmd.body)))
        return OK

    return {
        RequestCode.SEND_MESSAGE: send,
        RequestCode.SEND_BATCH_MESSAGE: send_batch,
        RequestCode.PULL_MESSAGE: pull,
        RequestCode.QUERY_CONSUMER_OFFSET: query_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: update_offset,
        RequestCode.GET_MAX_OFFSET: max_offset,
        RequestCode.GET_MIN_OFFSET: min_offset,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
        RequestCode.VIEW_MESSAGE_BY_ID: view_message,
        RequestCode.UPDATE_AND_CREATE_TOPIC: create_topic,
        RequestCode.GET_TOPIC_STATS_INFO: describe_topic,
        RequestCode.DELETE_TOPIC_IN_BROKER: delete_topic,
        RequestCode.GET_ALL_TOPIC_CONFIG: all_topics,
        RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: topic_groups,
        RequestCode.GET_BROKER_RUNTIME_INFO: runtime_info,
        RequestCode.GET_METRICS: metrics,
        RequestCode.HEART_BEAT: heartbeat,
        RequestCode.UNREGISTER_CLIENT: unregister,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
        RequestCode.LOCK_BATCH_MQ: lock_batch,
        RequestCode.UNLOCK_BATCH_MQ: unlock_batch,
    }


# ---- delay / transaction / retry messages (issue #4) ----------------------------------------------------
def message_type_handlers(broker: Broker) -> dict[int, Handler]:
    """END_TRANSACTION and CONSUMER_SEND_MSG_BACK. Delay levels, delivery times and half messages need
    no codes of their own: they are SEND_MESSAGE with DELAY / TIMER_DELIVER_MS / TRAN_MSG properties."""
    from ferrymq.broker.services.transaction import parse_state

    types = broker.message_types

    def _opt_int(ext: dict[str, Any], name: str) -> int | None:
        return None if ext.get(name) is None else _int(ext, name)

    async def end_transaction(conn: TcpConnection, cmd: Command) -> Reply:
        # ext: producerGroup, commitLogOffset, commitOrRollback (COMMIT/ROLLBACK/UNKNOWN or 8/12/0),
        # tranStateTableOffset?, fromTransactionCheck?
        ext = cmd.ext
        group = _str(ext, "producerGroup")
        check_group(group)
        state = parse_state(ext.get("commitOrRollback"))
        out = await types.transactions.end(group, _int(ext, "commitLogOffset"), state,
                                           queue_offset=_opt_int(ext, "tranStateTableOffset"),
                                           from_check=bool(ext.get("fromTransactionCheck", False)))
        return {k: v for k, v in out.items() if isinstance(v, str | int | bool)}, b""

    async def send_back(conn: TcpConnection, cmd: Command) -> Reply:
        # ext: group, offset (commit-log offset), delayLevel?, maxReconsumeTimes?, originMsgId?, originTopic?
        ext = cmd.ext
        origin_id, origin_topic = ext.get("originMsgId"), ext.get("originTopic")
        out = await types.retry.send_back(
            _str(ext, "group"), _int(ext, "offset"), delay_level=_opt_int(ext, "delayLevel"),
            max_reconsume_times=_opt_int(ext, "maxReconsumeTimes"),
            origin_msg_id=origin_id if isinstance(origin_id, str) and origin_id else None,
            origin_topic=origin_topic if isinstance(origin_topic, str) and origin_topic else None)
        return {k: v for k, v in out.items() if v is not None}, b""

    return {
        RequestCode.END_TRANSACTION: end_transaction,
        RequestCode.CONSUMER_SEND_MSG_BACK: send_back,
    }
