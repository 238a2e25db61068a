"""`gpuprov lab up` checks what it needs before it starts anything (gpuprov/lab/needs.py)."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from gpuprov.cli import main
from gpuprov.lab import needs
from gpuprov.lab.kube import cri

REAL_WHICH, REAL_FIND_SPEC = shutil.which, importlib.util.find_spec


def _without(monkeypatch, programs=(), modules=(), proto=True):
    monkeypatch.setattr(needs.shutil, "which",
                        lambda name, *a, **k: None if name in programs else REAL_WHICH(name))
    monkeypatch.setattr(needs.importlib.util, "find_spec",
                        lambda name, *a, **k: None if name in modules
                        else REAL_FIND_SPEC(name, *a, **k))
    if not proto:
        monkeypatch.setattr(cri, "PROTO", cri.PROTO.with_name("no-such-api.proto"))


@pytest.mark.parametrize("need", needs.NEEDS, ids=lambda n: n.name)
def test_each_missing_need_is_named_with_its_command(monkeypatch, tmp_path, capsys, need):
    programs = [need.name] if need.present.__qualname__.startswith("_program") else []
    modules = {"grpcio": ["grpc"], "grpcio-tools": ["grpc_tools"],
               "kubernetes-validate": ["kubernetes_validate"]}.get(need.name, [])
    _without(monkeypatch, programs, modules, proto=need.name != "the CRI api.proto")
    assert [n.name for n in needs.missing()] == [need.name]

    assert main(["lab", "--dir", str(tmp_path), "up"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert need.name in err[0] and f"`{need.install}`" in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def test_several_missing_needs_come_in_one_line_each_command_once(monkeypatch):
    _without(monkeypatch, programs=["podman", "gcc"], modules=["grpc"])
    with pytest.raises(needs.GpuprovError) as raised:
        needs.check()
    message = raised.value.message
    assert "podman" in message and "gcc" in message and "grpcio" in message
    assert message.count("`make deps`") == 1 and message.count("`pip install -e '.[dev]'`") == 1
    assert "\n" not in message


def test_a_complete_machine_passes():
    # make test installs every need first (make deps, the dev extras, make containerd-bins).
    assert needs.missing() == []
