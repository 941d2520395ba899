"""The TCP frame codec: round trips, byte-at-a-time feeding, and fuzzed input that must either decode
or raise FrameError — never anything else, never hang."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrymq.broker.protocol.request_codes import CODE_NAMES, RESPONSE_CODES, response_code
from ferrymq.broker.protocol.tcp_codec import (
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    Command,
    FrameDecoder,
    FrameError,
    encode_frame,
)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
                    st.binary(max_size=20))


@given(code=st.integers(0, 2**31), opaque=st.integers(0, 2**32), flags=st.sampled_from([0, 1, 2, 3]),
       ext=st.dictionaries(st.text(max_size=10), scalars, max_size=6), remark=st.none() | st.text(max_size=40),
       body=st.binary(max_size=300))
@settings(max_examples=200, deadline=None)
def test_round_trip(code: int, opaque: int, flags: int, ext: dict, remark: str | None, body: bytes) -> None:
    frame = encode_frame(code, opaque, flags, ext, remark, body)
    (cmd,) = FrameDecoder().feed(frame)
    assert cmd == Command(code, opaque, flags, ext, remark, body)


def test_frames_split_anywhere_and_coalesced() -> None:
    frames = [encode_frame(10, i, 0, {"topic": "t", "i": i}, None, bytes([i]) * i) for i in range(20)]
    stream = b"".join(frames)
    dec = FrameDecoder()
    out: list[Command] = []
    for i in range(0, len(stream), 7):
        out += dec.feed(stream[i:i + 7])
    assert [c.opaque for c in out] == list(range(20))
    assert [c.body for c in out] == [bytes([i]) * i for i in range(20)]
    assert FrameDecoder().feed(stream) == out
    assert not dec.buf


@given(sizes=st.lists(st.sampled_from([0, 1, 1000, 300_000, 700_000]), min_size=1, max_size=5),
       cuts=st.lists(st.sampled_from([1, 7, 4096, 65536, 250_000, 1 << 20]), min_size=1, max_size=8))
@settings(max_examples=60, deadline=None)
def test_large_frames_in_any_pieces(sizes: list[int], cuts: list[int]) -> None:
    # Frames past 256 KiB are gathered piece by piece and joined once; small ones go through the buffer.
    bodies = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    stream = b"".join(encode_frame(11, i, FLAG_RESPONSE, {"i": i}, None, b) for i, b in enumerate(bodies))
    dec = FrameDecoder()
    out: list[Command] = []
    pos = k = 0
    while pos < len(stream):
        step = cuts[k % len(cuts)]
        out += dec.feed(stream[pos:pos + step])
        pos, k = pos + step, k + 1
    assert [(c.opaque, c.ext, c.body) for c in out] == [(i, {"i": i}, b) for i, b in enumerate(bodies)]
    assert not dec.buf and not dec.chunks and not dec.need


def test_flags() -> None:
    (c,) = FrameDecoder().feed(encode_frame(1, 2, FLAG_RESPONSE | FLAG_ONEWAY))
    assert c.is_response and c.is_oneway and c.ext == {} and c.body == b""


@pytest.mark.parametrize("raw, why", [
    (struct.pack(">II", 2, 0), "frame length"),
    (struct.pack(">II", 70 * 1024 * 1024, 0), "frame length"),
    (struct.pack(">II", 10, 20) + bytes(6), "header length"),
    (struct.pack(">II", 5, 1) + b"\xc1", "msgpack"),
    (struct.pack(">II", 5, 1) + b"\x90", "array"),
    (struct.pack(">II", 4, 0), "msgpack"),
])
def test_bad_frames_raise_frame_error(raw: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        FrameDecoder().feed(raw)


@pytest.mark.parametrize("header", [
    ["x", 1, 0, None, None], [1, 1.5, 0, None, None], [1, 1, True, None, None], [1, 1, 0, [1], None],
    [1, 1, 0, {1: 2}, None], [1, 1, 0, None, 5], {"code": 1},
])
def test_bad_headers(header: object) -> None:
    h = msgpack.packb(header, use_bin_type=True, strict_types=False)
    with pytest.raises(FrameError):
        FrameDecoder().feed(struct.pack(">II", 4 + len(h), len(h)) + h)


@given(st.binary(max_size=400))
@settings(max_examples=500, deadline=None)
def test_fuzzed_bytes_decode_or_frame_error(data: bytes) -> None:
    try:
        for cmd in FrameDecoder(max_frame=1 << 20).feed(data):
            assert isinstance(cmd.ext, dict)
    except FrameError:
        pass


def test_response_codes_round_trip() -> None:
    for name, num in RESPONSE_CODES.items():
        assert response_code(name) == num
        assert num in CODE_NAMES
    assert response_code("SOMETHING_NEW") == RESPONSE_CODES["SYSTEM_ERROR"]
