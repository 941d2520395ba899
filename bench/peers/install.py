"""Install what the peer benchmark needs: the three peer servers from Debian, their Python clients from PyPI.

Idempotent: packages already present are not fetched again, and ``apt-get update`` runs once per run,
only when something is missing. The Debian packages would start system-wide services on install;
the benchmark never uses those (it starts its own instances on free ports with temporary data
directories), so installs happen behind a ``policy-rc.d`` that forbids starting services, and any
service that runs anyway is stopped and disabled afterwards.

Run alone: ``python -m bench.peers.install``. Needs root for apt-get (the pip part goes into the
interpreter's own environment, the project venv when run as documented).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

# Debian package -> the binary the benchmark runs from it.
APT_PACKAGES: dict[str, str] = {
    "redis-server": "redis-server",
    "nats-server": "nats-server",
    "rabbitmq-server": "rabbitmq-server",
}
# pip requirement -> the module it provides.
PIP_PACKAGES: dict[str, str] = {
    "nats-py": "nats",
    "redis[hiredis]": "redis",
    "hiredis": "hiredis",
    "aio-pika": "aio_pika",
}
# System services those packages register; stopped and disabled if they run after the install.
SERVICES = ("redis-server", "nats-server", "rabbitmq-server")
POLICY_RC_D = Path("/usr/sbin/policy-rc.d")
RABBIT_SBIN = Path("/usr/lib/rabbitmq/bin")


def find_binary(name: str) -> str | None:
    """Debian puts rabbitmq-server's real scripts outside PATH for non-root users; look there too."""
    found = shutil.which(name)
    if found:
        return found
    for d in (Path("/usr/sbin"), Path("/usr/lib/rabbitmq/bin"), Path("/usr/local/sbin")):
        if (d / name).exists():
            return str(d / name)
    return None


def missing_apt() -> list[str]:
    return [pkg for pkg, binary in APT_PACKAGES.items() if find_binary(binary) is None]


def missing_pip() -> list[str]:
    return [req for req, module in PIP_PACKAGES.items() if importlib.util.find_spec(module) is None]


@contextlib.contextmanager
def services_forbidden() -> Iterator[None]:
    """Debian's documented way to keep maintainer scripts from starting services: a policy-rc.d
    that exits 101. Only created (and removed again) when the machine has none of its own."""
    if POLICY_RC_D.exists():
        yield
        return
    POLICY_RC_D.write_text("#!/bin/sh\n# bench/peers: no service starts during this install\nexit 101\n")
    POLICY_RC_D.chmod(0o755)
    try:
        yield
    finally:
        POLICY_RC_D.unlink(missing_ok=True)


def run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def install_apt(packages: list[str]) -> None:
    if not packages:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"need root for apt-get install {' '.join(packages)} (or install them yourself)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], env=env)
    with services_forbidden():
        run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], env=env)


def systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir()


def stop_system_services() -> list[str]:
    """Stop and disable the packages' own services, so that only the benchmark's instances run."""
    stopped = []
    for svc in SERVICES:
        if systemd_running():
            active = subprocess.run(["systemctl", "is-active", "--quiet", svc], check=False).returncode == 0
            enabled = subprocess.run(["systemctl", "is-enabled", "--quiet", svc], check=False,
                                     stderr=subprocess.DEVNULL).returncode == 0
            if active or enabled:
                subprocess.run(["systemctl", "disable", "--now", svc], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                stopped.append(svc)
        elif Path(f"/etc/init.d/{svc}").exists():
            status = subprocess.run(["service", svc, "status"], check=False,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
            if status == 0:
                subprocess.run(["service", svc, "stop"], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                stopped.append(svc)
            if shutil.which("update-rc.d"):
                subprocess.run(["update-rc.d", svc, "disable"], check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if stop_idle_system_epmd():
        stopped.append("epmd")
    return stopped


def stop_idle_system_epmd() -> bool:
    """rabbitmq-server's maintainer scripts run Erlang tools, which leave a daemonised epmd on the
    default port behind. The benchmark runs its own epmd on a free port, so an idle system one (no node
    registered) is stopped with epmd's own ``-kill``, which refuses while nodes are registered."""
    epmd = shutil.which("epmd")
    if epmd is None:
        return False
    env = {k: v for k, v in os.environ.items() if k != "ERL_EPMD_PORT"}
    names = subprocess.run([epmd, "-names"], capture_output=True, text=True, check=False, env=env, timeout=10)
    if names.returncode != 0 or "name " in names.stdout:
        return False
    return subprocess.run([epmd, "-kill"], capture_output=True, check=False, env=env, timeout=10).returncode == 0


def install_pip(requirements: list[str]) -> None:
    if requirements:
        run([sys.executable, "-m", "pip", "install", "--quiet", *requirements])


def ensure(apt: bool = True, pip: bool = True) -> dict[str, object]:
    """Install whatever is missing; returns what was done (for the report)."""
    apt_missing = missing_apt() if apt else []
    pip_missing = missing_pip() if pip else []
    install_apt(apt_missing)
    stopped = stop_system_services() if apt else []
    install_pip(pip_missing)
    still = missing_apt() if apt else []
    if still:
        raise SystemExit(f"still missing after install: {', '.join(still)}")
    return {"apt_installed": apt_missing, "pip_installed": pip_missing, "system_services_stopped": stopped}


def main() -> None:
    done = ensure()
    print(f"peer benchmark dependencies ready: {done}")


if __name__ == "__main__":
    main()
