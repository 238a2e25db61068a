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


def _partitioned_hopper() -> dict:
    """The recorded gpu-hopper probe with GPU 0 in MIG mode: two MIG devices, as the probe
    reports them (the probe's MIG section is tested against the simulated NVML in
    test_simnvml_mig.py)."""
    report = json.loads((PROBES / "gpu-hopper.json").read_text())
    devices = [("3g.40gb", 1, "MIG-7b1f3c2a-0c5e-5a55-8e0b-1f4c8e2d9a10", 40448),
               ("1g.10gb", 2, "MIG-0a9d8c7b-6e5f-5d4c-9b3a-2f1e0d9c8b7a", 10112)]
    report["nvml"]["gpus"][0]["mig"] = {"current": True, "pending": True, "devices": [
        {"index": i, "uuid": uuid, "name": f"NVIDIA H100 80GB HBM3 MIG {profile}",
         "profile": profile, "gpu_instance_id": gi, "compute_instance_id": 0,
         "memory_mb": memory, "multiprocessors": None, "gpu_instance_slices": None,
         "compute_instance_slices": None}
        for i, (profile, gi, uuid, memory) in enumerate(devices)]}
    report["nvml"]["gpus"][1]["mig"] = {"current": False, "pending": True, "devices": []}
    return report


def test_mig_devices_are_listed_under_their_gpu(monkeypatch, tmp_path, capsys):
    rc, out, _ = _status(monkeypatch, tmp_path, capsys, "--limit", "gpu-hopper",
                         **{"gpu-hopper": _partitioned_hopper})
    assert rc == ExitCode.OK
    lines = out.splitlines()
    gpu0 = next(i for i, line in enumerate(lines) if "NVIDIA H100 80GB HBM3 [MIG]" in line)
    assert "0/1/0" in lines[gpu0 + 1] and "MIG 3g.40gb (MIG-7b1f3c2a-" in lines[gpu0 + 1]
    assert "40448 MiB" in lines[gpu0 + 1]
    assert "0/2/0" in lines[gpu0 + 2] and "MIG 1g.10gb" in lines[gpu0 + 2]
    assert "[MIG off, on after reset]" in lines[gpu0 + 3]
    rc, out, _ = _status(monkeypatch, tmp_path, capsys, "--limit", "gpu-hopper", "--json",
                         **{"gpu-hopper": _partitioned_hopper})
    gpus = json.loads(out)["nodes"][0]["gpus"]
    assert [d["profile"] for d in gpus[0]["mig"]["devices"]] == ["3g.40gb", "1g.10gb"]
    assert gpus[1]["mig"] == {"enabled": False, "pending": True, "devices": []}
    assert gpus[2]["mig"] == {"enabled": False, "pending": False, "devices": []}
