"""Benchmark results: one row per scenario, printed as a table and written as JSON to bench/results/.

Every throughput is also given as a ratio of the raw disk figure (bench/disk.py): the payload bytes
moved per second (messages/s x body size) over the raw fdatasync'd sequential-write bandwidth.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.disk import DiskFigures, describe

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(q * len(sorted_values)) - 1))
    return sorted_values[k]


@dataclass
class Row:
    name: str
    msgs: int
    seconds: float
    body_size: int
    latencies_s: list[float] = field(default_factory=list, repr=False)  # per put / request
    target: str = ""  # e.g. ">= 60 % of raw", checked by ``met``
    note: str = ""
    # CPU seconds the measured process(es) used meanwhile: robust against other load on the machine.
    cpu_s: float | None = None

    @property
    def msgs_per_s(self) -> float:
        return self.msgs / self.seconds if self.seconds > 0 else 0.0

    @property
    def payload_mb_s(self) -> float:
        return self.msgs_per_s * self.body_size / 1e6

    @property
    def cpu_us_per_msg(self) -> float | None:
        return self.cpu_s / self.msgs * 1e6 if self.cpu_s is not None and self.msgs else None

    def ratio(self, disk: DiskFigures) -> float:
        return self.payload_mb_s / disk.raw_mb_s

    def latency_ms(self, q: float) -> float:
        return percentile(sorted(self.latencies_s), q) * 1000

    def to_json(self, disk: DiskFigures) -> dict[str, object]:
        out = asdict(self)
        del out["latencies_s"]
        out.update(msgs_per_s=round(self.msgs_per_s, 1), payload_mb_s=round(self.payload_mb_s, 2),
                   ratio_of_raw=round(self.ratio(disk), 4), p50_ms=round(self.latency_ms(0.50), 3),
                   p99_ms=round(self.latency_ms(0.99), 3), samples=len(self.latencies_s),
                   cpu_us_per_msg=None if self.cpu_us_per_msg is None else round(self.cpu_us_per_msg, 2),
                   target_met=met(self, disk))
        return out


def met(row: Row, disk: DiskFigures) -> bool | None:
    """Targets are written as ">= 60 % of raw" or ">= 30000 msgs/s"."""
    if not row.target:
        return None
    value, unit = row.target.removeprefix(">=").split(None, 1)
    if unit.startswith("%"):
        return row.ratio(disk) * 100 >= float(value)
    return row.msgs_per_s >= float(value)


def table(title: str, rows: list[Row], disk: DiskFigures) -> str:
    head = (f"{'scenario':<44} {'msgs/s':>9} {'MB/s':>7} {'x raw':>6} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'cpu us/msg':>10}  target")
    lines = [title, describe(disk), f"load average {load_average()}",
             "x raw = payload MB/s (msgs/s x body bytes) / raw MB/s; cpu us/msg = CPU time of the measured "
             "process (all its threads) per message", head, "-" * len(head)]
    for r in rows:
        verdict = ""
        if r.target:
            verdict = f"{r.target}: {'MET' if met(r, disk) else 'NOT MET'}"
        lat = (f"{r.latency_ms(0.5):>8.3f} {r.latency_ms(0.99):>8.3f}" if r.latencies_s else f"{'-':>8} {'-':>8}")
        cpu = f"{r.cpu_us_per_msg:>10.1f}" if r.cpu_us_per_msg is not None else f"{'-':>10}"
        lines.append(f"{r.name:<44} {r.msgs_per_s:>9.0f} {r.payload_mb_s:>7.1f} {r.ratio(disk):>6.2f} {lat} {cpu}  "
                     f"{verdict}{'  ' + r.note if r.note else ''}")
    return "\n".join(lines)


def load_average() -> str:
    """Other work on the machine skews every figure; the report says how busy it was."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def write_json(kind: str, rows: list[Row], disk: DiskFigures, settings: dict[str, object]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    doc = {
        "kind": kind,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count(), "load_average": load_average()},
        "disk": disk.to_json(),
        "settings": settings,
        "rows": [r.to_json(disk) for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS_DIR / f"{kind}-latest.json").write_text(json.dumps(doc, indent=2) + "\n")
    return path
