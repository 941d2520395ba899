"""e2e fixtures: a kind cluster with the FerryMQ image loaded and the chart installed.

Skipped, with the reason, when docker (with a reachable engine), kind, kubectl or helm is missing.
Not collected by the main suite (its testpaths is ["tests"]); run: pytest e2e (see e2e/README.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER = os.environ.get("FERRYMQ_E2E_CLUSTER", "ferrymq-e2e")
IMAGE = os.environ.get("FERRYMQ_E2E_IMAGE", "ferrymq:e2e")
NAMESPACE = "ferrymq-e2e"


def _tool(name: str) -> str | None:
    local = REPO / ".venv" / "bin" / name
    return str(local) if local.exists() else shutil.which(name)


def missing_prerequisite() -> str | None:
    for name in ("docker", "kind", "kubectl", "helm"):
        if _tool(name) is None:
            hint = " (scripts/install-helm.sh)" if name == "helm" else ""
            return f"e2e needs `{name}` on PATH{hint}"
    probe = subprocess.run([_tool("docker") or "docker", "info"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return "e2e needs a running Docker engine (`docker info` failed)"
    return None


def run(*args: str, timeout: float = 600, check: bool = True, stdin: str | None = None) -> str:
    tool = _tool(args[0]) or args[0]
    proc = subprocess.run([tool, *args[1:]], capture_output=True, text=True, timeout=timeout, input=stdin, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


class Kube:
    """kubectl in the e2e namespace."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def __call__(self, *args: str, **kw: Any) -> str:
        return run("kubectl", "--context", f"kind-{CLUSTER}", "-n", self.namespace, *args, **kw)

    def apply(self, manifest: str) -> None:
        self("apply", "-f", "-", stdin=manifest)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return json.loads(self("get", kind, name, "-o", "json"))

    def wait_for(self, what: str, predicate: Any, timeout: float = 300, interval: float = 3) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = predicate()
            except AssertionError as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)
        raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


@pytest.fixture(scope="session")
def kube() -> Iterator[Kube]:
    reason = missing_prerequisite()
    if reason:
        pytest.skip(reason)
    existing = run("kind", "get", "clusters", check=False).split()
    if CLUSTER not in existing:
        run(
            "kind",
            "create",
            "cluster",
            "--name",
            CLUSTER,
            "--config",
            str(REPO / "e2e" / "kind-config.yaml"),
            "--wait",
            "120s",
            timeout=900,
        )
    run("docker", "build", "-t", IMAGE, str(REPO), timeout=1800)
    run("kind", "load", "docker-image", IMAGE, "--name", CLUSTER, timeout=900)
    repo, tag = IMAGE.rsplit(":", 1)
    run(
        "helm",
        "--kube-context",
        f"kind-{CLUSTER}",
        "upgrade",
        "--install",
        "ferrymq",
        str(REPO / "charts" / "ferrymq"),
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        f"image.repository={repo}",
        "--set",
        f"image.tag={tag}",
        "--set",
        "image.pullPolicy=Never",
        timeout=600,
    )
    yield Kube(NAMESPACE)
    if os.environ.get("FERRYMQ_E2E_KEEP") != "1":
        run("kind", "delete", "cluster", "--name", CLUSTER, check=False, timeout=600)
