"""The peer comparison's output: one text table with every round's figures, a FerryMQ/peer ratio
table, a JSON document (``peers-<time>.json``, copied to ``peers-latest.json``) and a PNG chart
(``peers-latest.png``) under bench/results/.

Ratios are taken on the mean over rounds and always read "> 1 = FerryMQ better": throughput is
FerryMQ / peer, latency is peer ms / FerryMQ ms. A peer is compared only with FerryMQ settings whose
durability is equal or stronger: a peer that fsyncs before acknowledging against SYNC_FLUSH; a peer
that acknowledges before the fsync against ASYNC_FLUSH (equal) and SYNC_FLUSH (stronger).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.disk import DiskFigures, describe
from bench.peers.limits import LoopbackFigures, describe_loopback
from bench.peers.server import System

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
# (workload, figure, higher is better, column title)
METRICS: list[tuple[str, str, bool, str]] = [
    ("produce", "msgs_per_s", True, "produce msgs/s"),
    ("latency", "p50_ms", False, "send p50 ms"),
    ("latency", "p99_ms", False, "send p99 ms"),
    ("consume", "msgs_per_s", True, "consume msgs/s"),
]


@dataclass
class Outcome:
    """Everything measured for one system: its rounds (each the driver's RESULT) and failures."""

    system: System
    rounds: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def values(self, workload: str, figure: str) -> list[float]:
        return [r[workload][figure] for r in self.rounds if figure in r.get(workload, {})]

    def mean(self, workload: str, figure: str) -> float | None:
        vals = self.values(workload, figure)
        return sum(vals) / len(vals) if vals else None


def fmt_value(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}".replace(",", " ")
    if v >= 10:
        return f"{v:.0f}"
    return f"{v:.2f}"


def fmt_rounds(vals: list[float]) -> str:
    return " / ".join(fmt_value(v) for v in vals) if vals else "-"


def ratio(ferry: float | None, peer: float | None, higher_better: bool) -> float | None:
    if ferry is None or peer is None or ferry <= 0 or peer <= 0:
        return None
    return ferry / peer if higher_better else peer / ferry


def comparisons(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """For every peer, every FerryMQ system at equal or stronger durability, with the four ratios."""
    ferry = [o for o in outcomes if o.system.is_ferrymq and o.rounds]
    rows = []
    for peer in (o for o in outcomes if not o.system.is_ferrymq and o.rounds):
        for f in ferry:
            if peer.system.fsync_before_ack and not f.system.fsync_before_ack:
                continue  # weaker durability: not a fair comparison
            ratios = {f"{w}.{fig}": ratio(f.mean(w, fig), peer.mean(w, fig), hb) for w, fig, hb, _ in METRICS}
            known = [r for r in ratios.values() if r is not None]
            rows.append({"peer": peer.system.key, "ferrymq": f.system.key,
                         "durability": "equal" if peer.system.fsync_before_ack == f.system.fsync_before_ack
                         else "FerryMQ stronger",
                         "ratios": {k: None if v is None else round(v, 3) for k, v in ratios.items()},
                         "beats_all": bool(known) and all(r > 1 for r in known)})
    return rows


def text_table(outcomes: list[Outcome], disk: DiskFigures | None, lo: LoopbackFigures | None,
               settings: dict[str, Any]) -> str:
    n, rounds = settings["messages"], settings["rounds"]
    lines = [f"FerryMQ vs peers: {n:,} x {settings['body_size']} B produce/consume, {settings['latency_sends']:,} "
             f"awaited sends; every figure per round (r1 / r2 ...), {rounds} rounds",
             f"machine: {os.cpu_count()} cores, load average {load_average()}"]
    if disk is not None:
        lines.append("disk: " + describe(disk))
    if lo is not None:
        lines.append(describe_loopback(lo))
    name_w = max([len(o.system.label) for o in outcomes] + [6])
    dur_w = max([len(o.system.durability) for o in outcomes] + [10])
    head = (f"{'system':<{name_w}}  {'durability':<{dur_w}}  {'fsync before ack':<16}  "
            + "  ".join(f"{title:<21}" for *_, title in METRICS) + "  produce x raw disk")
    lines += ["", head, "-" * len(head)]
    for o in outcomes:
        cells = [f"{fmt_rounds(o.values(w, fig)):<21}" for w, fig, _, _ in METRICS]
        produce = o.mean("produce", "msgs_per_s")
        x_raw = (f"{produce * settings['body_size'] / 1e6 / disk.raw_mb_s:.2f}"
                 if produce and disk is not None else "-")
        lines.append(f"{o.system.label:<{name_w}}  {o.system.durability:<{dur_w}}  "
                     f"{'yes' if o.system.fsync_before_ack else 'no':<16}  " + "  ".join(cells) + f"  {x_raw}")
        for err in o.errors:
            lines.append(f"{'':<{name_w}}  FAILED: {err[:300]}")
    lines += ["", "how each client sends and consumes:"]
    for o in outcomes:
        if o.rounds:
            lines.append(f"  {o.system.key}: produce {o.rounds[0].get('produce_mode')}; "
                         f"consume {o.rounds[0].get('consume_mode')}")
    lines += ["", "CPU time per message, mean of rounds, in us: client process + server processes (steadier than "
                  "wall time when other work shares the machine)",
              f"{'system':<{name_w}}  " + "  ".join(f"{w:>17}" for w in ("produce", "latency", "consume"))]
    for o in outcomes:
        if o.rounds:
            cells = []
            for w in ("produce", "latency", "consume"):
                cli, srv = o.mean(w, "client_cpu_us_per_msg"), o.mean(w, "server_cpu_us_per_msg")
                cells.append(f"{'-' if cli is None or srv is None else f'{cli:.1f} + {srv:.1f}':>17}")
            lines.append(f"{o.system.label:<{name_w}}  " + "  ".join(cells))
    comp = comparisons(outcomes)
    if comp:
        labels = {o.system.key: o.system.label for o in outcomes}
        lines += ["", "FerryMQ / peer, mean of rounds (> 1 = FerryMQ better; latency: peer ms / FerryMQ ms); "
                      "only FerryMQ settings at equal or stronger durability"]
        pw = max(len(labels[c["peer"]]) for c in comp)
        fw = max(len(labels[c["ferrymq"]]) for c in comp)
        head = (f"{'peer':<{pw}}  {'FerryMQ':<{fw}}  {'durability':<16}  "
                + "  ".join(f"{title:>14}" for *_, title in METRICS) + "  beats it on all")
        lines += [head, "-" * len(head)]
        for c in comp:
            cells = []
            for w, fig, _, _ in METRICS:
                r = c["ratios"][f"{w}.{fig}"]
                cells.append(f"{'-' if r is None else f'{r:.2f}x':>14}")
            lines.append(f"{labels[c['peer']]:<{pw}}  {labels[c['ferrymq']]:<{fw}}  {c['durability']:<16}  "
                         + "  ".join(cells) + f"  {'yes' if c['beats_all'] else 'NO'}")
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def document(outcomes: list[Outcome], disk: DiskFigures | None, lo: LoopbackFigures | None,
             settings: dict[str, Any], seconds: float) -> dict[str, Any]:
    return {
        "kind": "peers",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "run_seconds": round(seconds, 1),
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
                    "load_average": load_average()},
        "disk": disk.to_json() if disk else None,
        "loopback": lo.to_json() if lo else None,
        "settings": settings,
        "systems": [{**asdict(o.system), "target": {k: v for k, v in o.system.target.items() if k != "server_pids"},
                     "rounds": o.rounds, "errors": o.errors} for o in outcomes],
        "comparisons": comparisons(outcomes),
    }


def chart(outcomes: list[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [o for o in outcomes if o.rounds]
    fig, grid = plt.subplots(2, 2, figsize=(15, 0.7 * len(shown) + 3.5), sharey=True)
    names = [o.system.label for o in shown]
    for ax, (w, figure, higher_better, col) in zip(grid.flat, METRICS, strict=True):
        for y, o in enumerate(shown):
            vals = o.values(w, figure)
            colour = "#1f77b4" if o.system.is_ferrymq else "#999999"
            hatch = "" if o.system.fsync_before_ack else "//"
            mean = sum(vals) / len(vals) if vals else 0.0
            ax.barh(y, mean, color=colour, hatch=hatch, edgecolor="black", linewidth=0.4)
            ax.plot(vals, [y] * len(vals), "k|", markersize=10)
        ax.set_title(f"{col} ({'higher' if higher_better else 'lower'} is better)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    for ax in grid[:, 0]:
        ax.set_yticks(range(len(names)), names, fontsize=8)
    grid[0, 0].invert_yaxis()
    fig.suptitle(f"{title}\nblue: FerryMQ; hatched: acks before fsync; bar = mean, ticks = rounds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(outcomes: list[Outcome], disk: DiskFigures | None, lo: LoopbackFigures | None,
          settings: dict[str, Any], seconds: float, table: str, *, full: bool = True) -> tuple[Path, Path]:
    """``full``: the complete default comparison. Other (quick) runs are written as ``peers-partial-*``
    so they never replace the last full result."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    kind = "peers" if full else "peers-partial"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    doc = document(outcomes, disk, lo, settings, seconds)
    doc["kind"] = kind
    doc["table"] = table
    text = json.dumps(doc, indent=2) + "\n"
    json_path = RESULTS_DIR / f"{kind}-{stamp}.json"
    json_path.write_text(text)
    (RESULTS_DIR / f"{kind}-latest.json").write_text(text)
    png = RESULTS_DIR / f"{kind}-latest.png"  # one chart, not one per run: the JSON keeps every figure
    chart(outcomes, png, f"FerryMQ vs peers, {settings['messages']:,} x {settings['body_size']} B, "
                         f"{os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}")
    return json_path, png
