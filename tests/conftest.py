"""Shared test fixtures."""

from __future__ import annotations

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
