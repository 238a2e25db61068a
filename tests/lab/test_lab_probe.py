"""The probe, shipped over SSH to every lab node, against each node's simulated hardware.

The probe is production code; what it reads on the nodes is the lab's simulation (PCI
sysfs + NVML). The expectations come from the lab's profiles, not from the probe.
"""

from __future__ import annotations

import pytest
from conftest import installed_packages

from gpuprov.cli import main
from gpuprov.lab import profiles
from gpuprov.payload import run_probe

# Keys that legitimately differ between two probe runs of an unchanged node.
RUN_KEYS = {"probe.collected_at", "probe.duration_s"}


def flatten(doc, prefix=""):
    """{"a": {"b": [1]}} -> {"a.b.0": 1}; empty containers are kept as leaves."""
    if isinstance(doc, dict) and doc:
        items = doc.items()
    elif isinstance(doc, list) and doc:
        items = enumerate(doc)
    else:
        return {prefix: doc}
    flat = {}
    for key, value in items:
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def changed_paths(before: dict, after: dict) -> set[str]:
    a, b = flatten(before), flatten(after)
    return {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}


@pytest.fixture
def probe(lab, node_connection):
    def _probe(name: str) -> dict:
        return run_probe(node_connection(name), timeout=60)

    return _probe


@pytest.mark.parametrize("node", ["gpu-kepler", "gpu-pascal", "gpu-hopper"])
def test_probe_reports_the_node_profile_exactly(lab, probe, node_connection, node):
    report = probe(node)
    expected = profiles.expected_gpus(node, profiles.NODE_PROFILES[node])
    assert report["probe"]["errors"] == {}
    assert report["host"]["hostname"] == node
    assert [g["address"] for g in report["pci"]] == [e.sysfs_address for e in expected]
    assert [g["device_id"] for g in report["pci"]] == [
        f"10de:{e.model.pci_device_id:04x}" for e in expected
    ]
    for g, e in zip(report["pci"], expected, strict=True):
        assert g["classification"]["architecture"] == e.architecture
        assert g["classification"]["compute_capability"] == e.compute_capability
    nvml = report["nvml"]
    assert nvml["available"] is True, nvml["error"]
    assert nvml["device_count"] == len(expected)
    got = [
        (g["index"], g["name"], g["uuid"], g["serial"], g["pci_bus_id"],
         g["memory"]["total"], g["compute_capability"], g["architecture"])
        for g in nvml["gpus"]
    ]
    want = [
        (e.index, e.name, e.uuid, e.serial, e.pci_bus_id, e.memory_total,
         e.compute_capability, e.architecture)
        for e in expected
    ]
    assert got == want
    # The profile's version until a driver package is installed (site.yml may have run in an
    # earlier test module), then the installed one's: the lab's NVML follows the package.
    installed = installed_packages(node_connection(node))
    library = next((installed[n][0] for n in ("libnvidia-ml1", "libnvidia-tesla-470-ml1")
                    if n in installed), None)
    expected_version = (library.split(":")[-1].split("-")[0] if library
                        else profiles.NODE_PROFILES[node].driver_version)
    assert nvml["driver_version"] == expected_version
    assert report["summary"]["pci_gpu_count"] == len(expected)
    assert report["summary"]["nvml_healthy_gpu_count"] == len(expected)
    for gpu in nvml["gpus"]:
        assert gpu["ecc"]["volatile"]["uncorrected"] == 0
        assert gpu["temperature"]["current"] < gpu["temperature"]["slowdown"]


def test_probe_on_the_cpu_node_reports_no_gpu_without_error(probe):
    report = probe("cpu-only")
    assert report["probe"]["errors"] == {}
    assert report["pci"] == []
    assert report["summary"]["gpu_node"] is False
    assert report["summary"]["pci_gpu_count"] == 0
    assert report["nvml"]["gpus"] == []


# fault -> (node, gpu index, paths that may change, check of the reported fault)
GPU = 1
FAULT_CASES = {
    "nvml-init-fail": (
        "gpu-pascal", None, ("nvml", "summary.nvml_"),
        lambda r: r["nvml"]["error"]["name"] == "NVML_ERROR_DRIVER_NOT_LOADED"
        and r["nvml"]["error"]["code"] == 9 and r["nvml"]["available"] is False,
    ),
    "version-mismatch": (
        "gpu-pascal", None, ("nvml", "summary.nvml_"),
        lambda r: r["nvml"]["error"]["name"] == "NVML_ERROR_LIB_RM_VERSION_MISMATCH"
        and r["nvml"]["error"]["code"] == 18,
    ),
    "gpu-lost": (
        "gpu-pascal", GPU, (f"nvml.gpus.{GPU}.", "summary.nvml_healthy_gpu_count"),
        lambda r: r["nvml"]["gpus"][GPU]["error"]["code"] == 15
        and r["nvml"]["device_count"] == 4 and len(r["pci"]) == 4
        and r["summary"]["nvml_healthy_gpu_count"] == 3,
    ),
    "ecc-uncorrectable": (
        "gpu-pascal", GPU, (f"nvml.gpus.{GPU}.ecc.",),
        lambda r: r["nvml"]["gpus"][GPU]["ecc"]["volatile"]["uncorrected"] > 0
        and r["nvml"]["gpus"][GPU]["ecc"]["aggregate"]["uncorrected"] > 0,
    ),
    "row-remap-pending": (
        "gpu-hopper", GPU, (f"nvml.gpus.{GPU}.remapped_rows.",),
        lambda r: r["nvml"]["gpus"][GPU]["remapped_rows"]["pending"] is True,
    ),
    "hot-gpu": (
        "gpu-pascal", GPU,
        (f"nvml.gpus.{GPU}.temperature.current", f"nvml.gpus.{GPU}.clock_event_reasons."),
        lambda r: r["nvml"]["gpus"][GPU]["temperature"]["current"]
        > r["nvml"]["gpus"][GPU]["temperature"]["slowdown"]
        and "hw_thermal_slowdown" in r["nvml"]["gpus"][GPU]["clock_event_reasons"]["names"],
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULT_CASES))
def test_each_fault_is_reported_and_nothing_else_changes(lab, probe, clean_faults, fault):
    node, gpu, allowed, reported = FAULT_CASES[fault]
    before = probe(node)
    argv = ["lab", "--dir", str(lab.project_dir), "fault", node, fault]
    if gpu is not None:
        argv += ["--gpu", str(gpu)]
    assert main(argv) == 0
    during = probe(node)
    assert reported(during), during["nvml"]
    unexpected = {
        p for p in changed_paths(before, during) - RUN_KEYS if not p.startswith(allowed)
    }
    assert unexpected == set()
    assert main(["lab", "--dir", str(lab.project_dir), "fault", node, fault, "--clear"]) == 0
    after = probe(node)
    assert changed_paths(before, after) - RUN_KEYS == set()


def test_pre_ampere_row_remap_fault_shows_as_a_pending_retired_page(lab, probe, clean_faults):
    assert lab.fault("gpu-pascal", "row-remap-pending", gpu_index=0) == ["row-remap-pending:0"]
    report = probe("gpu-pascal")
    assert report["nvml"]["gpus"][0]["retired_pages"]["pending"] is True


def test_a_gpu_fault_on_the_cpu_node_is_a_usage_error(lab, capsys):
    code = main(["lab", "--dir", str(lab.project_dir), "fault", "cpu-only", "hot-gpu"])
    assert code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_an_unknown_fault_is_a_usage_error(lab, capsys):
    code = main(["lab", "--dir", str(lab.project_dir), "fault", "gpu-pascal", "melted"])
    assert code == 2
    assert "unknown fault 'melted'" in capsys.readouterr().err
