"""ConsumeQueue.put_many (the dispatcher's batched write) leaves exactly what one put per entry leaves."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferrymq.broker.store.consume_queue import ConsumeQueue


def entries_of(cq: ConsumeQueue) -> list[tuple[int, int, int, int]]:
    return list(cq.entries(cq.min_offset, cq.max_offset - cq.min_offset))


@pytest.mark.parametrize("start", [0, 5, 16, 37])
def test_put_many_matches_put_across_segment_boundaries(tmp_path: Path, start: int) -> None:
    one = ConsumeQueue(tmp_path / "one", "t", 0, entries_per_file=16)
    many = ConsumeQueue(tmp_path / "many", "t", 0, entries_per_file=16)
    one.load()
    many.load()
    batches = [[(1000 * (start + i), 100 + i, i - 3) for i in range(n)] for n in (1, 7, 20, 3, 40)]
    offset = start
    for batch in batches:
        for i, (phys, size, code) in enumerate(batch):
            one.put(offset + i, phys, size, code)
        many.put_many(offset, batch)
        offset += len(batch)
    assert (many.min_offset, many.max_offset) == (one.min_offset, one.max_offset) == (start, offset)
    expected = entries_of(one)
    assert entries_of(many) == expected
    assert many.max_physical_end == one.max_physical_end
    assert [s.base for s in many.files.segments] == [s.base for s in one.files.segments]
    # Reloaded from disk, the files say the same (the minimum of a queue that starts mid-segment
    # comes from the commit log on load, so only the end is compared).
    for cq in (one, many):
        cq.files.flush()
        cq.close()
    again = ConsumeQueue(tmp_path / "many", "t", 0, entries_per_file=16)
    again.load()
    assert again.max_offset == offset
    assert list(again.entries(start, offset - start)) == expected
    again.close()
