"""Hypothesis on the record decoder: arbitrary bytes only ever raise RecordError; every message
survives encode → decode; damage to anything the record checks is always caught."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ferrymq.common import record
from ferrymq.common.message import NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR, decode_properties, encode_properties

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
prop_text = st.text(st.characters(blacklist_categories=("Cs",),
                                   blacklist_characters=NAME_VALUE_SEPARATOR + PROPERTY_SEPARATOR), max_size=20)


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes, dict[str, object]]:
    body = draw(st.binary(max_size=300))
    topic = draw(st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=40))
    props = draw(st.dictionaries(prop_text, prop_text, max_size=5))
    fields: dict[str, object] = {
        "queue_id": draw(i32), "flag": draw(i32), "queue_offset": draw(i64),
        "physical_offset": draw(st.integers(0, 2**62)), "sysflag": draw(i32), "born_timestamp": draw(i64),
        "born_host": draw(st.binary(min_size=8, max_size=8)), "store_timestamp": draw(i64),
        "store_host": draw(st.binary(min_size=8, max_size=8)), "reconsume_times": draw(i32),
        "prepared_transaction_offset": draw(i64),
    }
    topic_b, props_b = topic.encode(), encode_properties(props)
    assume(len(topic_b) <= 255)
    buf = bytearray(record.record_size(len(body), len(topic_b), len(props_b)))
    record.encode_into(buf, 0, body=body, body_crc32=record.body_crc(body), topic=topic_b, properties=props_b,
                       **fields)  # type: ignore[arg-type]
    return bytes(buf), {**fields, "body": body, "topic": topic, "properties": props}


@FUZZ
@given(st.binary(max_size=600), st.integers(0, 50))
def test_arbitrary_bytes_raise_only_record_error(data: bytes, pos: int) -> None:
    pos = min(pos, len(data))
    try:
        size = record.check_record(data, pos)
    except record.RecordError:
        return
    assert record.FIXED_OVERHEAD <= size <= len(data) - pos
    assert record.decode(data, pos).size == size


@FUZZ
@given(st.binary(min_size=8, max_size=200))
def test_bytes_that_look_like_a_record_header_raise_only_record_error(tail: bytes) -> None:
    # Valid magic and a plausible size, so the checks past the header get exercised too.
    total = record.FIXED_OVERHEAD + len(tail) - 8
    data = record._BLANK.pack(total, record.MESSAGE_MAGIC_CODE) + bytes(record.HEADER_SIZE - 8) + tail[8:] + tail[:8]
    try:
        record.decode(data)
    except record.RecordError:
        pass


@FUZZ
@given(records())
def test_encode_decode_round_trip(rec: tuple[bytes, dict[str, object]]) -> None:
    raw, fields = rec
    assert record.check_record(raw, 0, fields["physical_offset"]) == len(raw)  # type: ignore[arg-type]
    m = record.decode(raw)
    assert m.size == len(raw)
    for name, value in fields.items():
        assert getattr(m, name) == value, name
    size, qid, qoff, ts, topic, props, sysflag = record.dispatch_fields(raw, 0)
    assert (size, qid, qoff, ts, topic, sysflag) == (len(raw), m.queue_id, m.queue_offset, m.store_timestamp,
                                                     m.topic, m.sysflag)
    assert decode_properties(props) == m.properties


def _checked_positions(raw: bytes) -> list[int]:
    """Byte positions whose damage the record can always detect: the framing (size, magic, CRC,
    physical offset, the three lengths) and the body (CRC-32 catches every single-bit error)."""
    (blen,) = record._I32.unpack_from(raw, record.HEADER_SIZE)
    body_start = record.HEADER_SIZE + 4
    tlen_at = body_start + blen
    plen_at = tlen_at + 1 + raw[tlen_at]
    return [*range(0, 12), *range(28, 36), *range(record.HEADER_SIZE, body_start + blen), tlen_at,
            plen_at, plen_at + 1]


@FUZZ
@given(records(), st.data())
def test_a_bit_flip_in_any_checked_byte_is_caught(rec: tuple[bytes, dict[str, object]], data: st.DataObject) -> None:
    raw, fields = rec
    pos = data.draw(st.sampled_from(_checked_positions(raw)))
    bit = data.draw(st.integers(0, 7))
    damaged = bytearray(raw)
    damaged[pos] ^= 1 << bit
    try:
        record.check_record(damaged, 0, fields["physical_offset"])  # type: ignore[arg-type]
    except record.RecordError:
        return
    raise AssertionError(f"a flip of bit {bit} at byte {pos} went unnoticed")


@FUZZ
@given(records(), st.data())
def test_any_damage_or_truncation_raises_only_record_error(rec: tuple[bytes, dict[str, object]],
                                                           data: st.DataObject) -> None:
    raw, _ = rec
    damaged = bytearray(raw[: data.draw(st.integers(0, len(raw)))])
    for _ in range(data.draw(st.integers(0, 4))):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    try:
        record.decode(bytes(damaged))
    except record.RecordError:
        pass
