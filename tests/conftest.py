"""Shared test fixtures."""

from __future__ import annotations

import importlib.util
import os
import subprocess
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


def _assert_signed_by(key_file: Path, arch_dir: Path, fingerprint: str, work: Path) -> None:
    """A flat apt repository's Release is signed (inline and detached) by the published key
    and no other, and a tampered index fails: what apt's check of it relies on."""
    keyring = work / "keyring.gpg"
    subprocess.run(["gpg", "--batch", "--dearmor", "--output", str(keyring), str(key_file)],
                   check=True, env={**os.environ, "GNUPGHOME": str(work)})
    ok = subprocess.run(["gpgv", "--keyring", str(keyring), str(arch_dir / "InRelease")],
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert fingerprint[-16:] in ok.stderr.replace(" ", "")
    detached = subprocess.run(
        ["gpgv", "--keyring", str(keyring), str(arch_dir / "Release.gpg"),
         str(arch_dir / "Release")], capture_output=True, text=True, check=False)
    assert detached.returncode == 0, detached.stderr
    tampered = work / "InRelease"
    tampered.write_text((arch_dir / "InRelease").read_text().replace("Packages", "Packagez", 1))
    bad = subprocess.run(["gpgv", "--keyring", str(keyring), str(tampered)],
                         capture_output=True, text=True, check=False)
    assert bad.returncode != 0


@pytest.fixture(scope="session")
def assert_signed_by():
    """assert_signed_by(key_file, arch_dir, fingerprint, work_dir) for the lab's repositories."""
    return _assert_signed_by
