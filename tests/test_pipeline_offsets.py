"""Offset planning and option parsing of the Spark data source: pure functions, no Spark, no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.pipeline.offsets import (
    EARLIEST,
    LATEST,
    OffsetOptionError,
    QueueKey,
    QueueRange,
    cap,
    from_json,
    parse_spec,
    plan_ranges,
    resolve,
    split,
    to_json,
)
from ferrymq.pipeline.options import PipelineOptionError, ReadOptions, WriteOptions, parse

Q0 = QueueKey("orders", "standalone", 0)
Q1 = QueueKey("orders", "standalone", 1)
Q2 = QueueKey("orders", "g2", 0)
BOUNDS = {Q0: (5, 100), Q1: (0, 40), Q2: (0, 0)}


def test_words_resolve_to_queue_bounds() -> None:
    assert resolve(parse_spec("earliest", "latest", "startingOffsets"), BOUNDS) == {Q0: 5, Q1: 0, Q2: 0}
    assert resolve(parse_spec("LATEST", "earliest", "startingOffsets"), BOUNDS) == {Q0: 100, Q1: 40, Q2: 0}
    assert resolve(parse_spec(None, "earliest", "startingOffsets"), BOUNDS) == {Q0: 5, Q1: 0, Q2: 0}


def test_json_spec_uses_sentinels_and_default_for_unnamed_queues() -> None:
    spec = parse_spec('{"orders": {"standalone": {"0": 10, "1": -2}}}', "latest", "startingOffsets")
    assert spec.explicit == {Q0: 10, Q1: EARLIEST}
    assert resolve(spec, BOUNDS) == {Q0: 10, Q1: 0, Q2: 0}
    spec = parse_spec('{"orders": {"standalone": {"0": -1}}}', "earliest", "endingOffsets")
    assert spec.explicit == {Q0: LATEST}
    assert resolve(spec, BOUNDS)[Q0] == 100


def test_explicit_offsets_clamp_above_but_not_below() -> None:
    # Past the end: clamped. Below the start: kept, so reading reports the retention gap.
    spec = parse_spec('{"orders": {"standalone": {"0": 1000, "1": 0}}}', "latest", "startingOffsets")
    out = resolve(spec, {Q0: (5, 100), Q1: (3, 9)})
    assert out == {Q0: 100, Q1: 0}


@pytest.mark.parametrize("text, needle", [
    ("soonest", "must be 'earliest', 'latest' or a JSON object"),
    ('["orders"]', "expected a JSON object of topics"),
    ('{"orders": 3}', "must map broker groups"),
    ('{"orders": {"standalone": [1]}}', "must map queue ids"),
    ('{"orders": {"standalone": {"x": 1}}}', "queue id 'x'"),
    ('{"orders": {"standalone": {"0": -3}}}', "must be an integer >= -2"),
    ('{"orders": {"standalone": {"0": true}}}', "must be an integer"),
    ('{"orders": {"standalone": {"0": 1.5}}}', "must be an integer"),
])
def test_bad_offset_options_say_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(OffsetOptionError, match="startingOffsets") as info:
        parse_spec(text, "earliest", "startingOffsets")
    assert needle in str(info.value)


def test_stream_offsets_round_trip_and_reject_sentinels() -> None:
    offsets = {Q0: 7, Q1: 0, Q2: 3}
    j = to_json(offsets)
    assert j == {"orders": {"g2": {"0": 3}, "standalone": {"0": 7, "1": 0}}}
    assert from_json(j) == offsets
    with pytest.raises(OffsetOptionError):
        from_json({"orders": {"standalone": {"0": -2}}})


def test_plan_ranges_skips_empty_and_reads_new_queues_from_zero() -> None:
    start = {Q0: 10, Q1: 40}
    end = {Q0: 20, Q1: 40, Q2: 5}
    assert plan_ranges(start, end) == [QueueRange(Q2, 0, 5), QueueRange(Q0, 10, 20)]
    # a queue whose end went backwards (recreated topic) yields nothing
    assert plan_ranges({Q0: 50}, {Q0: 20}) == []


def test_split_cuts_long_ranges() -> None:
    pieces = split([QueueRange(Q0, 0, 25), QueueRange(Q1, 3, 5)], 10)
    assert [(p.key, p.start, p.end) for p in pieces] == [(Q0, 0, 10), (Q0, 10, 20), (Q0, 20, 25), (Q1, 3, 5)]
    assert split([QueueRange(Q0, 0, 25)], None) == [QueueRange(Q0, 0, 25)]


def test_cap_shares_the_budget_fairly() -> None:
    start = {Q0: 0, Q1: 0, Q2: 0}
    latest = {Q0: 1000, Q1: 3, Q2: 0}
    end = cap(start, latest, 11)
    assert end == {Q0: 8, Q1: 3, Q2: 0}
    assert cap(start, latest, None) == latest
    assert cap(start, latest, 5000) == latest


@given(st.dictionaries(st.integers(0, 7), st.tuples(st.integers(0, 500), st.integers(0, 500)), min_size=1),
       st.integers(1, 400))
def test_cap_never_exceeds_the_limit_nor_the_latest(queues: dict[int, tuple[int, int]], limit: int) -> None:
    start = {QueueKey("t", "g", q): a for q, (a, _b) in queues.items()}
    latest = {QueueKey("t", "g", q): a + b for q, (a, b) in queues.items()}
    end = cap(start, latest, limit)
    taken = sum(end[k] - start[k] for k in start)
    assert taken == min(limit, sum(latest[k] - start[k] for k in start))
    assert all(start[k] <= end[k] <= latest[k] for k in start)


def test_read_options_parse_case_insensitively_and_validate() -> None:
    opts = parse(ReadOptions, {"endpoint": "127.0.0.1:8080", "topic": "a, b,a", "maxmessagespertrigger": "50",
                               "FAILONDATALOSS": "false", "checkpointLocation": "/ignored"})
    assert opts.endpoint == "http://127.0.0.1:8080"
    assert opts.topics == ["a", "b"]
    assert opts.maxMessagesPerTrigger == 50
    assert opts.failOnDataLoss is False
    with pytest.raises(PipelineOptionError, match="maxMessagesPerPartition"):
        parse(ReadOptions, {"endpoint": "http://x:1", "topic": "a", "maxMessagesPerPartition": "0"})
    with pytest.raises(PipelineOptionError, match="topic"):
        parse(ReadOptions, {"endpoint": "http://x:1"})
    with pytest.raises(PipelineOptionError, match="may only contain"):
        parse(ReadOptions, {"endpoint": "http://x:1", "topic": "bad topic"})
    with pytest.raises(PipelineOptionError, match="endpoint"):
        parse(WriteOptions, {"topic": "a"})
