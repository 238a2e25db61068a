"""Every node check against recorded probe reports: the healthy baseline passes, and each
mutation (the fault as the probe reports it) gives the expected status and message."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuprov.verify import checks  # noqa: F401 (registers the checks)
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.findings import CHECKS, FAIL, PASS, SKIP, WARN
from gpuprov.verify.inventory import Node
from gpuprov.verify.nodes import ProbeResult
from gpuprov.verify.runner import node_findings

PROBES = Path(__file__).resolve().parent.parent / "fixtures" / "verify" / "probe"
GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")
NODE_CHECKS = [c for c in CHECKS.values() if c.phase == "node"]


def report(name: str) -> dict:
    return json.loads((PROBES / f"{name}.json").read_text())


def node(name: str, pin: str | None = None, allow_vulnerable: bool = True) -> Node:
    # The recorded nodes run Debian 12's own 470 and 535, below or past NVIDIA's security
    # fixes: accepted (nvidia_driver_allow_vulnerable), as the lab's inventory accepts them.
    return Node(name=name, target=None, gpu_expected=name.startswith("gpu-"),
                driver_branch_pin=pin, driver_allow_vulnerable=allow_vulnerable)


def facts(name: str, mutate: Callable[[dict], None] | None = None, pin: str | None = None,
          fleet: dict[str, dict] | None = None, allow_vulnerable: bool = True) -> NodeFacts:
    doc = report(name)
    if mutate:
        mutate(doc)
    members = {n: NodeFacts(node(n), r) for n, r in (fleet or {}).items()}
    own = NodeFacts(node(name, pin, allow_vulnerable), doc)
    members[name] = own
    return NodeFacts(own.node, doc, members)


def run(check_id: str, f: NodeFacts):
    return CHECKS[check_id].finding(f.node.name, CHECKS[check_id].func(f))


@pytest.mark.parametrize("name", GPU_NODES)
def test_healthy_gpu_node_passes_every_node_check(name):
    results = [ProbeResult(node(n), report(n)) for n in (*GPU_NODES, "cpu-only")]
    findings = [f for f in node_findings(results, NODE_CHECKS) if f.node == name]
    # The recorded nodes run Debian 12's 470 and 535, both past NVIDIA's end of life on the
    # unit tests' day (tests/unit/conftest.py) and without NVIDIA's later security fixes
    # (accepted): warnings, the only ones.
    # gpu.mig: only the H100s have MIG (off, nothing pending); the others skip.
    assert {f.check: f.status for f in findings} == {
        **{c.id: PASS for c in NODE_CHECKS}, "driver.branch-eol": WARN,
        "driver.security": WARN,
        "gpu.mig": PASS if name == "gpu-hopper" else SKIP}


def _driver(version: str) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        doc["nvml"]["driver_version"] = version
        doc["kernel_module"]["version"] = version
        doc["nvml"]["library"]["version"] = version
    return mutate


@pytest.mark.parametrize(("name", "version", "day", "status", "words"), [
    ("gpu-pascal", None, None, WARN,
     "driver 535.261.03: R535 (long term support branch) reached NVIDIA's end of life 2026-06: "
     "move to R580 (LTSB, to 2028-06)"),  # Pascal's last branch is 580
    ("gpu-hopper", None, None, WARN, "move to R620 (LTSB, to 2029-09) or R595 (PB, to 2027-03)"),
    ("gpu-kepler", None, None, WARN, "2024-07: no supported branch drives these GPUs"),
    ("gpu-pascal", None, "2026-04-01", WARN, "reaches NVIDIA's end of life in 2026-06"),
    ("gpu-pascal", None, "2026-03-01", PASS, "R535 (LTSB) supported to 2026-06"),
    ("gpu-hopper", "580.105.08", None, PASS, "R580 (LTSB) supported to 2028-06"),
    ("gpu-hopper", "590.44.01", None, PASS, "R590 is a new feature branch without an "
                                            "end-of-life date"),
    ("gpu-hopper", "595.58.03", "2027-01-15", WARN, "R595 (production branch) reaches NVIDIA's "
                                                    "end of life in 2027-03: move to R620"),
    ("gpu-hopper", "999.1.2", None, WARN, "branch 999 is not in gpuprov's list"),
])
def test_branch_eol(monkeypatch, name, version, day, status, words):
    from gpuprov.verify.checks import driver

    if day:
        monkeypatch.setattr(driver, "today", lambda: datetime.date.fromisoformat(day))
    finding = run("driver.branch-eol", facts(name, _driver(version) if version else None))
    assert finding.status == status and words in finding.message, finding.message
    assert (finding.remediation is not None) == (status == WARN)


@pytest.mark.parametrize(("name", "version", "allow", "status", "words"), [
    # Below the floor: fails naming the bulletins, their CVEs and the version to install.
    ("gpu-hopper", "580.105.08", False, FAIL,
     "driver 580.105.08 is below R580's fixed version 580.178.04: bulletin 5747 (2026-01-28, "
     "high 7.8: CVE-2025-33219, CVE-2025-33220); bulletin 5821"),
    ("gpu-hopper", "580.105.08", False, FAIL, "bulletin 5861 (2026-09-30, high 7.8: "
     "CVE-2026-47489, CVE-2026-47491, CVE-2026-47492 and 75 more); install 580.178.04 or newer"),
    ("gpu-hopper", "580.159.03", False, FAIL, "bulletin 5861 (2026-09-30"),
    # At the floor, and above it.
    ("gpu-hopper", "580.178.04", False, PASS,
     "driver 580.178.04 has every fix for R580 (newest: bulletin 5861, 2026-09-30, fixed in "
     "580.178.04)"),
    ("gpu-hopper", "595.91.07", False, PASS, "has every fix for R595"),
    # Debian 12's R535: below 5703/5747/5821's fixes, and R535 ended (5861 does not list it).
    ("gpu-pascal", None, False, FAIL, "driver 535.261.03 is below R535's fixed version "
                                      "535.309.01"),
    ("gpu-pascal", None, False, FAIL, "R535 gets no fixes from bulletin 5861: move to "
                                      "R580 580.178.04"),
    # Accepted by the admin: a warning that says so.
    ("gpu-pascal", None, True, WARN, "(accepted: nvidia_driver_allow_vulnerable)"),
    # An ended branch at its last fix: no floor invented, the bulletins it misses named.
    ("gpu-kepler", None, False, WARN, "driver 470.256.02: R470 gets no fixes from bulletin "
                                      "5586 (2024-10-22: CVE-2024-0126; fixed in R535 "
                                      "535.216.01, R550 550.127.05)"),
    ("gpu-hopper", "550.163.01", False, WARN, "R550 gets no fixes from bulletin 5670"),
    # Only branches that drive the GPUs are offered: Kepler's K80s stop at R470.
    ("gpu-kepler", None, False, WARN, "fixed in R580 580.178.04, R595 595.91.07, R610 610.57.04, "
                                      "R615 615.71.09); move to no branch NVIDIA still fixes "
                                      "drives these GPUs"),
    ("gpu-hopper", "550.163.01", False, WARN, "move to R580 580.178.04, R595 595.91.07"),
    # A branch no bulletin lists yet.
    ("gpu-hopper", "620.10.01", False, PASS, "no NVIDIA bulletin since 2024 lists R620"),
])
def test_driver_security(name, version, allow, status, words):
    finding = run("driver.security", facts(name, _driver(version) if version else None,
                                           allow_vulnerable=allow))
    assert finding.status == status and words in finding.message, finding.message
    assert (finding.remediation is not None) == (status != PASS)


def test_driver_security_offers_only_branches_that_drive_the_gpus():
    # Pascal's last branch is R580 (hardware.py): R595, which 5861 also fixes, is not offered.
    finding = run("driver.security", facts("gpu-pascal", allow_vulnerable=False))
    assert finding.message.endswith("move to R580 580.178.04"), finding.message


def test_driver_security_skips_without_a_driver():
    def no_driver(doc: dict) -> None:
        doc["nvml"] = {"available": False, "error": {"name": "NVML_ERROR_LIBRARY_NOT_FOUND"}}
        doc["kernel_module"] = {}
    assert run("driver.security", facts("gpu-hopper", no_driver)).status == SKIP


def test_cpu_only_node_skips_gpu_checks_and_passes_the_rest():
    results = [ProbeResult(node("cpu-only"), report("cpu-only"))]
    statuses = {f.check: f.status for f in node_findings(results, NODE_CHECKS)}
    assert statuses["host.probe"] == statuses["host.no-cuda-toolkit"] == PASS
    gpu_checks = [c.id for c in NODE_CHECKS if c.gpu_only]
    assert gpu_checks and all(statuses[c] == SKIP for c in gpu_checks)
    assert statuses["nvml.gpu-count"] == SKIP


def _gpu(index: int, **changes):
    def mutate(doc: dict) -> None:
        doc["nvml"]["gpus"][index].update(changes)
    return mutate


def _set(path: str, value):
    def mutate(doc: dict) -> None:
        *parents, last = path.split(".")
        target = doc
        for key in parents:
            target = target[int(key)] if key.isdigit() else target[key]
        target[int(last) if last.isdigit() else last] = value
    return mutate


def _version_mismatch(doc: dict) -> None:
    doc["nvml"].update(available=False, gpus=[], device_count=None, error={
        "code": 18, "name": "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        "message": "RM has detected an NVML/RM version mismatch."})
    doc["summary"]["nvml_healthy_gpu_count"] = 0


def _gpu_lost(doc: dict) -> None:
    doc["nvml"]["gpus"][1] = {"index": 1, "error": {
        "code": 15, "name": "NVML_ERROR_GPU_IS_LOST", "message": "GPU is lost"}}


def _hot(doc: dict) -> None:
    gpu = doc["nvml"]["gpus"][0]
    gpu["temperature"]["current"] = gpu["temperature"]["slowdown"] + 3
    gpu["clock_event_reasons"] = {"mask": 0x68, "names": [
        "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown"]}


def _xid(number: int):
    def mutate(doc: dict) -> None:
        doc["kernel_log"]["xid_events"] = [{"pci": "0000:18:00", "xid": number,
                                            "message": "...", "usec_since_boot": 1}]
        doc["kernel_log"]["xid_count"] = 1
    return mutate


def _cuda_toolkit(doc: dict) -> None:
    doc["packages"]["cuda_toolkit"] = [{"name": "cuda-toolkit-12-4", "version": "12.4.1-1",
                                        "state": "installed", "held": False}]


def _no_nvidia_runtime(doc: dict) -> None:
    doc["container_runtime"]["containerd"].update(nvidia_runtime=False, runtimes={},
                                                  default_is_nvidia=False)


def _os(os_id: str, version: str):
    return _set("host.os", {"id": os_id, "version_id": version})


CASES = [
    # (node, mutation, check, status, words in the message)
    ("gpu-pascal", _version_mismatch, "driver.version-match", FAIL, "version mismatch"),
    ("gpu-pascal", _version_mismatch, "nvml.init", FAIL, "LIB_RM_VERSION_MISMATCH"),
    ("gpu-pascal", _set("kernel_module.version", "535.216.03"), "driver.version-match", FAIL,
     "535.216.03 != library 535.261.03"),
    ("gpu-pascal", _set("kernel_module.version", None), "driver.version-match", PASS,
     "NVML initialised"),
    ("gpu-pascal", _gpu_lost, "nvml.gpu-count", FAIL, "4 GPU(s) on PCI but 3 healthy"),
    ("gpu-pascal", _gpu_lost, "gpu.ecc", PASS, "3 GPU(s)"),
    ("gpu-pascal", _set("pci", []), "nvml.gpu-count", FAIL, "in gpu_nodes but no NVIDIA GPU"),
    ("gpu-pascal", _set("nvml.available", False), "nvml.gpu-count", SKIP, "see nvml.init"),
    ("gpu-pascal", _gpu(2, persistence_mode=False), "gpu.persistence", FAIL, "GPU 2"),
    ("gpu-pascal", _set("nvml.gpus.0.ecc.volatile.uncorrected", 1), "gpu.ecc", FAIL,
     "1 uncorrectable"),
    ("gpu-pascal", _set("nvml.gpus.0.ecc.aggregate.uncorrected", 3), "gpu.ecc", PASS, ""),
    ("gpu-pascal", _set("nvml.gpus.1.retired_pages.pending", True), "gpu.memory-remap", FAIL,
     "page retirement pending"),
    ("gpu-hopper", _set("nvml.gpus.7.remapped_rows.pending", True), "gpu.memory-remap", FAIL,
     "row remap pending"),
    ("gpu-hopper", _set("nvml.gpus.0.remapped_rows.failure", True), "gpu.memory-remap", FAIL,
     "row remapping failed"),
    ("gpu-pascal", _xid(79), "gpu.xid", FAIL, "XID 79 on 0000:18:00 (GPU has fallen off"),
    ("gpu-pascal", _xid(13), "gpu.xid", PASS, "1 XID(s) in all"),
    # Blackwell's NVLink XIDs (nverror.h 595.45.04) and the recovery action one.
    ("gpu-hopper", _xid(145), "gpu.xid", FAIL, "XID 145 on 0000:18:00 (NVLink RLW error"),
    ("gpu-hopper", _xid(149), "gpu.xid", FAIL, "XID 149 on 0000:18:00 (NVLink NETIR error"),
    ("gpu-hopper", _xid(154), "gpu.xid", FAIL, "XID 154 on 0000:18:00 (GPU recovery action"),
    ("gpu-pascal", _set("kernel_log.readable", False), "gpu.xid", SKIP, "run verify as root"),
    ("gpu-pascal", _hot, "gpu.thermal", FAIL, "85 C >= slowdown 82 C"),
    ("gpu-pascal", _set("nvml.gpus.0.clock_event_reasons", {"mask": 8, "names": ["hw_slowdown"]}),
     "gpu.thermal", FAIL, "clocks slowed: hw_slowdown"),
    ("gpu-pascal", _set("nvml.gpus.3.pcie.width_current", 8), "gpu.pcie", WARN, "x8 of x16"),
    ("gpu-pascal", _set("nvml.gpus.3.pcie.gen_current", 1), "gpu.pcie", PASS, ""),  # idle
    ("gpu-pascal", _cuda_toolkit, "host.no-cuda-toolkit", FAIL, "cuda-toolkit-12-4"),
    ("gpu-pascal", _set("packages.manager", None), "host.no-cuda-toolkit", SKIP, ""),
    ("gpu-pascal", _no_nvidia_runtime, "runtime.nvidia", FAIL, "containerd without an 'nvidia'"),
    ("gpu-pascal", _set("container_runtime.binaries.nvidia-container-runtime", None),
     "runtime.nvidia", FAIL, "not installed"),
    ("gpu-pascal", _set("container_runtime.containerd.present", False), "runtime.nvidia", FAIL,
     "no container runtime"),
    ("gpu-kepler", _set("nvml.driver_version", "535.261.03"), "driver.branch", FAIL,
     "not of branch 470"),
    ("gpu-pascal", _os("rocky", "7.9"), "driver.branch", FAIL, "not supported"),
    ("gpu-pascal", _set("probe.errors", {"packages": {"type": "OSError", "message": "boom"}}),
     "host.probe", FAIL, "packages: boom"),
]


@pytest.mark.parametrize(("name", "mutate", "check_id", "status", "words"), CASES,
                         ids=[f"{c[2]}-{i}" for i, c in enumerate(CASES)])
def test_check_on_mutated_report(name, mutate, check_id, status, words):
    finding = run(check_id, facts(name, mutate))
    assert (finding.status, finding.check, finding.node) == (status, check_id, name), finding
    assert words in finding.message
    assert (finding.remediation is not None) == (status in (FAIL, WARN))


def test_pcie_generation_counts_when_the_gpu_is_busy():
    def busy_and_slow(doc):
        doc["nvml"]["gpus"][0]["pcie"]["gen_current"] = 1
        doc["nvml"]["gpus"][0]["clock_event_reasons"] = {"mask": 0, "names": []}
    assert run("gpu.pcie", facts("gpu-pascal", busy_and_slow)).status == WARN


def test_branch_pin_is_honoured_as_the_roles_honour_it():
    # 470 drives a P100 (390-580) and installs on Debian 12: the pin wins, so the loaded
    # 535 driver is the wrong one for this node.
    assert run("driver.branch", facts("gpu-pascal", pin="470")).status == FAIL
    assert run("driver.branch", facts("gpu-pascal", pin="535")).status == PASS
    # Kepler cannot use 535: the role falls back to 470, and so does verify.
    assert run("driver.branch", facts("gpu-kepler", pin="535")).status == PASS


def test_branch_versions_must_agree_across_nodes_of_a_branch():
    hopper = report("gpu-hopper")
    older = copy.deepcopy(hopper)
    older["nvml"]["driver_version"] = "535.216.03"
    fleet = {"gpu-hopper": hopper, "gpu-hopper-2": hopper, "gpu-kepler": report("gpu-kepler")}

    def older_driver(doc):
        doc["nvml"]["driver_version"] = "535.216.03"

    odd = run("driver.branch", facts("gpu-pascal", older_driver, fleet=fleet))
    assert odd.status == FAIL
    assert "gpu-hopper 535.261.03" in odd.message and "gpu-kepler" not in odd.message
    # The majority's nodes pass: the odd one out is where to act.
    fleet_with_odd = {**fleet, "gpu-pascal": older}
    assert run("driver.branch", facts("gpu-hopper", fleet=fleet_with_odd)).status == PASS


def test_a_fleet_s_branches_are_chosen_once_per_node_not_once_per_pair(monkeypatch):
    # driver.branch compares every node with all the others: choosing again for each pair
    # was quadratic (a second of CPU for 1000 nodes).
    from gpuprov.verify.checks import driver

    chosen = []
    expected_branch = driver.expected_branch

    def counted(f):
        chosen.append(f.node.name)
        return expected_branch(f)

    monkeypatch.setattr(driver, "expected_branch", counted)
    names = [f"gpu-hopper-{i:02d}" for i in range(40)]
    results = [ProbeResult(node(n), report("gpu-hopper")) for n in names]
    findings = node_findings(results, [CHECKS["driver.branch"]])
    assert {f.status for f in findings} == {PASS}
    assert all("same on 40 nodes" in f.message for f in findings)
    assert len(chosen) <= 3 * len(names)


def test_every_check_documents_itself():
    for c in CHECKS.values():
        assert c.description and c.remediation and "\n" not in c.description, c.id
        assert c.severity in ("error", "warning")
    assert CHECKS["gpu.pcie"].severity == "warning"


# -- driver.next-boot and host.secure-boot: the boot section of the probe ----------------------

NEWER = "6.1.0-28-amd64"


def _boot(**changes) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        boot = doc["boot"]
        running = boot["running_kernel"]
        if changes.get("newer_kernel"):
            boot["kernels"].append(NEWER)
            boot["next_kernel"] = NEWER
            boot["modules"][NEWER] = changes["newer_kernel"] if changes["newer_kernel"] != "none" \
                else None
        if "secure_boot" in changes:
            boot["secure_boot"] = changes["secure_boot"]
            boot["trusted_keys"] = changes.get("trusted_keys", [])
        if "module" in changes:
            boot["modules"][boot["next_kernel"] or running].update(changes["module"])
        if changes.get("container"):
            boot.update(kernels=[], next_kernel=None, modules={running: None})
    return mutate


def _dkms(kernel: str, version: str) -> dict:
    return {"path": f"/lib/modules/{kernel}/updates/dkms/nvidia.ko", "kind": "dkms",
            "version": version, "signer": None, "sig_key": None, "signed": False, "error": None}


@pytest.mark.parametrize(("mutate", "status", "words"), [
    (None, PASS, "next boot: kernel 6.1.0-27-amd64 has nvidia 535.261.03 (dkms"),
    (_boot(newer_kernel="none"), FAIL,
     "kernel 6.1.0-28-amd64, the one the node boots next, has no nvidia module: the node would "
     "come up without GPUs; run `apt-get install linux-headers-6.1.0-28-amd64 && dkms "
     "autoinstall -k 6.1.0-28-amd64`"),
    (_boot(newer_kernel=_dkms(NEWER, "535.216.03")), FAIL,
     "has nvidia 535.216.03 (/lib/modules/6.1.0-28-amd64/updates/dkms/nvidia.ko) but the "
     "installed driver is 535.261.03"),
    (_boot(newer_kernel=_dkms(NEWER, "535.261.03")), PASS, "kernel 6.1.0-28-amd64 has nvidia"),
    (_boot(container=True), SKIP, "no kernel image in /boot"),
])
def test_next_boot(mutate, status, words):
    finding = run("driver.next-boot", facts("gpu-pascal", mutate))
    assert finding.status == status and words in finding.message, finding.message


def test_next_boot_on_rhel_names_kernel_devel():
    def rhel(doc):
        _boot(newer_kernel="none")(doc)
        doc["host"]["os"].update(id="rocky", id_like="rhel centos fedora", version_id="9.4")
    finding = run("driver.next-boot", facts("gpu-pascal", rhel))
    assert finding.status == FAIL and "dnf install kernel-devel-6.1.0-28-amd64" in finding.message


SIGNED = {"signed": True, "signer": "DKMS module signing key", "sig_key": "12:34:56:78"}
DKMS_KEY = ("DKMS module signing key: a1b2c3d4e5f60718293a4b5c6d7e8f9012345678: "
            "X509.rsa 12345678 []")
DEBIAN_CA = ("Debian Secure Boot CA: 6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1: "
             "X509.rsa 4c6c0d1f []")


@pytest.mark.parametrize(("mutate", "status", "words"), [
    (None, PASS, "Secure Boot not in use"),
    (_boot(secure_boot=False), PASS, "Secure Boot off"),
    (_boot(secure_boot=True, trusted_keys=[DEBIAN_CA]), FAIL,
     "is unsigned: the kernel will refuse to load it; sign DKMS builds with a Machine Owner Key"),
    (_boot(secure_boot=True, trusted_keys=[DEBIAN_CA], module=SIGNED), FAIL,
     "signed by DKMS module signing key (key 12:34:56:78), a key the kernel does not trust"),
    (_boot(secure_boot=True, trusted_keys=[DEBIAN_CA, DKMS_KEY], module=SIGNED), PASS,
     "signed by DKMS module signing key, trusted (DKMS module signing key: a1b2"),
    (_boot(secure_boot=True, newer_kernel="none"), SKIP, "has no nvidia module to check"),
])
def test_secure_boot(mutate, status, words):
    finding = run("host.secure-boot", facts("gpu-pascal", mutate))
    assert finding.status == status and words in finding.message, finding.message
    if status == FAIL:
        assert "mokutil --import" in finding.remediation


# -- gpu.mig ---------------------------------------------------------------------------------
def _mig(gpus: dict[int, dict]) -> Callable[[dict], None]:
    """Give the recorded gpu-hopper's GPUs these MIG states (the probe's shape, tested against
    the simulated NVML in test_simnvml_mig.py)."""
    def mutate(doc: dict) -> None:
        for index, state in gpus.items():
            doc["nvml"]["gpus"][index]["mig"] = state
    return mutate


def _on(*profiles: str, pending: bool = True) -> dict:
    return {"current": True, "pending": pending, "devices": [
        {"index": i, "uuid": f"MIG-{i}", "profile": p} for i, p in enumerate(profiles)]}


def _declared(config: str | None, configs=None):
    def build(doc_name: str, mutate) -> NodeFacts:
        own = facts(doc_name, mutate)
        return NodeFacts(dataclasses.replace(own.node, mig_config=config, mig_configs=configs),
                         own.report)
    return build


@pytest.mark.parametrize(("config", "gpus", "status", "words"), [
    (None, {}, PASS, "0 of 8 MIG-capable GPU(s) in MIG mode, 0 MIG device(s)"),
    (None, {3: {"current": False, "pending": True, "devices": []}}, FAIL,
     "GPU 3 (00000000:5D:00.0): MIG mode off, on after a reset (pending): reset the GPU "
     "(nvidia-smi -r -i 3) or reboot"),
    ("all-1g.10gb", {i: _on(*["1g.10gb"] * 7) for i in range(8)}, PASS,
     "layout all-1g.10gb: 8 of 8 MIG-capable GPU(s) in MIG mode, 56 MIG device(s)"),
    ("all-1g.10gb", {i: _on(*["1g.10gb"] * (6 if i == 5 else 7)) for i in range(8)}, FAIL,
     "MIG devices {'1g.10gb': 6}, the layout wants {'1g.10gb': 7}"),
    ("all-1g.10gb", {}, FAIL, "8 of 8 GPU(s) not as declared"),
    ("all-disabled", {0: _on("3g.40gb")}, FAIL, "MIG mode on, the layout wants it off"),
    ("all-enabled", {i: _on() for i in range(8)}, PASS, "8 of 8 MIG-capable GPU(s) in MIG mode"),
    ("all-balanced", {i: _on("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb") for i in range(8)},
     PASS, "32 MIG device(s)"),
    ("all-10gb", {}, FAIL, "gpu_mig_config 'all-10gb': no MIG layout 'all-10gb'"),
])
def test_mig_layout(config, gpus, status, words):
    finding = run("gpu.mig", _declared(config)("gpu-hopper", _mig(gpus)))
    assert finding.status == status and words in finding.message, finding.message


def test_mig_layout_from_the_sites_own_configs():
    configs = {"version": "v1", "mig-configs": {"inference": [
        {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}},
        {"devices": "all", "mig-enabled": False}]}}
    gpus = {0: _on(*["1g.10gb"] * 7), 1: _on(*["1g.10gb"] * 7)}
    finding = run("gpu.mig", _declared("inference", configs)("gpu-hopper", _mig(gpus)))
    assert finding.status == PASS and "14 MIG device(s)" in finding.message, finding.message
    broken = {"version": "v2", "mig-configs": {}}
    finding = run("gpu.mig", _declared("inference", broken)("gpu-hopper", _mig(gpus)))
    assert finding.status == FAIL and "mig-parted's format" in finding.message


def test_mig_layout_on_gpus_without_mig():
    assert run("gpu.mig", facts("gpu-pascal")).status == SKIP
    # A layout that turns MIG on where no GPU can: nothing applies (mig-parted's filters).
    assert run("gpu.mig", _declared("all-1g.10gb")("gpu-pascal", None)).status == SKIP


# -- k8s.allocatable with MIG: what the device plugin offers per strategy -----------------------
@pytest.mark.parametrize(("strategy", "gpus", "expected"), [
    ("none", {0: _on(*["1g.10gb"] * 7)}, {"nvidia.com/gpu": 8}),
    ("mixed", {}, {"nvidia.com/gpu": 8}),
    ("mixed", {0: _on(*["1g.10gb"] * 7), 1: _on("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"),
               2: _on("1g.10gb+me")},
     {"nvidia.com/gpu": 5, "nvidia.com/mig-1g.10gb": 9, "nvidia.com/mig-2g.20gb": 1,
      "nvidia.com/mig-3g.40gb": 1, "nvidia.com/mig-1g.10gb.me": 1}),
    ("single", {i: _on(*["1g.10gb"] * 7) for i in range(8)}, {"nvidia.com/gpu": 56}),
    ("single", {0: _on(*["1g.10gb"] * 7)}, {"nvidia.com/gpu": 0}),  # MIG on and off: nothing
    # NVIDIA's plugin refuses these under single too (internal/rm/device_map.go): nothing.
    ("single", {i: _on("3g.40gb", "3g.40gb") if i else _on(*["1g.10gb"] * 7) for i in range(8)},
     {"nvidia.com/gpu": 0}),
    ("single", {i: _on() if i == 3 else _on(*["1g.10gb"] * 7) for i in range(8)},
     {"nvidia.com/gpu": 0}),
])
def test_expected_resources_per_mig_strategy(strategy, gpus, expected):
    from gpuprov.verify.checks import k8s

    doc = report("gpu-hopper")
    _mig(gpus)(doc)
    assert k8s.expected_resources(doc, strategy) == expected


def _allocatable_finding(strategy: str, gpus: dict, allocatable: dict):
    from gpuprov.verify.facts import ClusterFacts

    doc = report("gpu-hopper")
    _mig(gpus)(doc)
    doc["summary"]["nvml_healthy_gpu_count"] = 8
    node_ = dataclasses.replace(node("gpu-hopper"), mig_strategy=strategy)
    k8s_node = {"metadata": {"name": "gpu-hopper"},
                "status": {"allocatable": allocatable, "capacity": allocatable}}
    return run("k8s.allocatable", ClusterFacts(node_, doc, k8s_node))


def test_allocatable_counts_mig_devices_under_mixed():
    partitioned = {0: _on(*["1g.10gb"] * 7)}
    finding = _allocatable_finding("mixed", partitioned, {
        "nvidia.com/gpu": "7", "nvidia.com/mig-1g.10gb": "7", "cpu": "8"})
    assert finding.status == PASS, finding.message
    assert "nvidia.com/gpu 7, nvidia.com/mig-1g.10gb 7 (mig strategy mixed)" in finding.message
    missing = _allocatable_finding("mixed", partitioned, {"nvidia.com/gpu": "8"})
    assert missing.status == FAIL and "allocatable nvidia.com/gpu 8 != 7; allocatable " \
        "nvidia.com/mig-1g.10gb 0 != 7 (NVML's MIG devices under mig strategy mixed)" \
        in missing.message, missing.message
    stale = _allocatable_finding("mixed", {}, {"nvidia.com/gpu": "8",
                                               "nvidia.com/mig-1g.10gb": "7"})
    assert stale.status == FAIL and "nvidia.com/mig-1g.10gb 7 != 0" in stale.message


@pytest.mark.parametrize(("gpus", "words"), [
    ({0: _on(*["1g.10gb"] * 7)}, "MIG is on for 1 of 8 GPUs"),
    ({i: _on("3g.40gb", "3g.40gb") if i else _on(*["1g.10gb"] * 7) for i in range(8)},
     "more than one MIG profile (1g.10gb, 3g.40gb)"),
    ({i: _on() if i == 3 else _on(*["1g.10gb"] * 7) for i in range(8)},
     "GPU(s) 3 in MIG mode without MIG devices"),
])
def test_allocatable_fails_where_the_single_strategy_refuses_the_layout(gpus, words):
    # The plugin offers nothing, and nothing is expected: still a failure, not a pass at 0.
    finding = _allocatable_finding("single", gpus, {"nvidia.com/gpu": "0"})
    assert finding.status == FAIL and words in finding.message, finding.message
    assert "use the mixed strategy" in finding.message
