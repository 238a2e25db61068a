"""`gpuprov status`: the cluster-wide GPU table from the probes (fake nodes, no SSH)."""

from __future__ import annotations

import json

from test_verify_runner import PROBES, FakeNodes, inventory_file

from gpuprov import cli
from gpuprov.errors import ExitCode
from gpuprov.payload import ProbeUnreachable
from gpuprov.verify import nodes


def _status(monkeypatch, tmp_path, capsys, *argv, **outcomes):
    monkeypatch.setattr(nodes, "probe_node", FakeNodes(**outcomes))
    rc = cli.main(["status", "-i", str(inventory_file(tmp_path)), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_table_has_one_row_per_gpu_with_memory_and_power(monkeypatch, tmp_path, capsys):
    rc, out, _ = _status(monkeypatch, tmp_path, capsys)
    assert rc == ExitCode.OK
    pascal = json.loads((PROBES / "gpu-pascal.json").read_text())
    gpu = pascal["nvml"]["gpus"][0]
    total_mib = gpu["memory"]["total"] // (1024 * 1024)
    assert f"gpu-pascal: driver {pascal['nvml']['driver_version']}" in out
    assert out.count("Tesla P100-PCIE-16GB") == len(pascal["nvml"]["gpus"])
    assert f"0/{total_mib} MiB" in out
    assert f"{gpu['power']['usage_w']:.0f}/{gpu['power']['limit_w']:.0f} W" in out
    assert "cpu-only: no NVIDIA GPU" in out


def test_json_and_unreachable_node_exit_3(monkeypatch, tmp_path, capsys):
    rc, out, err = _status(monkeypatch, tmp_path, capsys, "--json",
                           **{"gpu-kepler": ProbeUnreachable("connection refused")})
    doc = json.loads(out)
    assert rc == ExitCode.UNREACHABLE and "could not be probed" in err
    by_node = {n["node"]: n for n in doc["nodes"]}
    assert by_node["gpu-kepler"]["unreachable"] and by_node["gpu-kepler"]["gpus"] == []
    assert [g["index"] for g in by_node["gpu-hopper"]["gpus"]] == list(range(8))
    assert by_node["gpu-hopper"]["gpus"][0]["memory_total_mib"] > 80000
