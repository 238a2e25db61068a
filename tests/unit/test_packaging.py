"""What the wheel holds (pyproject.toml): gpuprov without its lab, which is test
infrastructure that runs from a clone only; `gpuprov lab` from such an install says so in one
line, with its own exit code (gpuprov.errors.ExitCode.NEEDS_CHECKOUT)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gpuprov.cli import main
from gpuprov.errors import ExitCode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    """The files of the wheel pip builds from a copy of the package's sources (a build in the
    checkout would leave build/ and *.egg-info there)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "gpuprov", source / "gpuprov",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                          "--no-build-isolation", "-q", "-w", str(out), str(source)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = out.glob("gpuprov-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_leaves_the_lab_out_and_holds_the_rest(wheel_names):
    assert not [n for n in wheel_names if n.startswith("gpuprov/lab/")]
    package = {p.relative_to(REPO).as_posix() for p in (REPO / "gpuprov").rglob("*.py")
               if not p.relative_to(REPO).as_posix().startswith("gpuprov/lab/")}
    assert package <= set(wheel_names), sorted(package - set(wheel_names))


def test_gpuprov_lab_from_an_install_without_the_lab_says_it_needs_a_clone(
        monkeypatch, capsys, tmp_path):
    # What an install from the wheel has: no gpuprov.lab (None in sys.modules: import fails as
    # for a package that is not there).
    monkeypatch.setitem(sys.modules, "gpuprov.lab", None)
    monkeypatch.setitem(sys.modules, "gpuprov.lab.lab", None)
    assert main(["lab", "--dir", str(tmp_path), "status"]) == ExitCode.NEEDS_CHECKOUT == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs from a clone of the repository" in err[0], err
    assert not list(tmp_path.iterdir())  # nothing written
