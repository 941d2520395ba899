"""The machine's ceilings, measured in the same run as the peers: raw durable disk bandwidth
(bench/disk.py) and raw TCP over 127.0.0.1 (bulk throughput, and a 1 KiB request / 8-byte reply round
trip: the floor under any broker's awaited-send latency).

The loopback peer runs in a forked child so the two ends get a core each, as a broker and its client do.

Run alone: ``python -m bench.peers.limits``.
"""

from __future__ import annotations

import multiprocessing
import socket
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.disk import DiskFigures, describe, measure
from bench.peers.workload import percentile

CHUNK = 1 << 20
REQUEST = 1024
REPLY = 8


@dataclass
class LoopbackFigures:
    mb_s: float  # median of the rounds, 10^6 bytes/s
    rounds_mb_s: list[float]
    rtt_p50_ms: float
    rtt_p99_ms: float
    definition: str = ("bulk: sendall of 1 MiB chunks to a reader in another process over one 127.0.0.1 TCP "
                       "connection; rtt: 1 KiB request, 8-byte reply, TCP_NODELAY")

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def _sink(listener: socket.socket) -> None:
    """Child: first connection is bulk (read until EOF), the second is ping-pong."""
    conn, _ = listener.accept()
    with conn:
        while conn.recv(CHUNK):
            pass
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with conn:
        reply = b"x" * REPLY
        while True:
            try:
                _recv_exact(conn, REQUEST)
            except ConnectionError:
                return
            conn.sendall(reply)


def bulk_mb_s(port: int, seconds: float) -> float:
    data = b"\0" * CHUNK
    with socket.create_connection(("127.0.0.1", port)) as s:
        sent = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            s.sendall(data)
            sent += CHUNK
        s.shutdown(socket.SHUT_WR)
        s.recv(1)  # returns at EOF, once the reader has drained everything
        return sent / (time.perf_counter() - t0) / 1e6


def round_trips(port: int, count: int) -> list[float]:
    req = b"r" * REQUEST
    times = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            t = time.perf_counter()
            s.sendall(req)
            _recv_exact(s, REPLY)
            times.append(time.perf_counter() - t)
    return sorted(times)


def loopback(rounds: int = 3, seconds: float = 1.0, pings: int = 2000) -> LoopbackFigures:
    results = []
    rtts: list[float] = []
    for i in range(rounds):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(2)
        child = multiprocessing.get_context("fork").Process(target=_sink, args=(listener,), daemon=True)
        child.start()
        try:
            port = listener.getsockname()[1]
            results.append(bulk_mb_s(port, seconds))
            rt = round_trips(port, pings if i == 0 else 0)
            rtts = rtts or rt
        finally:
            listener.close()
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
    return LoopbackFigures(mb_s=statistics.median(results), rounds_mb_s=[round(r, 1) for r in results],
                           rtt_p50_ms=percentile(rtts, 0.5) * 1000, rtt_p99_ms=percentile(rtts, 0.99) * 1000)


def describe_loopback(fig: LoopbackFigures) -> str:
    spread = "/".join(f"{r:.0f}" for r in fig.rounds_mb_s)
    return (f"loopback TCP = {fig.mb_s:.0f} MB/s (rounds {spread}; ≈ {fig.mb_s * 1e6 / 1024 / 1000:.0f} k x 1 KiB/s); "
            f"1 KiB round trip p50 {fig.rtt_p50_ms:.3f} ms, p99 {fig.rtt_p99_ms:.3f} ms")


def disk(directory: Path) -> DiskFigures:
    with tempfile.TemporaryDirectory(prefix="peers-disk-", dir=directory) as d:
        return measure(Path(d))


def main() -> None:
    print(describe(disk(Path(tempfile.gettempdir()))))
    print(describe_loopback(loopback()))


if __name__ == "__main__":
    main()
