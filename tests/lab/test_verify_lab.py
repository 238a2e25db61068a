"""`gpuprov verify` against the lab after site.yml: passes when healthy, and each fault fails
the right check on the right node and nothing on the others; bad input is exit 2; nothing of
the smoke tests is left behind, Ctrl-C included."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import clear_faults, kube_api
from kubernetes import client

from gpuprov.lab import nodefaults, podman, simhw
from gpuprov.nvidia import driver_lifecycle, mig
from gpuprov.verify import pods
from gpuprov.verify import runner as _registered  # noqa: F401 (registers every check in CHECKS)
from gpuprov.verify.findings import CHECKS

GPU_NODES = ("gpu-kepler", "gpu-pascal", "gpu-hopper")
# driver.branch-eol warns where the lab's branch is past NVIDIA's end of life (470, 535): it is
# checked on its own (test_healthy_lab_...), not as a pass.
EOL = "driver.branch-eol"
# A lab node is a container: no kernel image in /boot, so the kernel it boots next is unknown
# and driver.next-boot skips (the fault next-kernel-no-module gives it one, a real release).
NEXT_BOOT = "driver.next-boot"
# gpu.mig skips on the GPUs without MIG (K80, P100) and passes on gpu-hopper's H100s.
MIG = "gpu.mig"
# driver.security warns on Debian 12's 470 and 535 (accepted by the lab's inventory:
# nvidia_driver_allow_vulnerable) and passes on gpu-hopper's fixed R580: checked on its own.
SECURITY = "driver.security"
# A Kubernetes node's checks (the Docker hosts' container and swarm phases are another lab's).
# The lab's GPU nodes run the device plugin here (gpu_allocation's default): the dra.* checks
# skip on them (tests/lab/test_dra_switch_lab.py has a DRA node).
DRA_CHECKS = {c for c in CHECKS if c.startswith("dra.")}
EVERY_CHECK = {c for c, spec in CHECKS.items() if spec.phase in ("node", "cluster", "pod")} \
    - {"pods.cuda-compat", EOL, NEXT_BOOT, MIG, SECURITY} - DRA_CHECKS  # --image
# Read at import: without the registration above it was empty whenever this module was
# collected before any module that imports the checks (the tests below then compared nothing).
assert len(EVERY_CHECK) > 20 and "k8s.health" in EVERY_CHECK, EVERY_CHECK
assert len(DRA_CHECKS) >= 9, DRA_CHECKS


@pytest.fixture(scope="module")
def converged(site_run):
    rc, _ = site_run
    assert rc == 0, "site.yml failed on the lab; see test_site_playbook"


@pytest.fixture(scope="module")
def verify(lab, converged):
    def _run(*argv: str, timeout: float = 600) -> tuple[int, dict | None, str]:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuprov", "verify", "-i", str(lab.inventory_path), *argv],
            capture_output=True, text=True, timeout=timeout,
        )
        doc = json.loads(proc.stdout) if "--json" in argv and proc.stdout.strip() else None
        return proc.returncode, doc, proc.stdout + proc.stderr
    return _run


@pytest.fixture(scope="module")
def core(lab, converged):
    return client.CoreV1Api(kube_api(lab))


def _allocatable(core) -> dict[str, str | None]:
    return {n.metadata.name: (n.status.allocatable or {}).get(pods.GPU_RESOURCE)
            for n in core.list_node().items}


@pytest.fixture
def restores_the_cluster(lab, core):
    """For a test that breaks a node: afterwards clear every fault and wait (30 s at most)
    until every node offers the GPUs it offered before, so that the next test starts from a
    settled cluster. The emulated kubelet, like a real one, sees a change within seconds, not
    at once: CI once saw gpu-pascal offer 0 GPUs in the test after the one that took its
    NVIDIA runtime away for a moment."""
    before = _allocatable(core)
    yield
    clear_faults(lab)
    deadline = time.monotonic() + 30
    while (after := _allocatable(core)) != before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert after == before, f"the cluster did not settle back within 30 s: {before} -> {after}"


def _failed(doc: dict) -> set[tuple[str, str]]:
    return {(r["node"], r["check"]) for r in doc["results"] if r["status"] == "fail"}


def _problems(doc: dict | None, out: str) -> str:
    """The results that neither passed nor were skipped, one per line (the whole report is
    too long for CI's excerpt of a failure)."""
    if doc is None:
        return out
    return "\n".join(f"{r['node']} {r['check']} {r['status']}: {r['message']}"
                     for r in doc["results"] if r["status"] not in ("pass", "skip"))


def _verify_namespaces(core) -> list[str]:
    return [n.metadata.name for n in core.list_namespace().items
            if n.metadata.name.startswith(pods.NAMESPACE_PREFIX)]


def _smoke_pods(core) -> list[str]:
    return [p.metadata.name for p in core.list_pod_for_all_namespaces(
        label_selector="app.kubernetes.io/name=gpuprov-smoke").items]


def test_healthy_lab_passes_every_check_on_every_gpu_node(verify, core):
    rc, doc, out = verify("--json")
    assert rc == 0, _problems(doc, out)
    for node in GPU_NODES:
        got = {r["check"]: r["status"] for r in doc["results"] if r["node"] == node}
        assert set(got) >= EVERY_CHECK, node
        assert {c: got[c] for c in EVERY_CHECK} == dict.fromkeys(EVERY_CHECK, "pass"), node
        assert {c: got[c] for c in DRA_CHECKS} == dict.fromkeys(DRA_CHECKS, "skip"), node
    # Debian 12's 470 and 535 are past NVIDIA's end of life (2024-07, 2026-06): warnings, exit
    # 0; gpu-hopper's R580 LTSB passes until 90 days before its end (2028-06).
    eol = {r["node"]: r for r in doc["results"] if r["check"] == EOL}
    assert eol["gpu-kepler"]["status"] == eol["gpu-pascal"]["status"] == "warn"
    assert "R535 (long term support branch) reached NVIDIA's end of life 2026-06: move to " \
        "R580" in eol["gpu-pascal"]["message"]
    ending = driver_lifecycle.eol_note(580, datetime.date.today())
    assert eol["gpu-hopper"]["status"] == ("warn" if ending else "pass"), eol["gpu-hopper"]
    security = {r["node"]: r for r in doc["results"] if r["check"] == SECURITY}
    assert security["gpu-hopper"]["status"] == "pass", security["gpu-hopper"]
    assert security["gpu-hopper"]["message"].startswith(
        "driver 580.178.04 has every fix for R580 (newest: bulletin 5861")
    assert security["gpu-pascal"]["status"] == "warn"
    assert security["gpu-pascal"]["message"].startswith(
        "driver 535.261.03 is below R535's fixed version 535.309.01")
    assert security["gpu-pascal"]["message"].endswith(
        "(accepted: nvidia_driver_allow_vulnerable)")
    assert security["gpu-kepler"]["status"] == "warn"
    assert security["gpu-kepler"]["message"].startswith(
        "driver 470.256.02: R470 gets no fixes from bulletin 5586")
    mig = {r["node"]: r for r in doc["results"] if r["check"] == MIG}
    assert mig["gpu-hopper"]["status"] == "pass" and mig["gpu-hopper"]["message"] == \
        "0 of 8 MIG-capable GPU(s) in MIG mode, 0 MIG device(s), no mode change pending"
    assert mig["gpu-kepler"]["status"] == mig["gpu-pascal"]["status"] == "skip"
    pascal = {r["check"]: r for r in doc["results"] if r["node"] == "gpu-pascal"}
    assert pascal[NEXT_BOOT]["status"] == "skip"
    assert "no kernel image in /boot" in pascal[NEXT_BOOT]["message"]
    assert len(pascal["pods.gpu-count"]["details"]["seen"]) == 4
    assert len(pascal["pods.isolation"]["details"]["pods"]) == 4
    assert _verify_namespaces(core) == [] and _smoke_pods(core) == []


@pytest.mark.parametrize(("node", "fault", "check"), [
    ("gpu-pascal", "version-mismatch", "driver.version-match"),
    ("gpu-hopper", "gpu-lost", "nvml.gpu-count"),
    ("gpu-kepler", "ecc-uncorrectable", "gpu.ecc"),
    ("gpu-pascal", "hot-gpu", "gpu.thermal"),
    ("gpu-hopper", "xid-79", "gpu.xid"),
    ("gpu-hopper", "plugin-unregistered", "k8s.allocatable"),
    ("gpu-pascal", "next-kernel-no-module", NEXT_BOOT),
])
def test_fault_fails_its_check_on_its_node_only(lab, verify, restores_the_cluster, node, fault,
                                                 check):
    lab.fault(node, fault)
    if fault == "plugin-unregistered":  # the emulator's device plugin notices within a tick
        time.sleep(2)
    rc, doc, out = verify("--json", "--no-pods")
    assert rc == 1, _problems(doc, out)
    failed = _failed(doc)
    assert (node, check) in failed, failed
    assert {n for n, _ in failed} == {node}, failed
    others = [r for r in doc["results"] if r["node"] != node]
    assert others and all(r["status"] in ("pass", "skip") for r in others
                          if r["check"] not in (EOL, SECURITY))
    # Accepted vulnerable drivers warn; cpu-only has no driver to check (skip).
    assert {r["status"] for r in others if r["check"] == SECURITY} <= {"pass", "warn", "skip"}
    if check == NEXT_BOOT:
        release = nodefaults.next_kernel(lab.require().node(node).container)
        message = next(r["message"] for r in doc["results"]
                       if (r["node"], r["check"]) == (node, check))
        assert f"kernel {release}, the one the node boots next, has no nvidia module" \
            in message and f"apt-get install linux-headers-{release}" in message, message


def test_double_allocate_fails_isolation(lab, verify, restores_the_cluster, core):
    lab.fault("gpu-pascal", "double-allocate")
    rc, doc, out = verify("--json", "--limit", "gpu-pascal", "--checks", "pods")
    assert rc == 1, out
    assert _failed(doc) == {("gpu-pascal", "pods.isolation")}
    assert _verify_namespaces(core) == []


def test_hand_edited_label_fails_labels(verify, core):
    node = core.read_node("gpu-kepler")
    original = node.metadata.labels["gputype"]
    core.patch_node("gpu-kepler", {"metadata": {"labels": {"gputype": "p100"}}})
    try:
        rc, doc, out = verify("--json", "--no-pods")
    finally:
        core.patch_node("gpu-kepler", {"metadata": {"labels": {"gputype": original}}})
    assert rc == 1, out
    assert _failed(doc) == {("gpu-kepler", "k8s.labels")}
    diff = next(r for r in doc["results"] if r["check"] == "k8s.labels"
                and r["node"] == "gpu-kepler")["details"]["diff"]
    assert diff == {"gputype": {"actual": "p100", "expected": original}}


def test_cuda_toolkit_package_fails_no_cuda_toolkit(verify, node_connection):
    conn = node_connection("gpu-hopper")
    # A package named like NVIDIA's toolkit (whose repository is unreachable here), installed
    # with the node's real dpkg: what the check reads.
    conn.run("set -e; d=$(mktemp -d); mkdir $d/DEBIAN; printf '%s\\n' 'Package: cuda-toolkit-12-4' "
             "'Version: 12.4.1-1' 'Architecture: all' 'Maintainer: gpuprov tests <t@invalid>' "
             "'Description: stand-in for the CUDA toolkit' > $d/DEBIAN/control; "
             "dpkg-deb --build $d /tmp/cuda-toolkit.deb >/dev/null; dpkg -i /tmp/cuda-toolkit.deb",
             hide=True, in_stream=False)
    try:
        rc, doc, out = verify("--json", "--no-pods", "--limit", "gpu-hopper")
    finally:
        conn.run("dpkg -r cuda-toolkit-12-4", hide=True, in_stream=False)
    assert rc == 1, out
    assert _failed(doc) == {("gpu-hopper", "host.no-cuda-toolkit")}


def test_nvidia_runtime_removed_fails_runtime_check(verify, node_connection, restores_the_cluster):
    conn = node_connection("gpu-pascal")
    drop_ins = conn.run("grep -l nvidia-container-runtime /etc/containerd/conf.d/*.toml",
                        hide=True, in_stream=False, warn=True).stdout.split()
    assert drop_ins, "site.yml left no containerd drop-in with the nvidia runtime"
    conn.run(f"mkdir -p /root/aside && mv {' '.join(drop_ins)} /root/aside/",
             hide=True, in_stream=False)
    try:
        rc, doc, out = verify("--json", "--no-pods", "--limit", "gpu-pascal")
    finally:
        conn.run("mv /root/aside/*.toml /etc/containerd/conf.d/", hide=True, in_stream=False)
    assert rc == 1, out
    assert ("gpu-pascal", "runtime.nvidia") in _failed(doc)
    assert {n for n, _ in _failed(doc)} == {"gpu-pascal"}


def test_stopped_node_is_exit_3_and_the_others_are_fully_checked(lab, verify,
                                                                  restores_the_cluster):
    container = lab.require().node("gpu-kepler").container
    podman.podman("stop", "--time", "2", container)
    try:
        rc, doc, out = verify("--json", "--no-pods", "--timeout", "10")
    finally:
        lab.up()  # starts the stopped container again and waits for its SSH
    assert rc == 3, _problems(doc, out)
    kepler = {r["check"]: r["status"] for r in doc["results"] if r["node"] == "gpu-kepler"}
    assert kepler["host.probe"] == "error"
    for node in ("gpu-pascal", "gpu-hopper"):
        got = {r["check"]: r["status"] for r in doc["results"] if r["node"] == node}
        node_checks = {c for c, spec in CHECKS.items()
                       if spec.phase in ("node", "cluster") and c not in (EOL, NEXT_BOOT, MIG)
                       and c not in DRA_CHECKS}
        expected = dict.fromkeys(node_checks, "pass")
        # Debian 12's 535 on gpu-pascal is below NVIDIA's fixes, accepted by the lab inventory.
        expected[SECURITY] = "pass" if node == "gpu-hopper" else "warn"
        assert {c: got[c] for c in node_checks} == expected, node
        assert got[MIG] == ("pass" if node == "gpu-hopper" else "skip"), node


@pytest.mark.parametrize(("argv", "words"), [
    (["--limit", "no-such-node"], "matches none of"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "does not exist"),
    (["--context", "prod"], "context 'prod' is not in"),
    (["--checks", "gpu.nope"], "unknown check 'gpu.nope'"),
])
def test_bad_input_is_one_line_and_exit_2(verify, argv, words):
    rc, _, out = verify(*argv)
    assert rc == 2, out
    assert words in out and len(out.strip().splitlines()) == 1, out


def test_missing_inventory_is_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "verify", "-i",
                           str(tmp_path / "nope.yml")], capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_sigint_during_the_pod_phase_leaves_nothing_behind(lab, converged, core):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuprov", "verify", "-i", str(lab.inventory_path),
         "--checks", "pods"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _smoke_pods(core):
        time.sleep(0.2)
    assert _smoke_pods(core), "no smoke pod appeared within 60 s"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert _verify_namespaces(core) == [] and _smoke_pods(core) == []


def test_status_shows_every_gpu(lab, converged):
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "status", "-i",
                           str(lab.inventory_path), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    counts = {n["node"]: len(n["gpus"]) for n in json.loads(proc.stdout)["nodes"]}
    assert counts == {"gpu-kepler": 2, "gpu-pascal": 4, "gpu-hopper": 8, "cpu-only": 0}


def test_unreachable_api_server_is_exit_2(verify, tmp_path):
    dead = Path(tmp_path) / "dead-kubeconfig"
    dead.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n"
                    "    server: http://127.0.0.1:9\ncontexts:\n- name: c\n  context:\n"
                    "    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n"
                    "  user: {}\n")
    rc, _, out = verify("--kubeconfig", str(dead))
    assert rc == 2 and "unreachable" in out and len(out.strip().splitlines()) == 1, out


MIG_OPS = Path(__file__).resolve().parents[1] / "unit" / "simnvml_mig_ops.py"


def _mig_ops(lab, node: str, gpu: int, *ops) -> list:
    """NVML MIG calls against a lab node's simulated driver, from this machine: the MIG state
    the node's driver keeps is the node's .lab/nodes/<node>/mig (simhw.MIG_STATE_DIR), which
    the node sees at /var/lib/gpuprov-sim/mig. (The MIG stage that does this on the node with
    cordon and eviction is not built yet: issue 20.)"""
    node_dir = lab.node_dir(node)
    env = {**{k: v for k, v in os.environ.items() if k != "GPUPROV_SIM_CONTAINER_GPUS"},
           "LD_LIBRARY_PATH": str(lab.dir / "nvml"), "GPUPROV_SIM_DIR": str(node_dir / "sim"),
           "GPUPROV_SIM_STATE_DIR": str(node_dir / simhw.MIG_STATE_DIR)}
    proc = subprocess.run([sys.executable, str(MIG_OPS), json.dumps(
        {"gpu": gpu, "ops": [list(op) for op in ops]})], env=env, capture_output=True,
        text=True, timeout=60, check=True)
    return json.loads(proc.stdout)


def test_a_partitioned_gpu_shows_in_verify_and_status(lab, verify):
    one_g = mig.model_of(0x2330).profile("1g.10gb").nvml_index
    results = _mig_ops(lab, "gpu-hopper", 0, ("set_mode", 1), *[("create", one_g)] * 7)
    try:
        assert results == [0, 1, 2, 3, 4, 5, 6, 7], results
        rc, doc, out = verify("--json", "--no-pods", "--limit", "gpu-hopper", "--checks",
                              "gpu.mig")
        finding = next(r for r in doc["results"] if r["check"] == MIG)
        assert rc == 0 and finding["status"] == "pass", out
        assert finding["message"] == \
            "1 of 8 MIG-capable GPU(s) in MIG mode, 7 MIG device(s), no mode change pending"
        status = subprocess.run(
            [sys.executable, "-m", "gpuprov", "status", "-i", str(lab.inventory_path), "--limit",
             "gpu-hopper"], capture_output=True, text=True, timeout=120)
        assert status.returncode == 0, status.stdout + status.stderr
        lines = status.stdout.splitlines()
        gpu0 = next(i for i, line in enumerate(lines) if "NVIDIA H100 80GB HBM3 [MIG]" in line)
        assert all("MIG 1g.10gb (MIG-" in line for line in lines[gpu0 + 1:gpu0 + 8]), lines
        assert "[MIG]" not in lines[gpu0 + 8]
    finally:
        assert _mig_ops(lab, "gpu-hopper", 0, ("destroy_all",), ("set_mode", 0)) == [0, 0]
