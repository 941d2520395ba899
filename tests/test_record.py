"""The commit-log record codec: layout, validation, markers, and the message model it carries."""

from __future__ import annotations

import struct

import pytest

from ferrymq.common import record
from ferrymq.common.errors import FerryError
from ferrymq.common.limits import PROPERTIES_MAX_LENGTH
from ferrymq.common.message import (
    decode_properties,
    encode_properties,
    offset_msg_id,
    parse_offset_msg_id,
    split_tag_filter,
    tags_hash,
)

HOST = record.host_bytes("10.1.2.3", 10911)


def encode(body: bytes = b"hello", topic: bytes = b"orders", props: bytes = b"TAGS\x01paid\x02",
           phys: int = 4096, **fields: int) -> bytes:
    size = record.record_size(len(body), len(topic), len(props))
    buf = bytearray(size)
    args = {"queue_id": 3, "flag": 7, "queue_offset": 42, "physical_offset": phys, "sysflag": 0,
            "born_timestamp": 1_700_000_000_000, "born_host": record.host_bytes("192.168.0.9", 5555),
            "store_timestamp": 1_700_000_000_123, "store_host": HOST, "reconsume_times": 2,
            "prepared_transaction_offset": 0}
    args.update(fields)
    written = record.encode_into(buf, 0, body=body, body_crc32=record.body_crc(body), topic=topic,
                                 properties=props, **args)  # type: ignore[arg-type]
    assert written == size
    return bytes(buf)


def test_layout_matches_rocketmq_v1() -> None:
    raw = encode()
    assert record.HEADER_SIZE == 84 and record.FIXED_OVERHEAD == 91
    assert len(raw) == 91 + 5 + 6 + len(b"TAGS\x01paid\x02")
    total, magic, crc, qid, flag, qoff, phys, sysflag, born, born_host, store, store_host, recon, prep = \
        struct.unpack_from(">iiiiiqqiq8sq8siq", raw)
    assert (total, magic & 0xFFFFFFFF) == (len(raw), 0xDAA320A7)
    assert crc == record.body_crc(b"hello") and 0 <= crc < 2**31
    assert (qid, flag, qoff, phys, sysflag, recon, prep) == (3, 7, 42, 4096, 0, 2, 0)
    assert (born, store) == (1_700_000_000_000, 1_700_000_000_123)
    assert record.host_str(born_host) == "192.168.0.9:5555" and record.host_str(store_host) == "10.1.2.3:10911"
    (blen,) = struct.unpack_from(">i", raw, 84)
    assert blen == 5 and raw[88:93] == b"hello"
    assert raw[93] == 6 and raw[94:100] == b"orders"
    assert struct.unpack_from(">h", raw, 100)[0] == 10 and raw[102:] == b"TAGS\x01paid\x02"


def test_decode_round_trip() -> None:
    raw = encode(body=b"\x00\xffbinary")
    m = record.decode(raw)
    assert m.body == b"\x00\xffbinary" and m.topic == "orders" and m.tags == "paid"
    assert (m.queue_id, m.queue_offset, m.physical_offset, m.flag, m.reconsume_times) == (3, 42, 4096, 7, 2)
    assert m.size == len(raw) and m.body_crc == record.body_crc(m.body)
    assert m.msg_id == offset_msg_id(HOST, 4096) and parse_offset_msg_id(m.msg_id) == 4096
    assert record.check_record(raw, 0, 4096) == len(raw)
    size, qid, qoff, ts, topic, props, sysflag = record.dispatch_fields(raw, 0)
    assert (size, qid, qoff, ts, topic, props, sysflag) == (len(raw), 3, 42, 1_700_000_000_123, "orders",
                                                           b"TAGS\x01paid\x02", 0)


def test_decode_at_a_position_inside_a_buffer() -> None:
    raw = encode(phys=100)
    buf = b"\x00" * 100 + raw + b"\x00" * 50
    assert record.check_record(buf, 100, 100) == len(raw)
    assert record.decode(buf, 100).body == b"hello"


@pytest.mark.parametrize(
    ("offset", "why"),
    [(5, "bad magic"), (1, "bad total size"), (8, "CRC"), (86, "bad body length"),
     (90, "CRC"), (93, "length"), (101, "bad properties length")],
)
def test_damage_is_reported(offset: int, why: str) -> None:
    raw = bytearray(encode())
    raw[offset] ^= 0x01
    with pytest.raises(record.RecordError, match=why):
        record.check_record(raw, 0)
    with pytest.raises(record.RecordError):
        record.decode(raw)


def test_a_record_at_the_wrong_offset_is_refused() -> None:
    raw = encode(phys=4096)
    with pytest.raises(record.RecordError, match="names offset 4096"):
        record.check_record(raw, 0, 8192)


@pytest.mark.parametrize("cut", [0, 1, 8, 90, 91, 100])
def test_short_buffers_are_refused(cut: int) -> None:
    with pytest.raises(record.RecordError):
        record.check_record(encode()[:cut], 0)


def test_end_of_file_blank_and_corrupt_marker() -> None:
    blank = record.encode_blank(100)
    assert len(blank) == 100 and record.peek_size_magic(blank) == (100, record.BLANK_MAGIC_CODE)
    assert blank[8:] == bytes(92)
    fence = record.encode_corrupt_marker(300)
    assert record.peek_size_magic(fence) == (300, record.CORRUPT_MAGIC_CODE)
    assert record.BLANK_MAGIC_CODE & 0xFFFFFFFF == 0xCBD43194
    for marker in (blank, fence):
        with pytest.raises(record.RecordError, match="magic"):
            record.check_record(marker + bytes(100), 0)


def test_properties_codec() -> None:
    props = {"TAGS": "a", "KEYS": "k1 k2", "ünï": "cödé", "empty": ""}
    raw = encode_properties(props)
    assert raw == "TAGS\x01a\x02KEYS\x01k1 k2\x02ünï\x01cödé\x02empty\x01\x02".encode()
    assert decode_properties(raw) == props
    assert encode_properties({}) == b"" and decode_properties(b"") == {}
    with pytest.raises(FerryError) as err:
        encode_properties({"k": "a\x02b"})
    assert err.value.code == "MESSAGE_ILLEGAL"
    at_limit = {"k": "v" * (PROPERTIES_MAX_LENGTH - 3)}
    assert len(encode_properties(at_limit)) == PROPERTIES_MAX_LENGTH
    with pytest.raises(FerryError) as err:
        encode_properties({"k": "v" * (PROPERTIES_MAX_LENGTH - 2)})
    assert err.value.code == "PROPERTIES_SIZE_EXCEEDED"


def test_tags_hash_is_javas_string_hash_code() -> None:
    assert tags_hash(None) == 0 and tags_hash("") == 0
    assert tags_hash("hello") == 99162322
    assert tags_hash("TagA") == 2598919
    assert tags_hash("polygenelubricants") == -(2**31)  # Java's famous Integer.MIN_VALUE hash
    assert tags_hash("€") == 8364


def test_tag_filter_expressions() -> None:
    assert split_tag_filter(None) is None and split_tag_filter("*") is None and split_tag_filter(" ") is None
    assert split_tag_filter("a || b||c") == frozenset({"a", "b", "c"})


def test_message_ids() -> None:
    msg_id = offset_msg_id(HOST, 2**40 + 5)
    assert len(msg_id) == 32 and msg_id == msg_id.upper()
    assert parse_offset_msg_id(msg_id) == 2**40 + 5
    for bad in ("xyz", "00", "Z" * 32):
        with pytest.raises(FerryError):
            parse_offset_msg_id(bad)
