"""FerryMQ side by side with Redis Streams, NATS JetStream and RabbitMQ, on this machine, in one run.

    .venv/bin/python -m bench.peers                     # everything (installs what is missing; root for apt)
    .venv/bin/python -m bench.peers --peers redis,ferrymq-sync-tcp --messages 20000 --rounds 2   # quick

Steps: install what is missing (bench/peers/install.py), measure the raw disk and loopback limits,
then for every server setting: start it on 127.0.0.1 (free ports, temporary data directory, its own
config), run each round of each system in a child process (bench/peers/workload.py), stop the
server's whole process tree by PID. Prints one table and writes JSON + PNG under bench/results/.
Systems (``--peers`` takes these keys or any prefix of them, comma-separated):
redis-always, redis-everysec, nats-file, rabbitmq-quorum, ferrymq-sync-tcp, ferrymq-sync-http,
ferrymq-async-tcp, ferrymq-async-http.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

from bench.peers.ferrymq_peer import BATCH, INFLIGHT, QUEUES
from bench.peers.report import Outcome, text_table, write
from bench.peers.server import PeerServer, System
from bench.peers.workload import WORKLOADS, Spec

ROOT = Path(__file__).resolve().parents[2]


def server_factories(ferry: dict[str, int] | None = None) -> list[tuple[list[str], Callable[[Path], PeerServer]]]:
    """Each server setting with the system keys it serves (known before it starts); ``ferry`` holds
    FerryMQ's client settings (queues, batch, inflight)."""
    from bench.peers.ferrymq_peer import FerryServer
    from bench.peers.nats_peer import NatsServer
    from bench.peers.rabbit_peer import RabbitServer
    from bench.peers.redis_peer import RedisServer

    return [
        (["redis-always"], lambda d: RedisServer(d / "redis-always", "always")),
        (["redis-everysec"], lambda d: RedisServer(d / "redis-everysec", "everysec")),
        (["nats-file"], lambda d: NatsServer(d / "nats")),
        (["rabbitmq-quorum"], lambda d: RabbitServer(d / "rabbitmq")),
        (["ferrymq-sync-tcp", "ferrymq-sync-http"], lambda d: FerryServer(d / "ferrymq-sync", "sync", **(ferry or {}))),
        (["ferrymq-async-tcp", "ferrymq-async-http"],
         lambda d: FerryServer(d / "ferrymq-async", "async", **(ferry or {}))),
    ]


ALL_KEYS = [k for keys, _ in server_factories() for k in keys]


def selected(keys: list[str], wanted: list[str]) -> list[str]:
    """System keys matching any of the wanted keys or prefixes ("redis" -> both Redis settings)."""
    return [k for k in keys if any(k == w or k.startswith(w.rstrip("-") + "-") for w in wanted)]


def run_driver(system: System, spec: Spec, timeout: float) -> dict[str, object]:
    """One round of one system in its own process; returns its RESULT or raises with its stderr."""
    cmd = [sys.executable, "-m", "bench.peers.workload", "--module", system.module,
           "--target", json.dumps(system.target), "--spec", json.dumps(asdict(spec))]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]
    err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    raise RuntimeError(f"driver exited {proc.returncode}: {err}")


def summary(res: dict[str, Any]) -> str:
    return ", ".join(f"{w} {res[w]['msgs_per_s']:.0f} msgs/s" if w != "latency"
                     else f"p50 {res[w]['p50_ms']:.3f} ms p99 {res[w]['p99_ms']:.3f} ms"
                     for w in WORKLOADS if w in res)


def run_server(server: PeerServer, keys: list[str], args: argparse.Namespace) -> list[Outcome]:
    """Start one server setting, run every round of its selected systems, stop it (always)."""
    print(f"starting {server.name} for {', '.join(keys)} ...", flush=True)
    results: dict[str, Outcome] = {}
    try:
        t0 = time.monotonic()
        server.start()
        print(f"  {server.name} {server.version} ready in {time.monotonic() - t0:.1f} s", flush=True)
        systems = [s for s in server.systems() if s.key in keys]
        results = {s.key: Outcome(s) for s in systems}
        for r in range(1, args.rounds + 1):
            for s in systems:  # interleaved, so a slow spell of the machine hits both protocols
                spec = Spec(messages=args.messages, latency_sends=args.latency_sends, body_size=args.body_size,
                            name=f"bench-{s.key}-r{r}", workloads=args.workload_list)
                try:
                    res = run_driver(s, spec, args.round_timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    results[s.key].errors.append(f"round {r}: {exc}")
                    print(f"  {s.key} round {r}: FAILED {exc}", flush=True)
                    continue
                results[s.key].rounds.append(res)
                print(f"  {s.key} round {r}: {summary(res)}", flush=True)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"  {server.name} FAILED: {exc}", flush=True)
        for k in keys:
            results.setdefault(k, Outcome(System(k, k, "?", False, "", is_ferrymq=k.startswith("ferrymq"))))
            results[k].errors.append(f"server: {exc}")
    finally:
        server.stop()
    return list(results.values())


def stop_on_signals() -> None:
    """SIGTERM/SIGHUP unwind like Ctrl-C, so the ``finally`` that stops the servers runs."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--peers", default="all",
                    help=f"comma-separated system keys or prefixes (default: all): {', '.join(ALL_KEYS)}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: produce,latency,consume")
    ap.add_argument("--messages", type=int, default=200_000, help="messages produced and consumed per round")
    ap.add_argument("--latency-sends", type=int, default=2_000, help="sequential awaited sends per round")
    ap.add_argument("--body-size", type=int, default=1024, help="bytes per message body")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per system (each one a fresh stream/topic)")
    ap.add_argument("--round-timeout", type=float, default=300, help="seconds one round may take before it fails")
    ap.add_argument("--ferrymq-queues", type=int, default=QUEUES, help="queues of each FerryMQ topic")
    ap.add_argument("--ferrymq-batch", type=int, default=BATCH, help="messages per FerryMQ batch (TCP and HTTP)")
    ap.add_argument("--ferrymq-inflight", type=int, default=INFLIGHT, help="FerryMQ batches in flight when producing")
    ap.add_argument("--workdir", help="where data directories go (default: a temporary directory on /tmp)")
    ap.add_argument("--skip-install", action="store_true", help="do not install missing servers/clients")
    ap.add_argument("--skip-limits", action="store_true", help="do not measure the disk and loopback limits")
    ap.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (the workdir) after the run")
    args = ap.parse_args(argv)
    wanted = ALL_KEYS if args.peers == "all" else [p.strip() for p in args.peers.split(",") if p.strip()]
    args.keys = selected(ALL_KEYS, wanted)
    if not args.keys:
        ap.error(f"--peers {args.peers!r} matches none of {', '.join(ALL_KEYS)}")
    args.workload_list = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if bad := [w for w in args.workload_list if w not in WORKLOADS]:
        ap.error(f"unknown workloads {bad}; choose from {', '.join(WORKLOADS)}")
    if min(args.rounds, args.messages, args.latency_sends, args.ferrymq_queues, args.ferrymq_batch,
           args.ferrymq_inflight) < 1:
        ap.error("counts (--rounds, --messages, --latency-sends, --ferrymq-*) must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    stop_on_signals()
    if not args.skip_install:
        from bench.peers.install import ensure

        needs_apt = any(not k.startswith("ferrymq") for k in args.keys)
        print(f"install: {ensure(apt=needs_apt)}", flush=True)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="ferrymq-peers-"))
    workdir.mkdir(parents=True, exist_ok=True)
    disk = lo = None
    if not args.skip_limits:
        from bench.peers.limits import describe_loopback, loopback
        from bench.peers.limits import disk as measure_disk

        disk = measure_disk(workdir)
        lo = loopback()
        print(f"limits: raw disk {disk.raw_mb_s:.0f} MB/s, fsync 4 KiB {disk.fsync_4k_ms:.3f} ms; "
              f"{describe_loopback(lo)}", flush=True)
    settings = {"messages": args.messages, "latency_sends": args.latency_sends, "body_size": args.body_size,
                "rounds": args.rounds, "workloads": args.workload_list, "peers": args.keys,
                "ferrymq": {"queues": args.ferrymq_queues, "batch": args.ferrymq_batch,
                            "inflight": args.ferrymq_inflight}}
    outcomes: list[Outcome] = []
    try:
        ferry = {"queues": args.ferrymq_queues, "batch": args.ferrymq_batch, "inflight": args.ferrymq_inflight}
        for keys, factory in server_factories(ferry):
            mine = [k for k in keys if k in args.keys]
            if not mine:
                continue
            outcomes += run_server(factory(workdir), mine, args)
    finally:
        if args.keep_logs or args.workdir:
            print(f"server logs kept in {workdir}", flush=True)
        else:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.monotonic() - t_start
    table = text_table(outcomes, disk, lo, settings)
    print()
    print(table)
    defaults = parse_args([])
    full = all(getattr(args, k) == getattr(defaults, k) for k in ("keys", "workload_list", "messages",
                                                                  "latency_sends", "body_size"))
    full = full and args.rounds >= defaults.rounds and disk is not None
    json_path, png = write(outcomes, disk, lo, settings, seconds, table, full=full)
    print(f"\nwrote {json_path.relative_to(ROOT)} and {png.relative_to(ROOT)}; whole run {seconds:.0f} s")
    return 0 if all(not o.errors for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
