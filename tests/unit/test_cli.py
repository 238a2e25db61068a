"""The CLI's contract: exit codes and one-line errors, whatever the sub-command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuprov.cli import main
from gpuprov.errors import ExitCode, GpuprovError


def test_no_command_is_a_usage_error(capsys):
    assert main([]) == ExitCode.USAGE
    assert "required: COMMAND" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["frobnicate"]) == ExitCode.USAGE
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


def test_version_and_help_exit_zero(capsys):
    assert main(["--version"]) == ExitCode.OK
    assert capsys.readouterr().out.startswith("gpuprov ")
    assert main(["--help"]) == ExitCode.OK


@pytest.fixture
def failing_hw(monkeypatch):
    """`hw classify` raising an expected failure, as any command may."""
    import gpuprov.nvidia.hardware

    def classify(pci_id, subsystem_device=None, chip_name=None):
        raise GpuprovError("the inventory is missing: pass -i FILE", ExitCode.USAGE)

    monkeypatch.setattr(gpuprov.nvidia.hardware, "classify", classify)


def test_expected_failure_is_one_line_and_its_exit_code(failing_hw, capsys):
    assert main(["hw", "classify", "--pci-id", "10de:15f8"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err == "gpuprov: error: the inventory is missing: pass -i FILE\n"


def test_debug_shows_the_traceback(failing_hw):
    with pytest.raises(GpuprovError):
        main(["--debug", "hw", "classify", "--pci-id", "10de:15f8"])


def test_a_closed_pipe_is_not_a_traceback():
    proc = subprocess.run(
        f"{sys.executable} -m gpuprov probe --json | head -c 1",
        shell=True, capture_output=True, text=True, timeout=60,
    )
    assert proc.stdout == "{"
    assert "Traceback" not in proc.stderr


def test_production_code_never_imports_the_lab():
    """gpuprov.lab is test infrastructure: the CLI (all parsers built) and the payload must
    not load it; only `gpuprov lab ...` itself does, when it runs."""
    code = (
        "import sys, gpuprov.cli, gpuprov.payload, gpuprov.ssh, gpuprov.nvidia.driver_branches;"
        "gpuprov.cli.build_parser();"
        "print(sorted(m for m in sys.modules if m.startswith('gpuprov.lab')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
