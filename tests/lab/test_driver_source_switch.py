"""A driver source switch and a branch move on one lab node, through
`playbooks/upgrade-driver.yml`, as an admin does them: change the node's settings in the
inventory, run the playbook.

Its own lab: one gpu-hopper node on Debian 12, so that it starts from Debian's own driver.
  1. site.yml: Debian's 535 (bookworm), held;
  2. nvidia_driver_source: nvidia, nvidia_driver_branch: 580: NVIDIA's repository for
     debian12 (the lab's signed mirror), its version-lock package, the holds released;
     then NVIDIA's driver bulletins (issue 32) on it, the node's acceptance of Debian 12's
     vulnerable drivers dropped from the inventory, in order:
       a. NVIDIA's 580 is 580.178.04, R580's fixed version: driver.security passes
       b. upgrade-driver.yml to 580.105.08: refused before the node is cordoned (a pin below
          the branch's security floor), nothing changes
       c. the same with nvidia_driver_allow_vulnerable: done, every run warns; verify (whose
          inventory does not accept it) fails driver.security naming bulletin 5861's CVEs
       d. upgrade-driver.yml without a version: the node below its branch's floor is not "at
          the target", it gets the branch's newest (580.178.04), driver.security passes again,
          and the node has the branch's version-lock package, not the version's;
  3. nvidia_driver_branch: 590: the lock package of 590 replaces 580's, the driver moves;
  4. both settings removed: back to Debian's 535, NVIDIA's lock package and the role's
     repository files gone, held again.
After each step the simulated NVML reports the version that got installed, and the node is
schedulable again (the upgrade role's verify passed on it). Steps 2a-2d and 5 run here rather
than on the session lab, whose worker is the suite's longest: this lab's is done early.
  5. a kernel the node boots next without a module (a real release of the node's archive, the
     lab's fault next-kernel-no-module): verify's driver.next-boot fails; the driver stage
     installs that release's real headers from Debian and DKMS really builds Debian's 535
     module for it (minutes: issue 19 asks for this, not a switched result); verify passes and
     a second run changes nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml
from conftest import (
    clear_faults,
    connect,
    installed_packages,
    kube_api,
    node_target,
    playbook_failures,
    recheck_health,
    run_playbook,
    temporary_lab,
)
from kubernetes import client

from gpuprov.lab import cudarepo, nodefaults
from gpuprov.lab.lab import Lab
from gpuprov.nvidia import driver_advisories

pytestmark = pytest.mark.lab

NODE = "gpu-hopper"
# Written out, not read from the role or the mirror.
DEBIAN_535 = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1"]
NVIDIA = ["nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1",
          "nvidia-persistenced"]
UPGRADE = "playbooks/upgrade-driver.yml"
VULNERABLE, FIXED = cudarepo.VULNERABLE_580, cudarepo.FIXED_580  # 580.105.08-1, 580.178.04-1
DRIVER_PACKAGES = ("nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi")


@pytest.fixture(scope="module")
def switch_lab(tmp_path_factory):
    yield from temporary_lab(tmp_path_factory, "switchlab", "--nodes", f"{NODE}@debian-12")


def _set_host_vars(lab: Lab, **values: str | bool | None) -> None:
    """The admin's edit of the inventory (what the upgrade's verify step reads too); None
    removes the setting."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    hosts = doc["all"]["children"]["k8s_cluster"]["children"]["gpu_nodes"]["hosts"]
    hosts[NODE].update({k: v for k, v in values.items() if v is not None})
    for key in [k for k, v in values.items() if v is None]:
        hosts[NODE].pop(key, None)
    lab.inventory_path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _node(lab: Lab) -> tuple[dict, str, str]:
    """(packages, NVML's driver version per nvidia-smi, the lab's apt sources files). Also
    checks that the toolkit's CDI spec follows the driver: NVIDIA's nvidia-cdi-refresh runs
    on every toolkit >= 1.18 node (legacy mode too), and the driver role re-runs it after a
    driver change, as its .path unit does when DKMS rewrites the module index (which the
    lab's packages never do: without the role's refresh the spec keeps the old driver)."""
    with connect(node_target(lab, NODE)) as conn:
        packages = installed_packages(conn)
        # The lab's nvidia-smi (NVML's view): Debian's real one refuses the simulated NVML.
        smi = conn.run("/opt/gpuprov-sim/bin/nvidia-smi --query-gpu=driver_version "
                       "--format=csv,noheader", hide=True, in_stream=False).stdout.split()
        sources = conn.run("ls /etc/apt/sources.list.d/ /etc/apt/keyrings/", hide=True,
                           in_stream=False).stdout
        spec = conn.run("cat /var/run/cdi/nvidia.yaml", hide=True, in_stream=False).stdout
    assert len(set(smi)) == 1 and len(smi) == 8, smi
    assert set(re.findall(r"libnvidia-ml\.so\.(\d+\.\d+\.\d+)", spec)) == {smi[0]}, spec
    return packages, smi[0], sources


def _upgrade(lab: Lab) -> dict:
    rc, doc = run_playbook(lab, "playbooks/upgrade-driver.yml")
    assert rc == 0, playbook_failures(doc)
    assert doc["stats"][NODE]["changed"] > 0
    return doc


@pytest.fixture(scope="module")
def from_debian(switch_lab):
    rc, doc = run_playbook(switch_lab, "site.yml")
    assert rc == 0, playbook_failures(doc)
    return _node(switch_lab)


@pytest.fixture(scope="module")
def to_nvidia_580(switch_lab, from_debian):
    _set_host_vars(switch_lab, nvidia_driver_source="nvidia", nvidia_driver_branch="580")
    _upgrade(switch_lab)
    return _node(switch_lab)


def _security(lab: Lab) -> dict:
    """verify's driver.security finding (node phase only: the cluster and pod phases belong
    to the session lab's test_verify_lab)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprov", "verify", "-i", str(lab.inventory_path), "--limit",
         NODE, "--skip", "k8s,pods", "--json"],
        capture_output=True, text=True, timeout=300, check=False)
    doc = json.loads(proc.stdout)
    (finding,) = [r for r in doc["results"] if r["check"] == "driver.security"]
    print(f"verify --limit {NODE}: exit {proc.returncode}; driver.security {finding['status']}: "
          f"{finding['message']}")
    return {**finding, "rc": proc.returncode}


def _driver(lab: Lab) -> dict[str, str]:
    with connect(node_target(lab, NODE)) as conn:
        packages = installed_packages(conn)
    return {name: packages[name][0] for name in (*DRIVER_PACKAGES, "nvidia-driver-pinning-580",
                                                 "nvidia-driver-pinning-580.105.08")
            if name in packages}


def _k8s_node(lab: Lab):
    return client.CoreV1Api(kube_api(lab)).read_node(NODE)


def _warnings(doc: dict) -> list[str]:
    return [result.get("msg", "") for play in doc["plays"] for task in play["tasks"]
            if task["task"]["name"].endswith("Warn that the installed driver lacks NVIDIA's "
                                             "security fixes")
            for host, result in task["hosts"].items()
            if host == NODE and not result.get("skipped")]


@pytest.fixture(scope="module")
def security_story(switch_lab, to_nvidia_580):
    """Step 2's bulletins story: each step's outcome, in order (a failed step stops it). On
    NVIDIA's fixed 580 the node no longer needs Debian 12's acceptance of vulnerable drivers:
    the admin drops it, and gives it back after (Debian's 535 comes back in step 4)."""
    lab = switch_lab
    _set_host_vars(lab, nvidia_driver_allow_vulnerable=None)
    steps = {"start": (_driver(lab), _security(lab))}
    rc, doc = run_playbook(lab, UPGRADE, "--limit", NODE, "-e",
                           f"nvidia_driver_version={VULNERABLE}")
    steps["refused"] = (rc, playbook_failures(doc), _driver(lab), _k8s_node(lab))
    rc, doc = run_playbook(lab, UPGRADE, "--limit", NODE, "-e",
                           f"nvidia_driver_version={VULNERABLE}", "-e",
                           "nvidia_driver_allow_vulnerable=true")
    assert rc == 0, playbook_failures(doc)
    steps["vulnerable"] = (_warnings(doc), _driver(lab), _security(lab))
    rc, doc = run_playbook(lab, UPGRADE, "--limit", NODE)
    assert rc == 0, playbook_failures(doc)
    steps["fixed"] = (_warnings(doc), _driver(lab), _security(lab), _k8s_node(lab))
    _set_host_vars(lab, nvidia_driver_allow_vulnerable=True)
    return steps


@pytest.fixture(scope="module")
def to_590(switch_lab, to_nvidia_580, security_story):
    _set_host_vars(switch_lab, nvidia_driver_branch="590")
    _upgrade(switch_lab)
    return _node(switch_lab)


@pytest.fixture(scope="module")
def back_to_debian(switch_lab, to_590):
    _set_host_vars(switch_lab, nvidia_driver_source=None, nvidia_driver_branch=None)
    _upgrade(switch_lab)
    return _node(switch_lab)


def test_the_node_starts_with_debians_535_held(from_debian):
    packages, nvml, sources = from_debian
    assert nvml.startswith("535.")
    for name in DEBIAN_535:
        version, selection = packages[name]
        assert version.startswith("535.") and selection == "hold", (name, packages[name])
    assert "gpuprov-nvidia-cuda.sources" not in sources


def test_switching_to_nvidias_repository_installs_its_580_and_releases_the_holds(to_nvidia_580):
    packages, nvml, sources = to_nvidia_580
    assert nvml.startswith("580.")
    assert "gpuprov-nvidia-cuda.sources" in sources
    assert packages["nvidia-driver-pinning-580"][0].startswith("580-")
    for name in NVIDIA:
        version, selection = packages[name]
        assert version.startswith("580.") and selection == "install", (name, packages[name])


def test_nvidias_580_is_the_fixed_version_and_driver_security_passes(security_story):
    driver, security = security_story["start"]
    assert set(driver[p] for p in DRIVER_PACKAGES) == {FIXED}
    assert security["status"] == "pass" and security["rc"] == 0
    assert security["message"] == ("driver 580.178.04 has every fix for R580 (newest: bulletin "
                                   "5861, 2026-09-30, fixed in 580.178.04)")


def test_a_pin_below_the_floor_is_refused_before_the_node_is_cordoned(security_story):
    rc, failures, driver, node = security_story["refused"]
    assert rc != 0
    assert f"nvidia_driver_version {VULNERABLE} is below R580's fixed version 580.178.04" \
        in failures and driver_advisories.assess(VULNERABLE).below_text() in failures, failures
    assert "nvidia_driver_allow_vulnerable: true to accept the risk" in failures
    assert set(driver[p] for p in DRIVER_PACKAGES) == {FIXED}  # nothing changed
    assert not node.spec.unschedulable
    assert not {k for k in node.metadata.annotations or {} if k.startswith("gpuprov.io/upgrade")}


def test_accepted_it_installs_warns_and_verify_fails_it(security_story):
    warnings, driver, security = security_story["vulnerable"]
    assert set(driver[p] for p in DRIVER_PACKAGES) == {VULNERABLE}
    assert "nvidia-driver-pinning-580.105.08" in driver
    assert len(warnings) == 1 and warnings[0].startswith(
        f"WARNING: {NODE}: nvidia_driver_version {VULNERABLE} is below R580's fixed version")
    assert warnings[0].endswith("Accepted: nvidia_driver_allow_vulnerable.")
    # The inventory does not accept it: a failure naming the bulletins, the CVE, the version.
    assert security["status"] == "fail" and security["rc"] == 1
    assert security["message"].startswith("driver 580.105.08 is below R580's fixed version "
                                          "580.178.04: bulletin 5747 (2026-01-28")
    # 5861's 78 CVEs for R580, cut to the first three and the count (the table's test checks it).
    assert "bulletin 5861 (2026-09-30, high 7.8: CVE-2026-47489, CVE-2026-47491, " \
        "CVE-2026-47492 and 75 more)" in security["message"]
    assert security["message"].endswith("install 580.178.04 or newer")


def test_the_upgrade_without_a_version_moves_it_to_the_fixed_one(security_story):
    warnings, driver, security, node = security_story["fixed"]
    assert set(driver[p] for p in DRIVER_PACKAGES) == {FIXED}
    # As the switch left it: the branch's lock package, not the version's.
    assert "nvidia-driver-pinning-580" in driver
    assert "nvidia-driver-pinning-580.105.08" not in driver
    assert warnings == []
    assert security["status"] == "pass" and security["rc"] == 0
    assert not node.spec.unschedulable


def test_moving_the_branch_replaces_the_lock_and_the_driver(to_590):
    packages, nvml, _ = to_590
    assert nvml.startswith("590.")
    assert "nvidia-driver-pinning-580" not in packages
    assert packages["nvidia-driver-pinning-590"][0].startswith("590-")
    for name in NVIDIA:
        assert packages[name][0].startswith("590."), (name, packages[name])


def test_back_to_debians_archive_removes_nvidias_lock_and_repository(back_to_debian):
    packages, nvml, sources = back_to_debian
    assert nvml.startswith("535.")
    assert [p for p in packages if p.startswith("nvidia-driver-pinning")] == []
    assert "gpuprov-nvidia-cuda" not in sources
    for name in DEBIAN_535:
        version, selection = packages[name]
        assert version.startswith("535.") and selection == "hold", (name, packages[name])


def _next_boot(lab: Lab) -> dict:
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "verify", "-i",
                           str(lab.inventory_path), "--json", "--no-pods", "--checks",
                           "driver.next-boot"], capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr
    return next(r for r in json.loads(proc.stdout)["results"]
                if (r["node"], r["check"]) == (NODE, "driver.next-boot"))


def test_the_driver_stage_builds_the_module_of_the_kernel_the_node_boots_next(
        switch_lab, back_to_debian):
    switch_lab.fault(NODE, "next-kernel-no-module")
    try:
        release = nodefaults.next_kernel(switch_lab.require().node(NODE).container)
        assert release, "the fault names no kernel release"
        before = _next_boot(switch_lab)
        assert before["status"] == "fail", before
        assert f"kernel {release}, the one the node boots next, has no nvidia module" in \
            before["message"] and f"apt-get install linux-headers-{release}" in \
            before["message"], before

        rc, run = run_playbook(switch_lab, "playbooks/driver.yml")
        assert rc == 0, playbook_failures(run)
        changed = {task["task"]["name"] for play in run["plays"] for task in play["tasks"]
                   if task["hosts"].get(NODE, {}).get("changed")}
        assert {"nvidia_driver : Install the headers of the kernel the node boots next (apt)",
                "nvidia_driver : Build the nvidia module for the kernel the node boots next"} \
            <= changed, changed

        # The node's health agent saw the missing module too (DriverProblem): it clears after
        # its passing cycles, which the admin asks for now (systemctl reload).
        recheck_health(switch_lab, [NODE])
        fixed = _next_boot(switch_lab)
        module = fixed["details"]["module"]
        assert fixed["status"] == "pass", fixed
        assert module["kind"] == "dkms" and module["path"] == \
            f"/lib/modules/{release}/updates/dkms/nvidia-current.ko", module
        assert module["version"] == fixed["details"]["installed_driver"], fixed

        rc, again = run_playbook(switch_lab, "playbooks/driver.yml")
        assert rc == 0 and again["stats"][NODE]["changed"] == 0, again["stats"]
    finally:
        clear_faults(switch_lab)
