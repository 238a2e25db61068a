"""`ansible-playbook site.yml` on the lab, over real SSH: what the admins run.

The first run takes the bare nodes to GPU nodes; the tests after it check the state that run
left on the nodes (read with dpkg over SSH, not from Ansible's own report), that a second run
changes nothing, and that `--check --diff` on the converged lab changes nothing either.
"""

from __future__ import annotations

import pytest
import tomllib
import yaml
from conftest import BAD_SETTINGS, installed_packages, kube_api, playbook_failures
from kubernetes import client

# gpu-hopper runs Debian 13 and takes R580 from (the lab's mirror of) NVIDIA's repository.
EXPECTED_BRANCH = {"gpu-kepler": 470, "gpu-pascal": 535, "gpu-hopper": 580, "cpu-only": None}
CONTAINERD_MAJOR = {"gpu-kepler": 1, "gpu-pascal": 1, "gpu-hopper": 2}
GPU_NODES = [name for name, branch in EXPECTED_BRANCH.items() if branch]

# Written out here, not read from the role, so that a wrong package name in the role fails.
DRIVER_PACKAGES = {
    470: ["nvidia-tesla-470-kernel-dkms", "nvidia-tesla-470-smi", "libnvidia-tesla-470-cuda1",
          "libnvidia-tesla-470-ml1", "libnvidia-tesla-470-cfg1"],
    535: ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-ml1", "libnvidia-cfg1"],
    # NVIDIA's repository: its compute-only set, kept on the branch by its version-lock
    # package, not by holds (NVIDIA's guide advises against combining them).
    580: ["nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-smi", "libcuda1",
          "libnvidia-ml1", "nvidia-driver-pinning-580"],
}
HELD = {470: True, 535: True, 580: False}
FORBIDDEN = ("cuda-toolkit", "nvidia-cuda-toolkit", "xserver-xorg-core")
GPU_COUNT = {"gpu-kepler": 2, "gpu-pascal": 4, "gpu-hopper": 8}
# The labels the issue specifies, written out (not computed by gpuprov.nvidia.labels).
EXPECTED_LABELS = {
    "gpu-kepler": {"gputype": "k80", "nvidia.com/gpu.family": "kepler",
                   "nvidia.com/gpu.product": "Tesla-K80", "nvidia.com/gpu.count": "2",
                   "nvidia.com/gpu.compute.major": "3", "nvidia.com/gpu.compute.minor": "7",
                   "nvidia.com/cuda.driver-version.major": "470",
                   "nvidia.com/cuda.runtime-version.full": "11.4"},
    "gpu-pascal": {"gputype": "p100", "nvidia.com/gpu.family": "pascal",
                   "nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB", "nvidia.com/gpu.count": "4",
                   "nvidia.com/gpu.memory": "16384", "nvidia.com/gpu.compute.major": "6",
                   "nvidia.com/gpu.compute.minor": "0",
                   "nvidia.com/cuda.driver-version.full": "535.261.03",
                   "nvidia.com/cuda.runtime-version.major": "12",
                   "nvidia.com/cuda.runtime-version.minor": "2"},
    "gpu-hopper": {"gputype": "h100", "nvidia.com/gpu.family": "hopper",
                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                   "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
                   "nvidia.com/gpu.present": "true"},
}


@pytest.fixture(scope="module")
def run_site(playbook):
    return lambda *extra: playbook("site.yml", *extra)


@pytest.fixture(scope="module")
def first_run(site_run):
    return site_run


def _host_results(doc: dict, task_name: str) -> dict[str, dict]:
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"] == task_name:
                return task["hosts"]
    raise AssertionError(f"task {task_name!r} did not run")


def test_first_run_succeeds_on_every_node(first_run):
    rc, doc = first_run
    assert rc == 0, playbook_failures(doc)
    stats = doc["stats"]
    assert set(stats) == set(EXPECTED_BRANCH)
    for host, s in stats.items():
        assert (s["failures"], s["unreachable"]) == (0, 0), host
    # GPU nodes were changed (driver installed); the CPU node was only read.
    assert all(stats[host]["changed"] > 0 for host in GPU_NODES)
    assert stats["cpu-only"]["changed"] == 0


def test_preflight_reports_each_node_and_its_branch(first_run):
    _, doc = first_run
    reports = _host_results(doc, "gpu_preflight : Report the node's GPUs and driver branch")
    for host, branch in EXPECTED_BRANCH.items():
        msg = reports[host]["msg"]
        if branch is None:
            assert msg == f"{host}: no NVIDIA GPU on PCI -> no driver; the GPU roles skip this node"
        else:
            assert msg.startswith(f"{host}: ") and f"-> driver branch {branch} " in msg
    assert "4x Tesla P100-PCIE-16GB (pascal, cc 6.0)" in reports["gpu-pascal"]["msg"]
    assert "8x NVIDIA H100 80GB HBM3 (hopper, cc 9.0)" in reports["gpu-hopper"]["msg"]
    assert "2x Tesla K80 (kepler, cc 3.7)" in reports["gpu-kepler"]["msg"]


@pytest.mark.parametrize("node", list(EXPECTED_BRANCH))
def test_driver_packages_match_the_node_branch_and_are_held(first_run, node_connection, node):
    packages = installed_packages(node_connection(node))
    branch = EXPECTED_BRANCH[node]
    forbidden = sorted(p for p in packages if p.startswith(FORBIDDEN[0]) or p in FORBIDDEN[1:])
    assert forbidden == []
    if branch is None:
        assert sorted(p for p in packages if "nvidia" in p or p.startswith("libcuda")) == []
        return
    for package in DRIVER_PACKAGES[branch] + ["nvidia-persistenced"]:
        assert package in packages, f"{package} missing on {node}"
        version, want = packages[package]
        assert want == ("hold" if HELD[branch] else "install"), (node, package, want)
        if package.startswith("nvidia-driver-pinning-"):
            assert version.startswith(f"{branch}-"), (package, version)
        # Debian's nvidia-persistenced is versioned on its own (535.171.04 for both branches).
        elif package != "nvidia-persistenced" or branch == 580:
            assert version.startswith(f"{branch}."), (package, version)
    others = {p for b, names in DRIVER_PACKAGES.items() if b != branch for p in names}
    assert sorted(p for p in others if p in packages and p not in DRIVER_PACKAGES[branch]) == []


@pytest.mark.parametrize("node", GPU_NODES)
def test_containerd_has_the_nvidia_runtime_and_keeps_the_planted_settings(
        first_run, node_connection, node):
    # containerd's own view: the main config with its imports merged as containerd does.
    # The planted file is version 2: containerd 1.x keeps it as it is, 2.x migrates it (and
    # the role's version 3 drop-in) into its version 3 plugins.
    conn = node_connection(node)
    version = conn.run("containerd --version", hide=True, in_stream=False).stdout.split()[2]
    assert int(version.split(".")[0]) == CONTAINERD_MAJOR[node], version
    dump = tomllib.loads(conn.run("containerd config dump", hide=True, in_stream=False).stdout)
    plugins = dump["plugins"]
    assert dump["oom_score"] == -999
    if CONTAINERD_MAJOR[node] == 1:
        runtime = plugins["io.containerd.grpc.v1.cri"]
        sandbox = runtime["sandbox_image"]
    else:
        runtime = plugins["io.containerd.cri.v1.runtime"]
        sandbox = plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
    assert sandbox == "registry.example/pause:3.9"
    assert runtime["restrict_oom_score_adj"] is True
    nvidia = runtime["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    active = node_connection(node).run("systemctl is-active containerd", hide=True,
                                       in_stream=False, warn=True).stdout.strip()
    assert active == "active"


def test_gpu_hopper_runs_debian_13_with_r580_from_nvidias_repository(first_run,
                                                                        node_connection):
    conn = node_connection("gpu-hopper")

    def run(command: str) -> str:
        return conn.run(command, hide=True, in_stream=False).stdout

    assert "VERSION_ID=\"13\"" in run("cat /etc/os-release")
    sources = run("cat /etc/apt/sources.list.d/gpuprov-nvidia-cuda.sources")
    assert "URIs: file:/srv/gpuprov-lab-cuda/debian13/x86_64/" in sources
    assert "Signed-By: /etc/apt/keyrings/gpuprov-nvidia-cuda.asc" in sources
    # The repository offers 590 too: the version-lock package keeps apt on 580, and of R580's
    # two versions the newest, the one with bulletin 5861's fixes (not 580.105.08 beside it).
    policy = run("apt-cache policy nvidia-driver-cuda")
    assert "590.44.01-1" in policy and "580.105.08-1" in policy, policy
    assert "Candidate: 580.178.04-1" in policy and "Installed: 580.178.04-1" in policy, policy
    # The simulated NVML reports the driver that got installed (the node started at 550).
    smi = run("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert smi.split() == ["580.178.04"] * 8


# How each node's containers get GPUs (nvidia_container_toolkit_mode: auto): native CDI where
# containerd can inject CDI devices (2.x on gpu-hopper), NVIDIA's runtime on containerd 1.6.
RUNTIME_MODE = {"gpu-kepler": "legacy", "gpu-pascal": "legacy", "gpu-hopper": "cdi"}


@pytest.mark.parametrize("node", GPU_NODES)
def test_each_node_runs_the_mode_of_its_containerd(first_run, node_connection, lab, node):
    conn = node_connection(node)

    def run(command: str) -> str:
        return conn.run(command, hide=True, in_stream=False).stdout

    dump = tomllib.loads(run("containerd config dump"))["plugins"]
    cri = dump["io.containerd.cri.v1.runtime" if CONTAINERD_MAJOR[node] == 2
               else "io.containerd.grpc.v1.cri"]
    cdi = RUNTIME_MODE[node] == "cdi"
    assert cri["containerd"]["default_runtime_name"] == ("runc" if cdi else "nvidia")
    assert "nvidia" in cri["containerd"]["runtimes"]  # the plugin's RuntimeClass
    node_object = client.CoreV1Api(kube_api(lab)).read_node(node)
    assert node_object.metadata.labels["nvidia.com/device-plugin.config"] == RUNTIME_MODE[node]
    if not cdi:
        return
    assert cri["enable_cdi"] is True and "/var/run/cdi" in cri["cdi_spec_dirs"]
    # The toolkit's own units keep the spec, which names each of the 8 GPUs by index and UUID
    # (as NVML on the node enumerates them), for the installed driver.
    assert run("systemctl is-enabled nvidia-cdi-refresh.path nvidia-cdi-refresh.service"
               ).split() == ["enabled", "enabled"]
    spec = yaml.safe_load(run("cat /var/run/cdi/nvidia.yaml"))
    uuids = run("nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
    assert len(uuids) == GPU_COUNT[node]
    names = [d["name"] for d in spec["devices"]]
    assert spec["kind"] == "nvidia.com/gpu"
    assert names == [str(i) for i in range(len(uuids))] + uuids + ["all"]
    mounts = [m["hostPath"] for m in spec["containerEdits"]["mounts"]]
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.178.04" in mounts
    assert conn.run("test -e /etc/cdi/nvidia.yaml", warn=True, hide=True,
                    in_stream=False).failed  # no second spec


def test_gpus_are_allocatable_and_labels_are_as_specified(first_run, lab):
    core = client.CoreV1Api(kube_api(lab))
    nodes = {n.metadata.name: n for n in core.list_node().items}
    for name, count in GPU_COUNT.items():
        assert (nodes[name].status.allocatable or {}).get("nvidia.com/gpu") == str(count)
        labels = nodes[name].metadata.labels
        assert {k: labels.get(k) for k in EXPECTED_LABELS[name]} == EXPECTED_LABELS[name]
    cpu = nodes["cpu-only"]
    assert "nvidia.com/gpu" not in (cpu.status.allocatable or {})
    assert [k for k in cpu.metadata.labels if k.startswith("nvidia.com/") or k == "gputype"] == []


# The steps that change a node, each skipped as one task where the roles' reads of the node
# show nothing to do: a second run only reads (its time is bench/site_playbook.py's figure).
CONVERGED_SKIPS = (
    "nvidia_driver : Install the driver packages",
    "nvidia_container_toolkit : Add the repository and install the toolkit",
    "nvidia_container_toolkit : Write the drop-in and the import",
    "gpu_node_labels : Probe the node again",
    "nvidia_device_plugin : Wait for a current device plugin pod to run on every GPU node",
)


def test_second_run_changes_nothing(first_run, run_site):
    rc, doc = run_site()
    assert rc == 0, playbook_failures(doc)
    changed = {host: s["changed"] for host, s in doc["stats"].items()}
    assert changed == dict.fromkeys(EXPECTED_BRANCH, 0)
    for task in CONVERGED_SKIPS:
        results = _host_results(doc, task)
        assert results and all(r.get("skipped") for r in results.values()), (task, results)


def test_check_mode_on_the_bare_lab_succeeds_and_changes_nothing(bare_check_run):
    run = bare_check_run
    assert run.rc == 0, playbook_failures(run.doc)
    # It predicts the changes a real run makes on the GPU nodes (and none on cpu-only) ...
    stats = run.doc["stats"]
    assert all(stats[host]["changed"] > 0 for host in GPU_NODES), stats
    assert stats["cpu-only"]["changed"] == 0
    # ... and makes none: packages, the roles' files and the API are as they were.
    for node, before in run.nodes_before.items():
        assert run.nodes_after[node] == before, f"{node} changed in check mode"
    assert run.api_after == run.api_before


@pytest.mark.parametrize("name", sorted(BAD_SETTINGS))
def test_a_bad_setting_of_any_stage_stops_site_yml_before_the_first_change(
        bare_invalid_runs, name):
    run, (setting, words) = bare_invalid_runs[name], BAD_SETTINGS[name]
    assert run.rc == 2, playbook_failures(run.doc)
    failures = playbook_failures(run.doc)
    assert words in failures, failures
    # It stopped in the validate stage: no driver stage task ran, nothing changed anywhere.
    plays = [p["play"]["name"] for p in run.doc["plays"]]
    assert plays[-1].startswith("Validate"), plays
    assert all(s["changed"] == 0 for s in run.doc["stats"].values()), run.doc["stats"]
    for node, before in run.nodes_before.items():
        assert run.nodes_after[node] == before, f"{node} changed with {setting}"
    assert run.api_after == run.api_before


def test_check_mode_with_diff_changes_nothing(first_run, run_site):
    rc, doc = run_site("--check", "--diff")
    assert rc == 0, playbook_failures(doc)
    assert all(s["changed"] == 0 and s["failures"] == 0 for s in doc["stats"].values())


def test_debian_backports_for_every_node_is_ignored_with_a_note_on_nvidias_repository(
        first_run, run_site, node_connection):
    """nvidia_driver_debian_backports names a suite of Debian's archive: given with -e, it
    reaches gpu-hopper too, whose driver comes from NVIDIA's repository on Debian 13. There it
    once installed NVIDIA's version-lock package and then failed in apt ("The value
    'trixie-backports' is invalid for APT::Default-Release"); now the validate stage notes that
    it is ignored there, and the driver stage changes nothing on the converged node."""
    conn = node_connection("gpu-hopper")
    before = installed_packages(conn)
    rc, doc = run_site("--limit", "gpu-hopper", "--tags", "driver",
                       "-e", "nvidia_driver_debian_backports=true")
    assert rc == 0, playbook_failures(doc)
    assert doc["stats"]["gpu-hopper"]["changed"] == 0, doc["stats"]
    # The driver stage ran on the node (not only the validate stage), and read it.
    driver_tasks = [task["task"]["name"] for play in doc["plays"]
                    if play["play"]["name"].startswith("NVIDIA driver")
                    for task in play["tasks"] if "gpu-hopper" in task["hosts"]]
    assert "nvidia_driver : Read the node's packages, kernel modules and nvidia-persistenced" \
        in driver_tasks, \
        driver_tasks
    note = _host_results(doc, "nvidia_driver : Note the settings ignored on this node")
    assert "gpu-hopper: nvidia_driver_debian_backports is ignored: its driver comes from " \
        "NVIDIA's repository" in str(note["gpu-hopper"]["msg"])
    assert installed_packages(conn) == before
    # The role's own sources files (NVIDIA's repository's, on this node) name no backports.
    sources = conn.run("cat /etc/apt/sources.list.d/gpuprov-*.sources", hide=True,
                       in_stream=False).stdout
    assert "Suites" in sources and "backports" not in sources
