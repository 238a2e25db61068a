"""Shared test fixtures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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


@pytest.fixture(scope="session")
def ansible_plugin():
    """Load one of the repo's Ansible plugins (plugins/<kind>/<name>.py) as a module: they are
    files Ansible loads by path, not a package (plugins/filter/gpuprov.py would shadow the
    gpuprov package on sys.path)."""

    def load(relative: str) -> ModuleType:
        path = REPO / "plugins" / relative
        spec = importlib.util.spec_from_file_location(f"gpuprov_plugin_{path.stem}", path)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
