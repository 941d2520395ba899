from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support import BrokerProcess, kill_all


@pytest.fixture(autouse=True, scope="session")
def _stop_children() -> Iterator[None]:
    yield
    kill_all()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A SYNC_FLUSH standalone broker process on free ports."""
    b = BrokerProcess(tmp_path / "data").start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        b.terminate()
