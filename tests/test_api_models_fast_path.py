"""The HTTP hot paths' hand-written shortcuts must agree with the general code they stand in for:
the send fast path with the pydantic model, directly formatted JSON with json.dumps of the API dicts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.broker.services.messaging import SendResult
from ferrymq.common.api_models import _plain_message, _validated_message, parse_messages, stored_json, stored_to_api
from ferrymq.common.errors import FerryError
from ferrymq.common.message import StoredMessage

FIELDS = ["body", "bodyBase64", "tags", "keys", "properties", "queueId", "delayLevel", "deliverAtMs"]

# Values of every JSON type, near each field's limits, plus the types pydantic would coerce.
values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 300), st.sampled_from([10**12, -(10**12)]), st.floats(-2, 3),
    st.text(max_size=8), st.text(min_size=254, max_size=257), st.sampled_from(["aGk=", "not base64!", "a b", ""]),
    st.lists(st.one_of(st.text(max_size=4), st.integers(0, 3)), max_size=3),
    st.dictionaries(st.text(max_size=4), st.one_of(st.text(max_size=4), st.integers(0, 3)), max_size=3),
)
# Mostly near-valid objects (one body, a few more fields), so that both paths are exercised.
items = st.one_of(
    st.dictionaries(st.sampled_from([*FIELDS, "extra"]), values, max_size=5),
    st.fixed_dictionaries({"body": st.text(max_size=8)},
                          optional={f: values for f in FIELDS if f not in ("body", "bodyBase64")}),
    st.fixed_dictionaries({"bodyBase64": st.sampled_from(["aGk=", "", "x"])},
                          optional={f: values for f in FIELDS if f not in ("body", "bodyBase64")}),
)


def outcome(fn: Any, item: dict[str, Any]) -> Any:
    try:
        return fn("t", item)
    except FerryError as exc:
        return ("error", exc.code)


@settings(max_examples=600, deadline=None)
@given(items)
def test_fast_path_accepts_only_what_pydantic_accepts_unchanged(item: dict[str, Any]) -> None:
    fast = outcome(_plain_message, item)
    if fast is None:
        return  # not the plain shape: parse_messages asks pydantic
    assert fast == outcome(_validated_message, item)


def test_plain_messages_take_the_fast_path() -> None:
    item = {"body": "x" * 1024, "tags": "a", "keys": ["k1", "k2"], "properties": {"p": "v"}, "queueId": 2}
    msg = _plain_message("t", item)
    assert msg is not None and msg == _validated_message("t", item)
    assert msg.properties == {"p": "v", "TAGS": "a", "KEYS": "k1 k2"} and msg.queue_id == 2


@pytest.mark.parametrize("item", [{"body": "x", "queueId": True}, {"body": "x", "queueId": 1.0},
                                  {"body": "x", "bodyBase64": "aGk="}, {"body": "x", "other": 1}])
def test_anything_else_goes_to_pydantic(item: dict[str, Any]) -> None:
    assert _plain_message("t", item) is None


def test_errors_name_the_message() -> None:
    with pytest.raises(FerryError) as err:
        parse_messages("t", {"messages": [{"body": "ok"}, {"body": "x", "properties": {"TAGS": "no"}}]})
    assert err.value.code == "MESSAGE_ILLEGAL" and err.value.details["index"] == 1
    assert err.value.message.startswith("message 1: ")
    with pytest.raises(FerryError) as err:
        parse_messages("t", {"messages": [{"body": "ok"}, {"tags": "no body"}]})
    assert err.value.code == "MESSAGE_ILLEGAL" and err.value.details["index"] == 1
    assert err.value.message.startswith("message 1: ") and "body" in err.value.message


texts = st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(body=st.one_of(st.binary(max_size=64), texts.map(str.encode)), topic=texts,
       props=st.dictionaries(st.one_of(st.sampled_from(["TAGS", "KEYS"]),
                                       texts.filter(lambda k: k and "\x01" not in k and "\x02" not in k)),
                             texts.filter(lambda v: "\x01" not in v and "\x02" not in v), max_size=4),
       numbers=st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**62), st.integers(0, 2**62)))
def test_stored_json_is_stored_to_api_as_json(body: bytes, topic: str, props: dict[str, str],
                                              numbers: tuple[int, int, int]) -> None:
    queue_id, queue_offset, timestamp = numbers
    m = StoredMessage(topic=topic, queue_id=queue_id, queue_offset=queue_offset, physical_offset=timestamp, size=0,
                      body=body, properties=props, flag=0, sysflag=0, born_timestamp=timestamp, born_host=b"\0" * 8,
                      store_timestamp=timestamp, store_host=b"\x7f\0\0\x01\0\0\0\x09", reconsume_times=queue_id,
                      prepared_transaction_offset=0, body_crc=0)
    assert json.loads(stored_json(m)) == stored_to_api(m)


def test_send_result_json_is_its_api_form() -> None:
    r = SendResult("7F00000100002A9F0000000000001234", 3, 2**40, 99)
    assert json.loads(r.to_json()) == r.to_api()
