"""The broker's TCP server against a real broker process: many requests in flight on one connection,
SYSTEM_BUSY past the in-flight bound, idle connections closed with their registrations, long
polling, every HTTP operation over TCP, and fuzzed frames that get an error reply or a closed
connection — never a dead broker."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import BrokerProcess

from ferrymq.broker.protocol.request_codes import RequestCode
from ferrymq.broker.protocol.tcp_codec import FrameDecoder, FrameError, encode_frame
from ferrymq.client.errors import BrokerError
from ferrymq.client.transport import Connection, RemotingClient
from ferrymq.common import record

CONFIG = {"serverChannelMaxIdleTimeSeconds": 1.0, "serverMaxInflightRequestsPerChannel": 256}
packb = msgpack.Packer(use_bin_type=True).pack


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(Path(tmp_path_factory.mktemp("tcp")) / "data", config=CONFIG).start()
    assert b.call("PUT", "/v1/topics/tt", {"readQueueNums": 4, "writeQueueNums": 4})[0] == 200
    yield b
    b.terminate()


def addr(b: BrokerProcess) -> str:
    return f"127.0.0.1:{b.tcp_port}"


async def test_hundreds_of_requests_in_flight_on_one_connection(broker: BrokerProcess) -> None:
    rc = RemotingClient()
    try:
        conn = await rc.connection(addr(broker))
        sends = [conn.request(RequestCode.SEND_MESSAGE, {"topic": "tt", "queueId": 1}, f"m{i}".encode(), 10)
                 for i in range(250)]
        replies = await asyncio.gather(*sends)
        assert all(r.code == 0 for r in replies)
        assert sorted(r.ext["queueOffset"] for r in replies) == list(range(250))
        assert len(rc.conns) == 1
        pulls = [conn.request(RequestCode.PULL_MESSAGE, {"topic": "tt", "queueId": 1, "offset": i, "maxMsgs": 1},
                              b"", 10) for i in range(250)]
        got = await asyncio.gather(*pulls)
        assert [record.decode(r.body).body for r in got] == [f"m{i}".encode() for i in range(250)]
    finally:
        rc.close()


async def test_system_busy_past_the_in_flight_bound_then_recovers(broker: BrokerProcess) -> None:
    rc = RemotingClient()
    try:
        conn = await rc.connection(addr(broker))
        holds = [conn.request(RequestCode.PULL_MESSAGE, {"topic": "tt", "queueId": 3, "offset": 0,
                                                         "waitMs": 1500}, b"", 10) for _ in range(300)]
        replies = await asyncio.gather(*holds)
        busy = [r for r in replies if r.code != 0]
        assert len(busy) == 300 - 256
        assert {r.ext["error"] for r in busy} == {"SYSTEM_BUSY"} and "in flight" in (busy[0].remark or "")
        ok = [r for r in replies if r.code == 0]
        assert {r.ext["status"] for r in ok} == {"NO_NEW_MSG"}
        r = await conn.request(RequestCode.GET_BROKER_RUNTIME_INFO, None, b"", 5)
        assert r.code == 0 and msgpack.unpackb(r.body)["status"] == "ok"
    finally:
        rc.close()


async def test_long_polling_answers_when_a_message_arrives(broker: BrokerProcess) -> None:
    rc = RemotingClient()
    try:
        a = addr(broker)
        held = asyncio.ensure_future(rc.invoke(a, RequestCode.PULL_MESSAGE, {"topic": "tt", "queueId": 2,
                                                                             "offset": 0, "waitMs": 20_000},
                                               timeout_s=30))
        await asyncio.sleep(0.3)
        assert not held.done()
        await rc.invoke(a, RequestCode.SEND_MESSAGE, {"topic": "tt", "queueId": 2}, b"wake")
        r = await asyncio.wait_for(held, 15)
        assert r.ext["status"] == "FOUND" and record.decode(r.body).body == b"wake"
    finally:
        rc.close()


def test_idle_connection_is_closed_and_its_registration_dropped(broker: BrokerProcess) -> None:
    s = socket.create_connection(("127.0.0.1", broker.tcp_port))
    hb = packb({"clientId": "idle-client", "consumerGroups": [{"group": "idle-g", "subscriptions": [
        {"topic": "tt", "expression": "*"}]}]})
    s.sendall(encode_frame(RequestCode.HEART_BEAT, 1, 0, None, None, hb))
    s.sendall(encode_frame(RequestCode.GET_CONSUMER_LIST_BY_GROUP, 2, 0, {"group": "idle-g"}))
    dec = FrameDecoder()
    got = []
    while len([c for c in got if c.is_response]) < 2:
        got += dec.feed(s.recv(65536))
    # answers may come in any order; the join also brought a NOTIFY_CONSUMER_IDS_CHANGED request
    assert [c.ext for c in got if not c.is_response] == [{"consumerGroup": "idle-g"}]
    by_opaque = {c.opaque: c for c in got if c.is_response}
    assert by_opaque[1].code == 0 and msgpack.unpackb(by_opaque[2].body) == ["idle-client"]
    s.settimeout(10)
    t0 = time.monotonic()
    assert s.recv(65536) == b""  # the broker closed the idle connection
    assert time.monotonic() - t0 < 9
    s.close()

    async def members() -> list[str]:
        rc = RemotingClient()
        try:
            r = await rc.invoke(addr(broker), RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"group": "idle-g"})
            return msgpack.unpackb(r.body)
        finally:
            rc.close()

    assert asyncio.run(members()) == []


async def test_every_http_operation_over_tcp(broker: BrokerProcess) -> None:
    rc = RemotingClient()
    a = addr(broker)

    async def call(code: int, ext: dict | None = None, body: bytes = b"") -> tuple[dict, object]:
        r = await rc.invoke(a, code, ext, body)
        return r.ext, (msgpack.unpackb(r.body, strict_map_key=False) if r.body and code not in (
            RequestCode.PULL_MESSAGE, RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.GET_METRICS) else r.body)

    try:
        _, desc = await call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "ops", "readQueueNums": 2,
                                                                   "writeQueueNums": 2, "perm": "RW"})
        assert desc == broker.call("GET", "/v1/topics/ops")[1]
        _, desc = await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "ops"})
        assert desc["readQueueNums"] == 2 and len(desc["queues"]) == 2
        _, topics = await call(RequestCode.GET_ALL_TOPIC_CONFIG)
        assert "ops" in {t["topicName"] for t in topics["topics"]}
        ext, _ = await call(RequestCode.SEND_MESSAGE, {"topic": "ops", "queueId": 0, "props": {"TAGS": "x"}}, b"hi")
        msg_id = ext["msgId"]
        ext, results = await call(RequestCode.SEND_BATCH_MESSAGE, {"topic": "ops", "queueId": 0},
                                  packb([[b"b1", None], [b"b2", {"TAGS": "y", "k": "v"}]]))
        assert ext["queueId"] == 0 and [o for _, o in results] == [1, 2]
        ext, body = await call(RequestCode.PULL_MESSAGE, {"topic": "ops", "queueId": 0, "offset": 0, "tags": "y"})
        assert ext["status"] == "FOUND" and record.decode(body).body == b"b2" and ext["nextOffset"] == 3
        http_pull = broker.call("GET", "/v1/topics/ops/queues/0/messages?offset=0&tags=y")[1]
        assert http_pull["nextOffset"] == ext["nextOffset"] and http_pull["maxOffset"] == ext["maxOffset"]
        _, raw = await call(RequestCode.VIEW_MESSAGE_BY_ID, {"msgId": msg_id})
        assert record.decode(raw).body == b"hi"
        await call(RequestCode.UPDATE_CONSUMER_OFFSET, {"group": "g1", "topic": "ops", "queueId": 0, "offset": 2})
        ext, _ = await call(RequestCode.QUERY_CONSUMER_OFFSET, {"group": "g1", "topic": "ops", "queueId": 0})
        assert ext["offset"] == 2 == broker.call("GET", "/v1/groups/g1/offsets/ops/0")[1]["offset"]
        _, groups = await call(RequestCode.QUERY_TOPIC_CONSUME_BY_WHO, {"topic": "ops"})
        assert groups == broker.call("GET", "/v1/topics/ops/groups")[1]
        for code, want in ((RequestCode.GET_MAX_OFFSET, 3), (RequestCode.GET_MIN_OFFSET, 0)):
            ext, _ = await call(code, {"topic": "ops", "queueId": 0})
            assert ext["offset"] == want
        ext, _ = await call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": "ops", "queueId": 0,
                                                                      "timestamp": int(time.time() * 1000) + 60_000})
        assert ext["offset"] == 3
        _, health = await call(RequestCode.GET_BROKER_RUNTIME_INFO)
        assert health["status"] == "ok"
        _, metrics = await call(RequestCode.GET_METRICS)
        assert b"ferrymq_messages_in" in metrics
        await call(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "ops"})
        assert broker.call("GET", "/v1/topics/ops")[0] == 404
        with pytest.raises(BrokerError) as err:
            await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "ops"})
        assert err.value.code == "TOPIC_NOT_EXIST" and "ops" in err.value.message
        with pytest.raises(BrokerError) as err:
            await call(RequestCode.SEND_MESSAGE, {"topic": "tt", "queueId": 99}, b"x")
        assert err.value.code == "MESSAGE_ILLEGAL"
        with pytest.raises(BrokerError) as err:
            await call(RequestCode.PULL_MESSAGE, {"topic": "tt"})
        assert err.value.code == "INVALID_REQUEST" and "queueId" in err.value.message
        with pytest.raises(BrokerError) as err:
            await call(9999)
        assert err.value.code == "REQUEST_CODE_NOT_SUPPORTED"
    finally:
        rc.close()


# ---- fuzzing a live broker ---------------------------------------------------------------------------------
CODES = [int(c) for c in RequestCode if c not in (RequestCode.DELETE_TOPIC_IN_BROKER,)] + [0, 7, 65535]
ext_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=12),
                       st.binary(max_size=12), st.lists(st.integers(-1000, 1000), max_size=3),
                       st.sampled_from(["tt", "fz", "../x", "", "g"]))
ext_keys = st.sampled_from(["topic", "queueId", "offset", "maxMsgs", "waitMs", "tags", "group", "props", "msgId",
                            "clientId", "readQueueNums", "writeQueueNums", "perm", "commitOffset", "timestamp",
                            "consumerGroup", "producerGroup", "x"])
frames = st.one_of(
    st.binary(max_size=200),
    st.builds(lambda code, ext, body, flags: encode_frame(code, 1, flags, ext, None, body),
              st.sampled_from(CODES), st.dictionaries(ext_keys, ext_values, max_size=6),
              st.one_of(st.binary(max_size=64), st.builds(packb, st.lists(st.lists(st.binary(max_size=4),
                                                                                   max_size=3), max_size=3))),
              st.sampled_from([0, 0, 2])),
)


def _exchange(port: int, data: bytes) -> list:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # the broker sees EOF: no hanging on a half frame
        buf = b""
        try:
            while chunk := s.recv(65536):
                buf += chunk
        except ConnectionResetError:
            pass
    try:
        return FrameDecoder().feed(buf)
    except FrameError as exc:  # the broker only ever writes whole frames
        raise AssertionError(f"broker sent a malformed frame: {exc}") from exc


@given(st.lists(frames, min_size=1, max_size=3))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_frames_get_errors_or_a_closed_connection(broker: BrokerProcess, parts: list[bytes]) -> None:
    for cmd in _exchange(broker.tcp_port, b"".join(parts)):
        assert cmd.is_response
        if cmd.code != 0:
            assert isinstance(cmd.ext.get("error"), str) and cmd.remark
            assert cmd.ext["error"] != "SYSTEM_ERROR", cmd.remark  # bad input is the client's error


def test_broker_alive_after_fuzzing(broker: BrokerProcess) -> None:
    assert broker.call("GET", "/v1/health")[0] == 200
    (r,) = _exchange(broker.tcp_port, encode_frame(RequestCode.GET_BROKER_RUNTIME_INFO, 5, 0))
    assert r.code == 0 and r.opaque == 5
    assert "Traceback" not in broker.log_tail(200_000)


def test_connection_object_reports_close(broker: BrokerProcess) -> None:
    assert Connection("127.0.0.1:1", None).closed is False
