"""Child-process plumbing for the peer servers: free ports, readiness probes, CPU accounting, and
stopping a whole process tree by PID (never by name: other brokers may run on this machine)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def children_map() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (the process table at this instant)."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses; the fields after the last ')' are fixed.
        fields = stat[stat.rfind(")") + 2:].split()
        out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, parents first."""
    kids = children_map()
    tree, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        tree.append(p)
        todo.extend(kids.get(p, []))
    return tree


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (all their threads), as far as they still run."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rfind(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLK_TCK


def stop_tree(proc: subprocess.Popen[bytes], extra_pids: list[int] | None = None, grace: float = 15.0) -> None:
    """SIGTERM the process and every descendant (collected before signalling: a dying parent
    re-parents its children), wait up to ``grace`` seconds, then SIGKILL whatever is left."""
    pids = process_tree(proc.pid) + list(extra_pids or [])
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if not any(alive(p) for p in pids):
            break
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def wait_until(check: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float, what: str,
               log: Path | None = None) -> None:
    """Poll ``check`` until it holds; fail early (with the log's tail) if the process died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {tail(log)}")
        with contextlib.suppress(OSError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f} s: {tail(log)}")


def tail(log: Path | None, n: int = 2000) -> str:
    if log is None:
        return ""
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, cwd=cwd)
