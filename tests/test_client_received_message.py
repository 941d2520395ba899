"""The client's lazily decoded ReceivedMessage: fields read from a pull response's raw records must be
exactly what the broker's own record decoder reads, and setting a field must stick."""

from __future__ import annotations

import pytest

from ferrymq.client.errors import ClientError
from ferrymq.client.message import ReceivedMessage, decode_records
from ferrymq.common import record
from ferrymq.common.message import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, encode_properties

STORE_HOST = record.host_bytes("127.0.0.1", 10911)
FIELDS = ("msg_id", "topic", "queue_id", "queue_offset", "body", "tags", "keys", "properties", "born_timestamp",
          "store_timestamp", "reconsume_times", "commit_log_offset")


def _record(i: int, props: dict[str, str], topic: str = "orders") -> bytes:
    body = b"%06d-" % i + "é".encode() * (i % 7)
    pb = encode_properties(props)
    buf = bytearray(record.record_size(len(body), len(topic.encode()), len(pb)))
    record.encode_into(buf, 0, queue_id=i % 4, flag=0, queue_offset=100 + i, physical_offset=4096 * i + 17, sysflag=0,
                       born_timestamp=1_700_000_000_000 + i, born_host=record.host_bytes("10.0.0.9", 5000),
                       store_timestamp=1_700_000_000_500 + i, store_host=STORE_HOST, reconsume_times=i % 3,
                       prepared_transaction_offset=0, body=body, body_crc32=record.body_crc(body),
                       topic=topic.encode(), properties=pb)
    return bytes(buf)


PROPS = [{}, {PROPERTY_TAGS: "TagA"}, {PROPERTY_KEYS: f"k1{KEY_SEPARATOR}k2", "color": "red", "UNIQ_KEY": "AB12"},
         {PROPERTY_TAGS: "t", PROPERTY_KEYS: "only", "x": "y=z"}]


def _blob(n: int) -> tuple[bytes, list[int]]:
    parts, starts, pos = [], [], 0
    for i in range(n):
        rec = _record(i, PROPS[i % len(PROPS)], topic="orders" if i % 2 else "订单")
        parts.append(rec)
        starts.append(pos)
        pos += len(rec)
    return b"".join(parts), starts


def test_every_field_matches_the_broker_decoder() -> None:
    blob, starts = _blob(12)
    msgs = decode_records(blob, "group-a")
    assert len(msgs) == 12
    for m, start in zip(msgs, starts, strict=True):
        ref = record.decode(blob, start)
        props = dict(ref.properties)
        tags, keys = props.pop(PROPERTY_TAGS, None), props.pop(PROPERTY_KEYS, None)
        assert m.msg_id == ref.msg_id
        assert (m.topic, m.queue_id, m.queue_offset, m.body) == (ref.topic, ref.queue_id, ref.queue_offset, ref.body)
        assert type(m.body) is bytes
        assert (m.tags, m.keys, m.properties) == (tags, keys.split(KEY_SEPARATOR) if keys else [], props)
        assert (m.born_timestamp, m.store_timestamp, m.reconsume_times, m.commit_log_offset) == (
            ref.born_timestamp, ref.store_timestamp, ref.reconsume_times, ref.physical_offset)
        assert m.broker_group == "group-a"
        assert m.queue == (m.topic, "group-a", m.queue_id)


def test_fields_read_in_any_order_agree() -> None:
    blob, _ = _blob(4)
    forward = [{f: getattr(m, f) for f in FIELDS} for m in decode_records(blob, "g")]
    backward = [{f: getattr(m, f) for f in reversed(FIELDS)} for m in decode_records(blob, "g")]
    assert forward == backward


def test_a_set_field_is_not_overwritten_by_a_later_decode() -> None:
    blob, _ = _blob(3)
    m = decode_records(blob, "g")[2]
    m.topic = "%RETRY%cg"
    m.queue_offset = 7  # set before any header field was read
    m.properties = {"a": "b"}
    m.msg_id = "ORIGIN"
    assert (m.reconsume_times, m.tags, m.keys) == (2, None, ["k1", "k2"])  # siblings still decode
    assert (m.topic, m.queue_offset, m.properties, m.msg_id) == ("%RETRY%cg", 7, {"a": "b"}, "ORIGIN")


def test_eager_construction_equality_and_repr() -> None:
    blob, _ = _blob(2)
    lazy = decode_records(blob, "g")[1]
    eager = ReceivedMessage(*(getattr(lazy, f) for f in ReceivedMessage.FIELDS))
    assert eager == lazy
    assert eager != decode_records(blob, "g")[0]
    assert repr(eager) == repr(lazy)
    assert "queue_offset=101" in repr(lazy)


def test_a_truncated_response_is_refused() -> None:
    blob, _ = _blob(2)
    with pytest.raises(ClientError) as err:
        decode_records(blob[:-1], "g")
    assert err.value.code == "SYSTEM_ERROR"
    assert decode_records(b"", "g") == []
