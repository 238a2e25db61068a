"""Shared test fixtures."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import timings

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


# The lab tests' labs: a module that brings up a lab of its own (temporary_lab in a module
# fixture) is one scheduling unit; every other lab module shares the session lab, and all of
# them are one unit. Under pytest-xdist (make test: -n 4) each unit runs whole on one worker,
# its tests in order, so the three labs run side by side from the start while the unit tests,
# one unit per module, spread over whatever worker is free.
OWN_LAB_MODULES = {"test_driver_source_switch.py": "switchlab",
                   "test_upgrade_driver.py": "upgradelab",
                   "test_docker_lab.py": "dockerlab"}


def scheduling_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its lab, its molecule scenario, or its module."""
    path = nodeid.split("::", 1)[0]
    directory, _, name = path.rpartition("/")
    if directory == "tests/lab":
        return OWN_LAB_MODULES.get(name, "sessionlab")
    return path


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's loadscope scheduling with scheduling_unit() as the scope, in collection order
    (tests/lab first: the labs, the longest units, start at once). xdist's own loadgroup
    would need an xdist_group mark per test, and pytest 9.2 no longer sees the group in the
    node ids that xdist 3.8 rewrites."""
    from xdist.scheduler import LoadScopeScheduling

    class LabScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scheduling_unit(nodeid)

    config.option.loadscopereorder = False
    return LabScheduling(config, log)


# Session-lab modules that leave the lab changed for good run after the others, so that no
# playbook run exists only to put the lab back: the MIG stage's tests end with MIG off but the
# device plugin in its mixed strategy and mig-manager's labels set.
RUN_LAST = ("test_lab_mig_stage.py",)


def pytest_collection_modifyitems(items):
    """Mark tests by directory: tests/lab/ needs the podman lab, tests/molecule/ runs molecule
    scenarios; `-m "not lab and not molecule"` leaves the fast tests. RUN_LAST's tests move
    behind the other tests (a stable sort: everything else keeps its order)."""
    for item in items:
        parents = Path(item.fspath).parents
        for marker in ("lab", "molecule"):
            if REPO / "tests" / marker in parents:
                item.add_marker(getattr(pytest.mark, marker))
    items.sort(key=lambda item: Path(item.fspath).name in RUN_LAST)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        handle, path = tempfile.mkstemp(prefix="gpuprov-timings-", suffix=".jsonl")
        os.close(handle)
        os.environ[timings.ENV] = path
        config.stash[_TIMINGS] = path


_TIMINGS = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter, config):
    path = config.stash.get(_TIMINGS, None)
    if path is None:
        return
    rows = timings.read(path)
    os.unlink(path)
    if not rows:
        return
    terminalreporter.section("lab setup and playbook runs (slowest first)")
    for row in sorted(rows, key=lambda r: -r["seconds"]):
        terminalreporter.write_line(f"{row['seconds']:8.1f}s  {row['worker']:<5} {row['what']}")
    terminalreporter.write_line(f"{sum(r['seconds'] for r in rows):8.1f}s  in all, "
                                f"{len(rows)} runs")


@pytest.fixture(scope="session")
def tool():
    """Path of a console script installed next to the running Python (the project's venv)."""
    return lambda name: str(Path(sys.executable).parent / name)


# The filter and lookup plugins import their shared code as the collection's
# (ansible_collections.gpuprov.cluster.plugins.plugin_utils), which ansible-playbook finds through
# ansible.cfg's collections_path; in this process the same folder is a namespace package root.
sys.path.append(str(REPO / "collections"))


@pytest.fixture(scope="session")
def ansible_plugin():
    """Load one of the repo's Ansible plugins (plugins/<kind>/<name>.py) as a module, by path as
    Ansible loads them from ansible.cfg's plugin paths."""

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
