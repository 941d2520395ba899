"""Fault injection for crash tests, in the spirit of etcd's gofail: ``FERRYMQ_FAILPOINTS=name=sleep(ms);...``.

A named point in the code may be told to stall, which lets a test kill the process at exactly that step (for
instance between deciding an election and persisting it). Unset — the normal case — every point is a no-op.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re

log = logging.getLogger(__name__)
ENV = "FERRYMQ_FAILPOINTS"
_SPEC = re.compile(r"^\s*([\w.]+)\s*=\s*sleep\((\d+)\)\s*$")


def parse(spec: str) -> dict[str, int]:
    """``"a.b=sleep(100); c=sleep(5)"`` -> ``{"a.b": 100, "c": 5}``; anything else is a configuration error."""
    points: dict[str, int] = {}
    for part in filter(str.strip, spec.split(";")):
        m = _SPEC.match(part)
        if not m:
            raise ValueError(f"{ENV}: cannot parse {part.strip()!r}; expected name=sleep(ms)")
        points[m.group(1)] = int(m.group(2))
    return points


_points = parse(os.environ.get(ENV, ""))


async def failpoint(name: str) -> None:
    delay_ms = _points.get(name)
    if delay_ms:
        log.warning("failpoint %s: stalling %d ms", name, delay_ms)
        await asyncio.sleep(delay_ms / 1000)
