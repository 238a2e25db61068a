"""gpuprov against what a real GPU answered: an NVIDIA H200, driver 580.159.04, recorded on
2026-11-26 by scripts/device-check.sh (tests/fixtures/real/h200-580.159.04/README.md).

NVML's raw answers are replayed through the pynvml test double; nvidia-smi's own reading of
the same moment (nvidia-smi -q -x, mig -lgip/-lgipp) is the expected answer, so nothing here
is an expectation written by hand. The lab's simulated NVML is held to the same record.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.node.probe import host, nvml
from gpuprov.node.probe.fs import Root
from gpuprov.nvidia import hardware, mig
from gpuprov.verify import runner
from gpuprov.verify.inventory import Node

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "fixtures" / "real" / "h200-580.159.04"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fake_pynvml = _load("fake_pynvml", REPO / "tests" / "fixtures" / "probe" / "fake_pynvml.py")
nvml_truth = _load("nvml_truth", REPO / "scripts" / "nvml_truth.py")

RECORD = json.loads((REAL / "nvml-record.json").read_text())
SMI_XML = (REAL / "nvidia-smi.xml").read_text()
RECORDED_REPORT = json.loads((REAL / "probe.json").read_text())


@pytest.fixture
def replayed(monkeypatch) -> dict:
    """The probe report of the real node with its NVML section read again, by today's probe,
    from NVML's recorded answers."""
    monkeypatch.setattr(nvml, "loaded_library", lambda: RECORDED_REPORT["nvml"]["library"])
    return RECORDED_REPORT | {"nvml": nvml.collect(fake_pynvml.make(RECORD))}


def test_the_probe_reads_every_value_as_nvidia_smi_does(replayed):
    rows = nvml_truth.compare(replayed, SMI_XML)
    wrong = [r for r in rows if r["verdict"] in ("differs", "probe-none")]
    assert not wrong, wrong
    # Every GPU field the comparison knows was shown by nvidia-smi too, so none was skipped.
    assert {r["field"] for r in rows if r["verdict"] == "same"} >= {
        "name", "uuid", "pci_device_id", "memory.total_mib", "memory.used_mib",
        "memory.reserved_mib", "temperature.slowdown", "temperature.shutdown", "power.limit_w",
        "pcie.width_max", "ecc.mode_current", "remapped_rows.pending", "mig.current"}


def test_the_comparison_catches_what_the_first_probe_got_wrong():
    # Recorded by the probe of the day, before it read NVML's v2 memory: v1's "used" counts
    # the driver's reservation, nvidia-smi's does not.
    rows = nvml_truth.compare(RECORDED_REPORT, SMI_XML)
    assert [r["field"] for r in rows if r["verdict"] == "differs"] == ["memory.used_mib"]


def test_an_old_driver_without_memory_v2_still_gives_memory():
    record = json.loads(json.dumps(RECORD))
    for gpu in record["gpus"]:
        del gpu["memory_v2"]  # the double then answers v2 with FUNCTION_NOT_FOUND
    memory = nvml.collect(fake_pynvml.make(record))["gpus"][0]["memory"]
    assert memory == RECORD["gpus"][0]["memory"] | {"reserved": None}


def test_the_hardware_table_knows_the_board_as_nvml_names_it():
    gpu = RECORD["gpus"][0]
    device, subsystem = int(gpu["pci_device_id"][:4], 16), int(gpu["pci_subsystem_id"][:4], 16)
    model = hardware.lookup(device, subsystem)
    assert model is not None
    assert model.name == gpu["name"]
    assert model.compute_capability == "{}.{}".format(*gpu["cc"])
    assert model.architecture == hardware.architecture_from_nvml(gpu["arch"])


def test_verify_node_checks_judge_the_replayed_node_as_they_did_on_it(replayed):
    node = Node(name=RECORDED_REPORT["host"]["hostname"], target=None, gpu_expected=True)
    selected = runner.select_checks()
    result = runner.nodes.ProbeResult(node, replayed)
    got = {f.check: f.status for f in runner.node_findings([result], selected)}
    recorded = {f["check"]: f["status"] for f in json.loads((REAL / "verify.json").read_text())[
        "results"] if f["check"] in got}
    # driver.security is newer than the recording: the real node's 580.159.04 (bulletin 5821's
    # fix) lacks bulletin 5861's (580.178.04), so it fails there as it would have on the node.
    security = got.pop("driver.security")
    assert security == ("fail" if "driver.security" not in recorded
                        else recorded.pop("driver.security"))
    assert got == recorded
    # A healthy GPU: every NVML and GPU check passes on it.
    assert {c: s for c, s in got.items() if c.startswith(("nvml.", "gpu."))
            and s != "pass"} == {}


def _lgipp() -> dict[int, tuple[list[int], int]]:
    """nvidia-smi mig -lgipp: profile ID -> (start slices, memory slices)."""
    placements = {}
    for line in (REAL / "nvidia-smi-mig.txt").read_text().splitlines():
        match = re.search(r"Profile ID\s+(\d+) Placements?\s*: \{([\d,]+)\}:(\d+)", line)
        if match:
            placements[int(match[1])] = ([int(s) for s in match[2].split(",")], int(match[3]))
    return placements


def test_the_mig_table_is_the_real_gpus():
    gpu = RECORD["gpus"][0]
    model = mig.model_of(int(gpu["pci_device_id"][:4], 16))
    answered = {int(index): a["value"] for index, a in
                gpu["extras"]["nvmlDeviceGetGpuInstanceProfileInfo"].items() if "value" in a}
    placements = _lgipp()
    assert len(placements) == len(answered) == len(model.profiles)
    for profile in model.profiles:
        info = answered[profile.nvml_index]
        assert info["name"] == f"MIG {profile.name}"
        assert (info["id"], info["sliceCount"], info["instanceCount"],
                info["multiprocessorCount"]) == (profile.nvml_id, profile.compute, profile.count,
                                                 model.profile_multiprocessors(profile))
        assert placements[profile.nvml_id] == (list(profile.starts), profile.size), profile.name


def test_the_kernel_module_and_log_of_the_real_node(tmp_path):
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    shutil.copy(REAL / "proc-driver-nvidia-version.txt", tmp_path / "proc/driver/nvidia/version")
    (tmp_path / "dev").mkdir()
    shutil.copy(REAL / "kmsg-nvidia.txt", tmp_path / "dev/kmsg")
    root = Root(str(tmp_path))
    module = host.collect_kernel_module(root)
    assert (module["version"], module["flavor"]) == (RECORD["driver_version"], "open")
    log = host.collect_kernel_log(root)
    # NVRM's own lines, continuation records ("c" flag) among them, are no XIDs.
    assert (log["readable"], log["xid_count"]) == (True, 0)


# -- the lab's simulated NVML against the same record ----------------------------------------
SIM_KEYS = ("name", "pci_device_id", "pci_subsystem_id", "memory", "memory_v2", "cc", "arch",
            "slowdown", "shutdown", "limit_mw", "ecc_mode", "ecc", "remapped", "mig_mode",
            "max_mig_devices", "persistence", "util", "temp", "processes")


@pytest.fixture(scope="module")
def simulated(tmp_path_factory) -> dict:
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    from gpuprov.lab import simhw
    from gpuprov.lab.profiles import NodeProfile

    base = tmp_path_factory.mktemp("sim-h200")
    library = simhw.build_nvml_library(base)
    simhw.write_node_state(base / "node", "gpu-h200",
                           NodeProfile("gpu-h200", ("h200-sxm-141gb",), RECORD["driver_version"]))
    conf = base / "node" / simhw.SIM_DIR / "nvml.conf"
    # The recorded node ran nvidia-persistenced (persistence mode on).
    conf.write_text(conf.read_text().replace("persistence_mode = auto", "persistence_mode = 1"))
    env = dict(os.environ, LD_LIBRARY_PATH=str(library.parent),
               GPUPROV_SIM_DIR=str(base / "node" / simhw.SIM_DIR))
    code = ("import json, sys; sys.path.insert(0, 'scripts'); import nvml_truth, pynvml; "
            "print(json.dumps(nvml_truth.record_nvml(pynvml)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_the_simulated_h200_answers_as_the_real_one(simulated):
    real, sim = RECORD["gpus"][0], simulated["gpus"][0]
    assert {k: sim.get(k) for k in SIM_KEYS} == {k: real.get(k) for k in SIM_KEYS}
    # The same calls fail, with the same errors (retired pages: row remapping instead).
    assert sim["errors"] == real["errors"]
    assert simulated["driver_version"] == RECORD["driver_version"]
    assert simulated["cuda_driver_version"] == RECORD["cuda_driver_version"]
    assert sim["extras"]["nvmlDeviceGetBrand"] == real["extras"]["nvmlDeviceGetBrand"]
    assert (sim["extras"]["nvmlDeviceGetTemperatureThreshold"]["3"]
            == real["extras"]["nvmlDeviceGetTemperatureThreshold"]["3"])  # GPU max (T.Limit)


def test_the_simulated_mig_profiles_are_the_real_ones_but_their_memory(simulated):
    def profiles(gpu: dict) -> dict:
        return {index: {k: v for k, v in a["value"].items()
                        if k not in ("version", "memorySizeMB", "copyEngineCount",
                                     "decoderCount", "jpegCount", "ofaCount", "encoderCount")}
                for index, a in gpu["extras"]["nvmlDeviceGetGpuInstanceProfileInfo"].items()
                if "value" in a}

    # SIMULATION.md: instance memory and engine counts are derived, not NVIDIA's figures.
    assert profiles(simulated["gpus"][0]) == profiles(RECORD["gpus"][0])


def test_the_fixture_says_what_it_is():
    meta = RECORD["meta"]
    assert meta["models"] == ["NVIDIA H200"] and meta["driver_version"] == "580.159.04"
    assert meta["recorded_at"].startswith("2026-11-26")
    readme = (REAL / "README.md").read_text()
    assert all(word in readme for word in ("H200", "580.159.04", "2026-11-26"))


BOARDS = sorted(p for p in (REPO / "tests" / "fixtures" / "real").iterdir()
                if (p / "nvml-record.json").exists())


@pytest.mark.parametrize("board", BOARDS, ids=lambda p: p.name)
def test_every_recorded_board_replays_as_nvidia_smi_showed_it(board, monkeypatch):
    # Each recording (another board, another driver, another day) replayed by today's probe
    # must read every value as the same moment's nvidia-smi -q -x did.
    record = json.loads((board / "nvml-record.json").read_text())
    report = json.loads((board / "probe.json").read_text())
    monkeypatch.setattr(nvml, "loaded_library", lambda: report["nvml"]["library"])
    replayed = report | {"nvml": nvml.collect(fake_pynvml.make(record))}
    rows = nvml_truth.compare(replayed, (board / "nvidia-smi.xml").read_text())
    assert [r for r in rows if r["verdict"] in ("differs", "probe-none")] == []
    assert sum(r["verdict"] == "same" for r in rows) >= 30
    # and verify's node checks judge the replayed node as they judged the real one
    node = Node(name=report["host"]["hostname"], target=None, gpu_expected=True)
    selected = runner.select_checks()
    got = {f.check: f.status for f in runner.node_findings(
        [runner.nodes.ProbeResult(node, replayed)], selected)}
    recorded = {f["check"]: f["status"] for f in json.loads(
        (board / "verify.json").read_text())["results"] if f["check"] in got}
    if "driver.security" not in recorded:  # recorded before the check existed
        got.pop("driver.security")
    assert got == recorded
