"""Helpers shared by the operator tests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "ferrymq"
MANIFESTS = REPO / "manifests"
K8S_VERSION = "1.30"  # The oldest Kubernetes the manifests must validate against (CEL rules are GA there).


def helm_binary() -> str | None:
    local = REPO / ".venv" / "bin" / "helm"
    if local.exists():
        return str(local)
    return shutil.which("helm")


def run_helm(helm: str, *args: str) -> str:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def load_docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def load_file(path: Path) -> list[dict[str, Any]]:
    return load_docs(path.read_text())
