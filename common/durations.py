"""Durations as RocketMQ writes them in broker.conf: ``messageDelayLevel = 1s 5s 10s 30s 1m ... 2h``.

A duration is a number followed by a unit: ``ms``, ``s``, ``m``, ``h`` or ``d`` (RocketMQ itself knows
s/m/h/d; ``ms`` is ours, so tests can scale the levels down).
"""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
MAX_DELAY_LEVELS = 64


def parse_duration_ms(text: str) -> int:
    m = _DURATION.match(text.strip().lower())
    if m is None:
        raise ValueError(f"{text!r} is not a duration like 500ms, 10s, 5m, 2h or 1d")
    ms = round(float(m.group(1)) * _UNITS_MS[m.group(2)])
    if ms <= 0:
        raise ValueError(f"duration {text!r} must be positive")
    return ms


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 10s"`` -> ``[1000, 5000, 10000]``: level N (1-based) waits the Nth duration."""
    parts = text.split()
    if not parts:
        raise ValueError("messageDelayLevel needs at least one duration")
    if len(parts) > MAX_DELAY_LEVELS:
        raise ValueError(f"messageDelayLevel has {len(parts)} levels; the limit is {MAX_DELAY_LEVELS}")
    return [parse_duration_ms(p) for p in parts]
