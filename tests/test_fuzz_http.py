"""Hypothesis against a real broker process: random paths, methods, query parameters and JSON bodies
never get a 5xx, and every 4xx carries the contract's error body."""

from __future__ import annotations

import http.client
import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import BrokerProcess

TOPIC = "fz"
FUZZ = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


class Client:
    """One keep-alive connection, reopened when the server closes it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def request(self, method: str, path: str, body: bytes | None) -> tuple[int, str, bytes]:
        for attempt in range(2):
            try:
                self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                return resp.status, resp.getheader("Content-Type", ""), resp.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                if attempt:
                    raise
        raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    data: Path = tmp_path_factory.mktemp("fuzz") / "data"
    broker = BrokerProcess(data, flush="async", config={
        "mappedFileSizeCommitLog": 1024 * 1024, "preallocateCommitLog": False, "longPollingMaxMs": 50,
        "maxMessageSize": 4096})
    broker.start()
    try:
        assert broker.call("PUT", f"/v1/topics/{TOPIC}", {"readQueueNums": 2, "writeQueueNums": 2})[0] == 200
        assert broker.call("POST", f"/v1/topics/{TOPIC}/messages", {"body": "seed", "tags": "a"})[0] == 200
        yield Client(broker.http_port)
        assert "Traceback" not in broker.log_tail(10**7), "the broker logged a traceback"
    finally:
        assert broker.terminate() == 0


def check(status: int, ctype: str, raw: bytes, what: str) -> None:
    assert status < 500, f"{what} -> {status}: {raw[:300]!r}"
    if status >= 400:
        assert ctype.startswith("application/json"), f"{what} -> {status} {ctype}: {raw[:200]!r}"
        body = json.loads(raw)
        assert isinstance(body, dict) and set(body) == {"error"}, f"{what} -> {body}"
        err = body["error"]
        assert isinstance(err.get("code"), str) and err["code"].isupper(), f"{what} -> {body}"
        assert isinstance(err.get("message"), str) and err["message"], f"{what} -> {body}"
    elif status != 204:
        if ctype.startswith("application/json"):
            json.loads(raw)
        else:
            assert ctype.startswith("text/plain"), f"{what} -> {ctype}"


# ---- strategies ------------------------------------------------------------------------------------------
huge_ints = st.one_of(st.integers(-(10**6), 10**6), st.integers(-(2**70), 2**70),
                      st.just(10**40), st.just(-(2**63)), st.just(2**63))
names = st.one_of(st.just(TOPIC), st.sampled_from(["SCHEDULE_TOPIC_XXXX", "g", "%", "|", "-", "a" * 128]),
                  st.text(string.ascii_letters + string.digits + "%|_-.", min_size=1, max_size=20),
                  st.text(min_size=1, max_size=20))
numbers = st.one_of(huge_ints.map(str), st.sampled_from(["", "x", "1.5", " 1", "0x10", "\u0661", "-0", "1e3"]))
segment = st.one_of(names, numbers).map(lambda s: quote(s, safe="") or "%20")
# Strings may hold lone surrogates: json.dumps writes them as \udXXX escapes, which parse to text that
# no later .encode() accepts.
any_text = st.one_of(st.text(max_size=30), st.text(max_size=4).map(lambda t: t + "\ud800"),
                     st.text(st.characters(categories=["Cs", "Lu"]), max_size=6))
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), huge_ints, st.floats(allow_nan=True), any_text),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)
message_fields = st.fixed_dictionaries({}, optional={
    "body": st.one_of(any_text, json_values), "bodyBase64": st.one_of(st.text(max_size=20), json_values),
    "tags": st.one_of(any_text, json_values), "keys": st.one_of(st.lists(st.text(max_size=8)), json_values),
    "properties": st.one_of(st.dictionaries(any_text, any_text, max_size=3), json_values),
    "queueId": st.one_of(huge_ints, json_values), "delayLevel": st.one_of(huge_ints, json_values),
    "deliverAtMs": st.one_of(huge_ints, json_values)})
topic_fields = st.fixed_dictionaries({}, optional={
    "readQueueNums": st.one_of(huge_ints, json_values), "writeQueueNums": st.one_of(huge_ints, json_values),
    "perm": st.one_of(st.sampled_from(["RW", "R", "W", "DENY", "rw", "x"]), huge_ints, json_values),
    "messageType": st.one_of(st.sampled_from(["NORMAL", "FIFO", "nope"]), json_values)})
bodies = st.one_of(
    st.none(),
    json_values.map(lambda v: json.dumps(v).encode()),
    message_fields.map(lambda v: json.dumps(v).encode()),
    st.lists(message_fields, max_size=4).map(lambda v: json.dumps({"messages": v}).encode()),
    topic_fields.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"offset": st.one_of(huge_ints, json_values)}).map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=60),
    # past Python's int-parsing digit limit, and nested past its recursion limit
    st.integers(4300, 5000).map(lambda n: b"7" * n),
    st.integers(900, 3000).map(lambda n: b'{"body": ' + b"[" * n + b"]" * n + b"}"),
)
query = st.dictionaries(
    st.sampled_from(["offset", "maxMessages", "waitMs", "tags", "timestamp", "x"]),
    st.one_of(numbers, st.text(max_size=15)), max_size=4,
).map(lambda q: "?" + urlencode(q) if q else "")


@st.composite
def paths(draw: st.DrawFn) -> str:
    t, q, g = draw(segment), draw(segment), draw(segment)
    template = draw(st.sampled_from([
        "/v1/health", "/metrics", "/v1/topics", f"/v1/topics/{t}", f"/v1/topics/{t}/messages",
        f"/v1/topics/{t}/queues/{q}/messages", f"/v1/topics/{t}/queues/{q}/offset-by-time",
        f"/v1/topics/{t}/groups", f"/v1/groups/{g}/offsets/{t}/{q}", f"/v1/routes/{t}", f"/v1/messages/{t}",
        f"/{t}/{q}", f"/v1/{t}",
    ]))
    return template + draw(query)


# ---- tests -----------------------------------------------------------------------------------------------
@FUZZ
@given(method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "PATCH", "HEAD"]), path=paths(), body=bodies)
def test_random_requests_never_fail_the_server(client: Client, method: str, path: str, body: bytes | None) -> None:
    status, ctype, raw = client.request(method, path, body)
    if method == "HEAD":
        assert status < 500, f"HEAD {path} -> {status}"
        return
    check(status, ctype, raw, f"{method} {path} {body!r:.120}")


@FUZZ
@given(payload=st.one_of(message_fields, st.lists(message_fields, min_size=1, max_size=4).map(
    lambda v: {"messages": v})))
def test_random_messages_are_stored_or_refused_cleanly(client: Client, payload: dict[str, Any]) -> None:
    status, ctype, raw = client.request("POST", f"/v1/topics/{TOPIC}/messages", json.dumps(payload).encode())
    check(status, ctype, raw, f"send {payload!r:.200}")
    if status == 200:
        results = json.loads(raw)["results"]
        n = len(payload.get("messages", [payload]))
        assert len(results) == n and all(r["status"] == "SEND_OK" for r in results)
        r = results[0]
        status, ctype, raw = client.request(
            "GET", f"/v1/topics/{TOPIC}/queues/{r['queueId']}/messages?offset={r['queueOffset']}&maxMessages=1", None)
        assert status == 200
        [m] = json.loads(raw)["messages"]
        assert m["msgId"] == r["msgId"]


@FUZZ
@given(q=query, queue=st.one_of(st.integers(-2, 3).map(str), numbers))
def test_random_pull_parameters(client: Client, q: str, queue: str) -> None:
    path = f"/v1/topics/{TOPIC}/queues/{quote(queue, safe='') or '0'}/messages{q}"
    status, ctype, raw = client.request("GET", path, None)
    check(status, ctype, raw, path)
