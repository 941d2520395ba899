"""The data directory's raw durable write bandwidth: the yardstick every benchmark figure is divided by.

Definition (printed with every report): ``pwrite`` of fixed-size blocks, each followed by
``fdatasync``, sequentially into a file that was ``posix_fallocate``'d (and never written) in the
data directory — exactly how the commit log preallocates and syncs its segments. Every round uses a
new file and files are removed only at the end, so each round writes blocks the filesystem has not
just freed: a virtual disk rewrites recently used blocks several times faster than new ones, and a
growing commit log always writes new ones. MB/s is 10^6 bytes
per second. The *raw* figure is the one with 1 MiB blocks, the median of several short rounds (a
shared virtual disk varies by 2x from second to second); 256 KiB blocks and the latency of a 4 KiB
write + fdatasync are reported beside it.

Run alone: ``python -m bench.disk [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MiB = 1 << 20
RAW_BLOCK = MiB
RAW_DEFINITION = ("sequential pwrite of 1 MiB blocks, fdatasync after each, into a posix_fallocate'd "
                  "file in the data directory (as commit-log segments are preallocated)")


@dataclass
class DiskFigures:
    raw_mb_s: float  # the yardstick: 1 MiB blocks, median round
    raw_rounds_mb_s: list[float]
    mb_s_256k: float
    fsync_4k_ms: float  # median latency of one 4 KiB pwrite + fdatasync
    directory: str
    definition: str = RAW_DEFINITION

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def synced_write_mb_s(path: Path, block: int, max_bytes: int = 256 * MiB, max_seconds: float = 2.0) -> float:
    """MB/s of ``block``-sized writes with an fdatasync after each, into a new preallocated file
    (left in place: the caller removes it once every round is done)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.posix_fallocate(fd, 0, max_bytes)
        os.fsync(fd)  # the allocation itself is not part of the measurement
        data = os.urandom(block)
        pos = 0
        t0 = time.perf_counter()
        while pos + block <= max_bytes:
            os.pwrite(fd, data, pos)
            os.fdatasync(fd)
            pos += block
            if time.perf_counter() - t0 >= max_seconds:
                break
        return pos / (time.perf_counter() - t0) / 1e6
    finally:
        os.close(fd)


def fsync_latency_ms(directory: Path, rounds: int = 400) -> float:
    """Median time of a 4 KiB write + fdatasync, appending into a preallocated file."""
    path = directory / "raw-latency"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, rounds * 4096)
        os.fsync(fd)
        data = os.urandom(4096)
        times = []
        for i in range(rounds):
            t0 = time.perf_counter()
            os.pwrite(fd, data, i * 4096)
            os.fdatasync(fd)
            times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2] * 1000
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def rounds_mb_s(directory: Path, block: int, rounds: int) -> list[float]:
    return [synced_write_mb_s(directory / f"raw-{block}-{i}", block, max_bytes=128 * MiB, max_seconds=0.6)
            for i in range(rounds)]


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def measure(directory: Path) -> DiskFigures:
    directory = directory / "raw-disk"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        raw = rounds_mb_s(directory, RAW_BLOCK, 5)
        return DiskFigures(
            raw_mb_s=median(raw),
            raw_rounds_mb_s=[round(r, 1) for r in raw],
            mb_s_256k=median(rounds_mb_s(directory, 256 * 1024, 3)),
            fsync_4k_ms=fsync_latency_ms(directory),
            directory=str(directory.parent),
        )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def describe(fig: DiskFigures) -> str:
    spread = "/".join(f"{r:.0f}" for r in fig.raw_rounds_mb_s)
    return (f"raw = {fig.raw_mb_s:.0f} MB/s, median of rounds {spread} ({fig.definition}); "
            f"256 KiB blocks: {fig.mb_s_256k:.0f} MB/s; 4 KiB write+fdatasync: {fig.fsync_4k_ms:.3f} ms median; "
            f"in {fig.directory}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="directory on the disk to measure (default: a temporary directory)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ferrymq-disk-", dir=args.dir) as d:
        print(describe(measure(Path(d))))


if __name__ == "__main__":
    main()
