"""The contract's HTTP API, against an in-process Standalone listening on a free port."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ferrymq.common.config import BrokerConfig, FlushDiskType
from ferrymq.common.limits import PROPERTIES_MAX_LENGTH
from ferrymq.standalone import Standalone

MAX_MESSAGE = 64 * 1024


class Api:
    def __init__(self, node: Standalone, session: aiohttp.ClientSession) -> None:
        self.node = node
        self.session = session
        self.base = f"http://127.0.0.1:{node.http_port}"

    async def call(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
                   wait_s: float = 30) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        async with self.session.request(method, self.base + path, data=data,
                                        timeout=aiohttp.ClientTimeout(total=wait_s)) as resp:
            text = await resp.read()
            if resp.content_type == "application/json":
                return resp.status, json.loads(text)
            return resp.status, text.decode()

    async def topic(self, name: str, read: int = 4, write: int = 4, perm: str = "RW") -> dict[str, Any]:
        status, body = await self.call("PUT", f"/v1/topics/{name}",
                                       {"readQueueNums": read, "writeQueueNums": write, "perm": perm})
        assert status == 200, body
        return body

    async def send(self, topic: str, payload: Any) -> tuple[int, Any]:
        return await self.call("POST", f"/v1/topics/{topic}/messages", payload)

    async def pull(self, topic: str, queue_id: int, query: str = "") -> tuple[int, Any]:
        return await self.call("GET", f"/v1/topics/{topic}/queues/{queue_id}/messages?{query}")


def assert_error(status: int, body: Any, expected_status: int, code: str) -> None:
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    cfg = BrokerConfig(store_path_root_dir=str(tmp_path / "data"), http_port=0, tcp_port=0,
                       flush_disk_type=FlushDiskType.SYNC_FLUSH, mapped_file_size_commit_log=1024 * 1024,
                       preallocate_commit_log=False, max_message_size=MAX_MESSAGE, sync_flush_timeout=300,
                       long_polling_max_ms=5000)
    node = Standalone(cfg)
    await node.start()
    try:
        async with aiohttp.ClientSession() as session:
            yield Api(node, session)
    finally:
        await node.stop()


# ---- health, metrics, routes ----------------------------------------------------------------------------
async def test_health(api: Api) -> None:
    status, body = await api.call("GET", "/v1/health")
    assert status == 200
    assert {k: body[k] for k in ("status", "group", "role", "brokerId", "epoch")} == {
        "status": "ok", "group": "standalone", "role": "master", "brokerId": 0, "epoch": 1}


async def test_metrics_are_prometheus_text(api: Api) -> None:
    await api.topic("m")
    assert (await api.send("m", {"body": "x", "queueId": 0}))[0] == 200
    status, text = await api.call("GET", "/metrics")
    assert status == 200 and isinstance(text, str)
    assert 'ferrymq_messages_in_total{topic="m"} 1.0' in text
    assert "# TYPE ferrymq_put_latency_seconds histogram" in text


async def test_routes_name_the_standalone_group(api: Api) -> None:
    await api.topic("routed", read=3, write=2)
    status, body = await api.call("GET", "/v1/routes/routed")
    assert status == 200 and "standalone" in json.dumps(body)
    assert_error(*await api.call("GET", "/v1/routes/unknown"), 404, "TOPIC_NOT_EXIST")


# ---- topics ---------------------------------------------------------------------------------------------
async def test_topic_create_describe_update_delete(api: Api) -> None:
    body = await api.topic("orders", read=4, write=2, perm="RW")
    assert body["readQueueNums"] == 4 and body["writeQueueNums"] == 2 and body["perm"] == "RW"
    assert [q["queueId"] for q in body["queues"]] == [0, 1, 2, 3]
    assert all(q["minOffset"] == 0 and q["maxOffset"] == 0 for q in body["queues"])
    assert await api.topic("orders", read=4, write=2) == body, "PUT is idempotent"
    assert (await api.send("orders", {"body": "x", "queueId": 1}))[0] == 200
    status, got = await api.call("GET", "/v1/topics/orders")
    assert status == 200 and got["queues"][1]["maxOffset"] == 1
    assert (await api.topic("orders", read=8, write=8, perm="R"))["perm"] == "R"
    status, _ = await api.call("DELETE", "/v1/topics/orders")
    assert status == 204
    assert_error(*await api.call("GET", "/v1/topics/orders"), 404, "TOPIC_NOT_EXIST")
    assert_error(*await api.call("DELETE", "/v1/topics/orders"), 404, "TOPIC_NOT_EXIST")


async def test_topic_without_perm_defaults_to_read_write(api: Api) -> None:
    """Regression: an omitted perm used to answer 500 (its default skipped validation)."""
    status, body = await api.call("PUT", "/v1/topics/noperm", {"readQueueNums": 2, "writeQueueNums": 2})
    assert status == 200 and body["perm"] == "RW"
    status, body = await api.call("PUT", "/v1/topics/defaults", {})
    assert status == 200 and body["perm"] == "RW"


@pytest.mark.parametrize(("name", "ok"), [
    ("a" * 127, True), ("with%and|and_and-0", True), ("a" * 128, False), ("dot.ted", False),
    ("sp ace", False), ("ünï", False)])
async def test_topic_names(api: Api, name: str, ok: bool) -> None:
    status, body = await api.call("PUT", f"/v1/topics/{name}", {"readQueueNums": 1, "writeQueueNums": 1})
    if ok:
        assert status == 200 and body["topicName"] == name
    else:
        assert_error(status, body, 400, "TOPIC_ILLEGAL")


@pytest.mark.parametrize("spec", [{"readQueueNums": 0}, {"writeQueueNums": 5000}, {"perm": "XYZ"},
                                  {"perm": 9}, {"unknown": 1}, {"readQueueNums": "many"}, [1, 2]])
async def test_bad_topic_configs(api: Api, spec: Any) -> None:
    assert_error(*await api.call("PUT", "/v1/topics/bad", spec), 400, "INVALID_REQUEST")


async def test_system_topics_are_off_limits(api: Api) -> None:
    assert_error(*await api.call("PUT", "/v1/topics/SCHEDULE_TOPIC_XXXX", {}), 403, "NO_PERMISSION")
    assert_error(*await api.send("TBW102", {"body": "x"}), 403, "NO_PERMISSION")


# ---- send -----------------------------------------------------------------------------------------------
async def test_send_single_and_batch(api: Api) -> None:
    await api.topic("s", read=2, write=2)
    status, body = await api.send("s", {"body": "one", "tags": "t1", "keys": ["k1"], "queueId": 1})
    assert status == 200
    [r] = body["results"]
    assert set(r) == {"msgId", "queueId", "queueOffset", "status"}
    assert (r["queueId"], r["queueOffset"], r["status"]) == (1, 0, "SEND_OK") and len(r["msgId"]) == 32
    status, body = await api.send("s", {"messages": [{"body": "a", "queueId": 1}, {"bodyBase64": "AAEC",
                                                                                  "queueId": 1}]})
    assert status == 200 and [(x["queueId"], x["queueOffset"]) for x in body["results"]] == [(1, 1), (1, 2)]
    status, body = await api.send("s", {"messages": [{"body": f"b{i}"} for i in range(5)]})
    results = body["results"]
    assert len({x["queueId"] for x in results}) == 1, "a batch without queue ids stays in one queue, in order"
    offsets = [x["queueOffset"] for x in results]
    assert offsets == list(range(offsets[0], offsets[0] + 5))


async def test_queue_id_minus_one_picks_among_write_queues_and_pulls_see_read_queues(api: Api) -> None:
    await api.topic("rw", read=4, write=2)
    used = set()
    for _ in range(8):
        status, body = await api.send("rw", {"body": "x", "queueId": -1})
        assert status == 200
        used.add(body["results"][0]["queueId"])
    assert used == {0, 1}
    assert_error(*await api.send("rw", {"body": "x", "queueId": 2}), 400, "MESSAGE_ILLEGAL")
    status, body = await api.pull("rw", 3)
    assert status == 200 and body["messages"] == []
    assert_error(*await api.pull("rw", 4), 400, "INVALID_REQUEST")


async def test_message_size_limits(api: Api) -> None:
    await api.topic("big", read=1, write=1)
    at_limit = base64.b64encode(b"\x01" * MAX_MESSAGE).decode()
    assert (await api.send("big", {"bodyBase64": at_limit}))[0] == 200
    over = base64.b64encode(b"\x01" * (MAX_MESSAGE + 1)).decode()
    status, body = await api.send("big", {"bodyBase64": over})
    assert_error(status, body, 400, "MESSAGE_ILLEGAL")
    assert str(MAX_MESSAGE) in body["error"]["message"]
    assert_error(*await api.send("big", {"body": ""}), 400, "MESSAGE_ILLEGAL")
    value = "v" * (PROPERTIES_MAX_LENGTH - 3)  # with the name, separators and nothing else: exactly the limit
    assert (await api.send("big", {"body": "p", "properties": {"k": value}}))[0] == 200
    assert_error(*await api.send("big", {"body": "p", "properties": {"k": value + "v"}}), 400,
                 "PROPERTIES_SIZE_EXCEEDED")


@pytest.mark.parametrize("payload", [
    {"body": "x", "bodyBase64": "eA=="}, {}, {"bodyBase64": "not base64!"}, {"body": 5},
    {"body": "x", "properties": {"TAGS": "t"}}, {"body": "x", "keys": ["has space"]},
    {"body": "x", "properties": {"k": "a\u0001b"}}, {"body": "x", "unknown": 1}, {"body": "x", "queueId": -2},
    {"body": "x", "delayLevel": 3, "deliverAtMs": 1}, {"body": "x", "tags": "t" * 256},
    {"messages": []}, {"messages": "x"}, {"messages": [{"body": "ok"}], "extra": 1}, [{"body": "x"}], "text",
])
async def test_bad_messages(api: Api, payload: Any) -> None:
    await api.topic("bad", read=1, write=1)
    status, body = await api.send("bad", payload)
    assert status == 400, body
    assert body["error"]["code"] in ("MESSAGE_ILLEGAL", "INVALID_REQUEST")
    assert body["error"]["message"]
    assert (await api.call("GET", "/v1/topics/bad"))[1]["queues"][0]["maxOffset"] == 0


@pytest.mark.parametrize("raw", [
    b"", b"{", b"\xff\xfe", b"1" * 5000, b"[" * 100_000 + b"]" * 100_000, b'{"body": "\\ud800"}',
    b'{"body": "x", "tags": "\\udfff"}', b'{"body": "x", "properties": {"\\ud800": "v"}}',
    b'{"body": "x", "keys": ["\\udc00x"]}',
])
async def test_malformed_bodies_are_400_not_500(api: Api, raw: bytes) -> None:
    """Regression: over-long integers, deep nesting and lone surrogate escapes used to answer 500."""
    await api.topic("raw", read=1, write=1)
    status, body = await api.call("POST", "/v1/topics/raw/messages", raw=raw)
    assert_error(status, body, 400, "INVALID_REQUEST")
    status, body = await api.call("PUT", "/v1/groups/g/offsets/raw/0", raw=raw)
    assert_error(status, body, 400, "INVALID_REQUEST")


async def test_valid_surrogate_pairs_are_fine(api: Api) -> None:
    await api.topic("emoji", read=1, write=1)
    assert (await api.call("POST", "/v1/topics/emoji/messages", raw=b'{"body": "\\ud83d\\ude00"}'))[0] == 200
    _, body = await api.pull("emoji", 0)
    assert body["messages"][0]["body"] == "\U0001f600"


async def test_send_permissions_and_missing_topics(api: Api) -> None:
    await api.topic("ro", read=1, write=1, perm="R")
    await api.topic("wo", read=1, write=1, perm="W")
    assert_error(*await api.send("ro", {"body": "x"}), 403, "NO_PERMISSION")
    assert (await api.send("wo", {"body": "x"}))[0] == 200
    assert_error(*await api.pull("wo", 0), 403, "NO_PERMISSION")
    assert_error(*await api.send("missing", {"body": "x"}), 404, "TOPIC_NOT_EXIST")
    assert_error(*await api.pull("missing", 0), 404, "TOPIC_NOT_EXIST")


async def test_flush_disk_timeout_answers_504(api: Api) -> None:
    await api.topic("slow", read=1, write=1)
    assert (await api.send("slow", {"body": "first"}))[0] == 200
    lock = api.node.broker.store.commitlog.files.lock
    lock.acquire()  # the flush thread cannot fsync: a disk that does not answer
    try:
        assert_error(*await api.send("slow", {"body": "late"}), 504, "FLUSH_DISK_TIMEOUT")
    finally:
        lock.release()


# ---- pull -----------------------------------------------------------------------------------------------
async def test_pull_returns_the_contract_fields(api: Api) -> None:
    await api.topic("p", read=1, write=1)
    await api.send("p", {"messages": [
        {"body": "héllo", "tags": "a", "keys": ["k1", "k2"], "properties": {"x": "y"}},
        {"bodyBase64": base64.b64encode(b"\xff\x00").decode(), "tags": "b"}]})
    status, body = await api.pull("p", 0, "offset=0&maxMessages=32")
    assert status == 200
    assert (body["nextOffset"], body["minOffset"], body["maxOffset"]) == (2, 0, 2)
    m0, m1 = body["messages"]
    for field in ("msgId", "queueId", "queueOffset", "bornTimestamp", "storeTimestamp", "reconsumeTimes",
                  "bodyBase64"):
        assert field in m0 and field in m1
    assert m0["body"] == "héllo" and base64.b64decode(m0["bodyBase64"]) == "héllo".encode()
    assert (m0["tags"], m0["keys"], m0["properties"]) == ("a", ["k1", "k2"], {"x": "y"})
    assert "body" not in m1, "a body that is not UTF-8 comes only as bodyBase64"
    assert base64.b64decode(m1["bodyBase64"]) == b"\xff\x00"
    assert (m0["queueOffset"], m1["queueOffset"], m0["reconsumeTimes"]) == (0, 1, 0)
    status, one = await api.call("GET", f"/v1/messages/{m0['msgId']}")
    assert status == 200 and one["body"] == "héllo"


async def test_pull_paging_and_tag_filter(api: Api) -> None:
    await api.topic("f", read=1, write=1)
    tags = ["a", "b", "c", "a", "b", "c", "a"]
    await api.send("f", {"messages": [{"body": str(i), "tags": t} for i, t in enumerate(tags)]})
    _, page = await api.pull("f", 0, "offset=0&maxMessages=3")
    assert [m["body"] for m in page["messages"]] == ["0", "1", "2"] and page["nextOffset"] == 3
    _, page = await api.pull("f", 0, "offset=3&maxMessages=32&tags=a||c")
    assert [m["body"] for m in page["messages"]] == ["3", "5", "6"] and page["nextOffset"] == 7
    _, page = await api.pull("f", 0, "offset=0&tags=*")
    assert len(page["messages"]) == 7


@pytest.mark.parametrize(("query", "code"), [
    ("offset=-1", "OFFSET_ILLEGAL"), ("offset=abc", "INVALID_REQUEST"), ("maxMessages=0", "INVALID_REQUEST"),
    ("waitMs=-5", "INVALID_REQUEST"), ("maxMessages=1.5", "INVALID_REQUEST")])
async def test_bad_pull_parameters(api: Api, query: str, code: str) -> None:
    await api.topic("q", read=1, write=1)
    assert_error(*await api.pull("q", 0, query), 400, code)


async def test_pull_past_the_end(api: Api) -> None:
    await api.topic("end", read=1, write=1)
    await api.send("end", {"body": "x"})
    status, body = await api.pull("end", 0, "offset=10")
    assert status == 200 and body["messages"] == [] and body["maxOffset"] == 1
    assert_error(*await api.call("GET", "/v1/topics/end/queues/x/messages"), 400, "INVALID_REQUEST")


async def test_long_polling_returns_when_a_message_arrives(api: Api) -> None:
    await api.topic("lp", read=1, write=1)
    pull = asyncio.ensure_future(api.pull("lp", 0, "offset=0&waitMs=4000"))
    await asyncio.sleep(0.2)
    assert not pull.done(), "nothing there yet: the pull waits"
    assert (await api.send("lp", {"body": "wake"}))[0] == 200
    status, body = await asyncio.wait_for(pull, 3)
    assert status == 200 and [m["body"] for m in body["messages"]] == ["wake"]
    status, body = await api.pull("lp", 0, "offset=1&waitMs=100")
    assert status == 200 and body["messages"] == [] and body["nextOffset"] == 1


async def test_long_polling_with_a_tag_filter_waits_past_other_tags(api: Api) -> None:
    await api.topic("lpt", read=1, write=1)
    pull = asyncio.ensure_future(api.pull("lpt", 0, "offset=0&waitMs=4000&tags=want"))
    await asyncio.sleep(0.1)
    await api.send("lpt", {"body": "other", "tags": "nope"})
    await asyncio.sleep(0.1)
    assert not pull.done()
    await api.send("lpt", {"body": "yes", "tags": "want"})
    status, body = await asyncio.wait_for(pull, 3)
    assert status == 200 and [m["body"] for m in body["messages"]] == ["yes"]


# ---- group offsets --------------------------------------------------------------------------------------
async def test_group_offsets(api: Api) -> None:
    await api.topic("o", read=2, write=2)
    await api.send("o", {"messages": [{"body": str(i), "queueId": 1} for i in range(5)]})
    status, body = await api.call("GET", "/v1/groups/g1/offsets/o/1")
    assert status == 200 and body["offset"] == -1, "no commit yet"
    status, body = await api.call("PUT", "/v1/groups/g1/offsets/o/1", {"offset": 3})
    assert status == 200 and body["offset"] == 3
    assert (await api.call("GET", "/v1/groups/g1/offsets/o/1"))[1]["offset"] == 3
    assert (await api.call("GET", "/v1/groups/g2/offsets/o/1"))[1]["offset"] == -1
    assert_error(*await api.call("PUT", "/v1/groups/g1/offsets/o/1", {"offset": 6}), 400, "OFFSET_ILLEGAL")
    assert_error(*await api.call("PUT", "/v1/groups/g1/offsets/o/1", {"offset": -1}), 400, "OFFSET_ILLEGAL")
    for bad in ({"offset": "3"}, {"offset": True}, {"nope": 1}, [3]):
        assert_error(*await api.call("PUT", "/v1/groups/g1/offsets/o/1", bad), 400, "INVALID_REQUEST")
    assert_error(*await api.call("PUT", "/v1/groups/bad.group/offsets/o/1", {"offset": 0}), 400,
                 "INVALID_REQUEST")
    assert_error(*await api.call("PUT", "/v1/groups/g1/offsets/nope/1", {"offset": 0}), 404, "TOPIC_NOT_EXIST")


@pytest.mark.parametrize("queue_id", ["-1", "2", "99999999999999999999"])
async def test_group_offsets_only_for_queues_of_the_topic(api: Api, queue_id: str) -> None:
    """Regression: commits to queue ids the topic does not have used to be stored (and persisted)."""
    await api.topic("oq", read=2, write=2)
    assert_error(*await api.call("PUT", f"/v1/groups/g/offsets/oq/{queue_id}", {"offset": 0}), 400,
                 "INVALID_REQUEST")


# ---- errors everywhere ----------------------------------------------------------------------------------
async def test_unknown_paths_and_methods_answer_the_error_body(api: Api) -> None:
    assert_error(*await api.call("GET", "/v1/nothing"), 404, "NOT_FOUND")
    assert_error(*await api.call("PATCH", "/v1/topics/x"), 405, "METHOD_NOT_ALLOWED")
    assert_error(*await api.call("GET", "/v1/messages/zz"), 400, "INVALID_REQUEST")
    assert_error(*await api.call("GET", "/v1/messages/" + "0" * 32), 404, "NOT_FOUND")
