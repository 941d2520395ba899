"""The pyproject package list must name every package folder, and no top-level `operator` may exist."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([pkg, *rel.parts]) if rel.parts else pkg)
    assert found == listed


def test_operator_does_not_shadow_stdlib() -> None:
    import operator

    import ferrymq.operator

    assert hasattr(operator, "itemgetter")
    assert ferrymq.operator.__name__ == "ferrymq.operator"
