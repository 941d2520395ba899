"""Pure helpers of the peer benchmark (bench/peers): no servers are started here."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.peers.__main__ import ALL_KEYS, parse_args, run_server, selected
from bench.peers.nats_peer import config_text
from bench.peers.procs import alive, cpu_seconds, process_tree, stop_tree
from bench.peers.report import Outcome, comparisons, fmt_rounds, ratio, text_table
from bench.peers.server import PeerServer, System
from bench.peers.workload import SEQ_DIGITS, check_sequence, make_bodies, percentile


def test_bodies_are_numbered_text_of_the_asked_size() -> None:
    bodies = make_bodies(3, 1024, first=7)
    assert [len(b) for b in bodies] == [1024] * 3
    assert [int(b[:SEQ_DIGITS]) for b in bodies] == [7, 8, 9]
    assert bodies[0].decode("ascii")[SEQ_DIGITS:] == bodies[2].decode("ascii")[SEQ_DIGITS:]
    with pytest.raises(ValueError):
        make_bodies(1, SEQ_DIGITS - 1)


def test_sequence_check_catches_loss_and_duplicates() -> None:
    seen = [b[:SEQ_DIGITS] for b in make_bodies(5, 64)]
    check_sequence(list(reversed(seen)), 5)  # order across queues does not matter
    with pytest.raises(RuntimeError, match="consumed 4"):
        check_sequence(seen[:4], 5)
    with pytest.raises(RuntimeError, match="exactly once"):
        check_sequence([*seen[:4], seen[0]], 5)


def test_percentile_is_nearest_rank() -> None:
    xs = [float(i) for i in range(1, 101)]
    assert percentile(xs, 0.5) == 50.0
    assert percentile(xs, 0.99) == 99.0
    assert percentile([3.0], 0.99) == 3.0


def test_peer_selection_takes_keys_and_prefixes() -> None:
    assert selected(ALL_KEYS, ["redis"]) == ["redis-always", "redis-everysec"]
    assert selected(ALL_KEYS, ["ferrymq-sync"]) == ["ferrymq-sync-tcp", "ferrymq-sync-http"]
    assert selected(ALL_KEYS, ["nats-file", "rabbitmq"]) == ["nats-file", "rabbitmq-quorum"]
    assert selected(ALL_KEYS, ["red"]) == []  # a prefix ends at a dash: no accidental matches
    assert parse_args(["--peers", "redis-always", "--messages", "10"]).keys == ["redis-always"]
    with pytest.raises(SystemExit):
        parse_args(["--workloads", "produce,bogus"])


def test_nats_config_states_the_sync_setting_only_when_asked(tmp_path: Path) -> None:
    assert "sync_interval: always" in config_text(4222, tmp_path, True)
    plain = config_text(4222, tmp_path, False)
    assert "sync_interval" not in plain and "listen: 127.0.0.1:4222" in plain and str(tmp_path) in plain


def _outcome(key: str, fsync: bool, ferry: bool, produce: list[float], p50: list[float]) -> Outcome:
    o = Outcome(System(key, key.upper(), "d", fsync, "m", is_ferrymq=ferry))
    for pr, la in zip(produce, p50, strict=True):
        o.rounds.append({"produce": {"msgs_per_s": pr}, "latency": {"p50_ms": la, "p99_ms": la * 2},
                         "produce_mode": "x", "consume_mode": "y"})
    return o


def test_ratios_only_against_equal_or_stronger_durability() -> None:
    peer_fsync = _outcome("peer-a", True, False, [100, 300], [2.0, 2.0])
    peer_lazy = _outcome("peer-b", False, False, [400, 400], [0.5, 0.5])
    sync = _outcome("ferrymq-sync-tcp", True, True, [400, 400], [1.0, 1.0])
    lazy = _outcome("ferrymq-async-tcp", False, True, [800, 800], [0.25, 0.25])
    rows = comparisons([peer_fsync, peer_lazy, sync, lazy])
    pairs = {(r["peer"], r["ferrymq"]): r for r in rows}
    assert set(pairs) == {("peer-a", "ferrymq-sync-tcp"), ("peer-b", "ferrymq-sync-tcp"),
                          ("peer-b", "ferrymq-async-tcp")}  # ASYNC_FLUSH never stands against an fsync'ing peer
    a = pairs[("peer-a", "ferrymq-sync-tcp")]
    assert a["ratios"]["produce.msgs_per_s"] == 2.0  # 400 / mean(100, 300)
    assert a["ratios"]["latency.p50_ms"] == 2.0  # peer 2 ms / FerryMQ 1 ms
    assert a["ratios"]["consume.msgs_per_s"] is None and a["beats_all"] is True
    assert pairs[("peer-b", "ferrymq-sync-tcp")]["beats_all"] is False
    assert pairs[("peer-b", "ferrymq-sync-tcp")]["durability"] == "FerryMQ stronger"
    assert ratio(None, 1.0, True) is None and ratio(1.0, 0.0, True) is None
    table = text_table([peer_fsync, sync], None, None, {"messages": 10, "rounds": 2, "body_size": 8,
                                                         "latency_sends": 5})
    assert "100 / 300" in table and "2.00x" in table
    assert fmt_rounds([1234.0, 0.271]) == "1 234 / 0.27"


def test_stop_tree_ends_a_parent_and_its_children() -> None:
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                               "'import time; time.sleep(60)']); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while len(process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(parent.pid)
        assert len(tree) == 2 and tree[0] == parent.pid
        assert cpu_seconds(tree) >= 0
        stop_tree(parent, grace=5)
        assert parent.returncode is not None
        assert not any(alive(pid) for pid in tree)  # zombies awaiting their reaper count as ended
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


class _NeverStarts(PeerServer):
    name = "never"

    def start(self) -> None:
        self.workdir.mkdir(parents=True)
        raise RuntimeError("no such binary")

    def systems(self) -> list[System]:
        return []


def test_a_server_that_fails_to_start_is_reported_and_cleaned_up(tmp_path: Path) -> None:
    server = _NeverStarts(tmp_path / "never")
    outcomes = run_server(server, ["ferrymq-sync-tcp", "redis-always"], parse_args(["--rounds", "1"]))
    assert [o.system.key for o in outcomes] == ["ferrymq-sync-tcp", "redis-always"]
    assert all(o.errors == ["server: no such binary"] and not o.rounds for o in outcomes)
    assert outcomes[0].system.is_ferrymq and not outcomes[1].system.is_ferrymq
    assert not server.workdir.exists()  # stop() ran and removed the data directory
