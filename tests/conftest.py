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
    """Everything under tests/lab/ needs the podman lab: mark it so `-m "not lab"` skips it."""
    lab_dir = REPO / "tests" / "lab"
    for item in items:
        if lab_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def tool():
    """Path of a console script installed next to the running Python (the project's venv)."""
    return lambda name: str(Path(sys.executable).parent / name)
