"""Shared test fixtures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


def pytest_collection_modifyitems(items):
    """Mark tests by directory: tests/lab/ needs the podman lab, tests/molecule/ runs molecule
    scenarios; `-m "not lab and not molecule"` leaves the fast tests."""
    for item in items:
        parents = Path(item.fspath).parents
        for marker in ("lab", "molecule"):
            if REPO / "tests" / marker in parents:
                item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture(scope="session")
def tool():
    """Path of a console script installed next to the running Python (the project's venv)."""
    return lambda name: str(Path(sys.executable).parent / name)
