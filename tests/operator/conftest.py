"""Fixtures for the operator tests (no Kubernetes API server, no Docker needed)."""

from __future__ import annotations

import pytest
from k8s_helpers import helm_binary


@pytest.fixture(scope="session")
def helm() -> str:
    path = helm_binary()
    if path is None:
        pytest.skip("helm is not installed: run scripts/install-helm.sh (puts helm into .venv/bin)")
    return path
