"""One lab per test session, shared by every lab test that does not change it for good.

The lab lives in its own project directory under pytest's temp dir, so it never touches
a developer's `make demo` lab. GPUPROV_KEEP_LAB=1 leaves it up after the session.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from kubernetes import client, config
from kubernetes.client import ApiClient
from timings import record_setup

from gpuprov.cli import main
from gpuprov.lab.cache import CACHE
from gpuprov.lab.lab import Lab
from gpuprov.ssh import SshTarget, connect

REPO = Path(__file__).resolve().parents[2]


# The session lab's tests are the suite's longest chain: they end the run, while the labs of
# their own (OWN_LAB_MODULES, tests/conftest.py) end minutes before it. Where the CPUs are
# short, those side labs yield: their nodes get half a container's default CPU weight
# (GPUPROV_LAB_CPU_SHARES: podman gives each container a cpu cgroup of its own, where nice
# does not reach), and the worker that runs one lowers its own priority, which its playbook
# runs and the unit tests it takes up after inherit (its emulator starts a session of its
# own, a scheduler autogroup of its own, so it is not lowered). Nothing is starved: a side
# lab runs at full speed whenever the session lab leaves CPU free.
SIDE_LAB_CPU_SHARES = 512
SIDE_LAB_NICE = 3


def temporary_lab(tmp_path_factory, name: str, *up_args: str,
                  side: bool = True) -> Iterator[Lab]:
    """A lab in its own project directory under pytest's temp dir, taken down after
    (unless GPUPROV_KEEP_LAB=1); `up_args` go to `gpuprov lab up` (e.g. --nodes). A side lab
    (every lab but the session lab) yields the CPUs to the session lab (SIDE_LAB_*)."""
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: run `make deps` (the lab tests need it)")
    project = tmp_path_factory.mktemp(name)
    if side:
        niceness = os.getpriority(os.PRIO_PROCESS, 0)
        if niceness < SIDE_LAB_NICE:
            os.nice(SIDE_LAB_NICE - niceness)
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as env:
        # One package cache per lab of the suite (the machine's cache): the suite's labs run
        # side by side (pytest-xdist), and nodes of the same name in two labs would otherwise
        # share one /var/cache/apt/archives, whose lock makes the second apt fail at once.
        env.setenv("GPUPROV_LAB_APT_CACHE", str(CACHE / "apt-archives" / name))
        if side:
            env.setenv("GPUPROV_LAB_CPU_SHARES", str(SIDE_LAB_CPU_SHARES))
        else:
            env.delenv("GPUPROV_LAB_CPU_SHARES", raising=False)
        assert main(["lab", "--dir", str(project), "up", *up_args]) == 0
    record_setup(f"lab {name} up", time.monotonic() - started)
    yield Lab(project)
    if os.environ.get("GPUPROV_KEEP_LAB") != "1":
        main(["lab", "--dir", str(project), "down"])


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Iterator[Lab]:
    yield from temporary_lab(tmp_path_factory, "labproject", side=False)


@pytest.fixture(scope="session")
def lab_state(lab):
    return lab.require()


def kube_api(lab: Lab) -> ApiClient:
    """A client of the lab's emulated Kubernetes API, through the lab's kubeconfig."""
    return config.new_client_from_config(str(lab.kubeconfig_path))


def node_target(lab: Lab, name: str) -> SshTarget:
    node = lab.require().node(name)
    return SshTarget(
        name=node.name, host="127.0.0.1", port=node.ssh_port, user="root",
        key_file=str(lab.key_path), known_hosts=str(lab.known_hosts_path),
    )


@pytest.fixture
def node_connection(lab):
    opened = []

    def _open(name: str):
        conn = connect(node_target(lab, name))
        opened.append(conn)
        return conn

    yield _open
    for conn in opened:
        conn.close()


def clear_faults(lab: Lab) -> None:
    """Switch every lab fault off, then settle what the nodes' health agents made of them
    (settle_health): an agent never forgets a fault by itself, by design."""
    for node in lab.status()["nodes"]:
        for fault in node["faults"]:
            lab.fault(node["name"], fault.split(":")[0], clear=True)
    settle_health(lab)


HEALTH_PREFIX = "gpuprov.io/"


def health_problems(core) -> dict[str, list[str]]:
    """node -> its gpuprov.io/ conditions that are True."""
    problems = {}
    for node in core.list_node().items:
        true = [c.type for c in node.status.conditions or []
                if c.type.startswith(HEALTH_PREFIX) and c.status == "True"]
        if true:
            problems[node.metadata.name] = true
    return problems


def reload_agents(lab: Lab, nodes) -> None:
    """`systemctl reload gpuprov-health-agent`: each agent runs a check cycle at once."""
    state = lab.require()
    procs = [subprocess.Popen(lab.ssh_command(state.node(n),
                                              "systemctl reload gpuprov-health-agent"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for n in nodes]
    for proc in procs:
        proc.wait(timeout=60)


def recheck_health(lab: Lab, nodes, timeout: float = 90.0) -> None:
    """Make the nodes' agents check again and again (systemctl reload) until none of them has
    a gpuprov.io/ condition True: after a fix, an ongoing problem clears only after
    gpu_health_clear_after_passes passing cycles (60 s apart on their own)."""
    core = client.CoreV1Api(kube_api(lab))
    deadline = time.monotonic() + timeout
    problems = {n: p for n, p in health_problems(core).items() if n in nodes}
    while problems and time.monotonic() < deadline:
        reload_agents(lab, problems)
        time.sleep(1.0)
        problems = {n: p for n, p in health_problems(core).items() if n in nodes}
    assert not problems, f"the health agents did not clear within {timeout:.0f} s: {problems}"


def settle_health(lab: Lab, timeout: float = 90.0) -> None:
    """Give the lab back healthy after a test's faults, as an admin would: acknowledge each
    node with a gpuprov.io/ condition True (XID faults clear only so), make its agent check
    until its ongoing problems cleared (gpu_health_clear_after_passes passes), and restart
    the device plugin where it still holds a GPU unhealthy (its v0.20 rule: only a restart
    heals). Nothing to do on a lab without agents or API."""
    if not lab.kubeconfig_path.exists() or lab.load() is None:
        return
    core = client.CoreV1Api(kube_api(lab))
    problems = health_problems(core)
    if problems:
        for node in problems:
            assert main(["health", "ack", node, "--kubeconfig", str(lab.kubeconfig_path),
                         "--reason", "lab test cleanup"]) == 0
        recheck_health(lab, list(problems), timeout)
    for node in core.list_node().items:
        capacity = (node.status.capacity or {}).get("nvidia.com/gpu")
        allocatable = (node.status.allocatable or {}).get("nvidia.com/gpu")
        if capacity is not None and allocatable is not None and \
                int(allocatable) < int(capacity):
            for pod in core.list_namespaced_pod(
                    "kube-system", field_selector=f"spec.nodeName={node.metadata.name}").items:
                if pod.metadata.name.startswith("nvidia-device-plugin"):
                    core.delete_namespaced_pod(pod.metadata.name, "kube-system")


@pytest.fixture
def clean_faults(lab):
    """Clear every fault after the test, whatever it switched on."""
    yield
    clear_faults(lab)


def playbook_failures(doc: dict) -> str:
    """Every failed task's message (and verify's report, if site.yml ran it), for an
    assertion's explanation."""
    lines = []
    for play in doc["plays"]:
        for task in play["tasks"]:
            for host, result in task["hosts"].items():
                if result.get("failed") or result.get("unreachable"):
                    lines.append(f"{host}: {task['task']['name']}: {result.get('msg')}")
                    lines += [f"{host}: {task['task']['name']}: {item.get('msg')}"
                              for item in result.get("results") or [] if item.get("failed")]
                if task["task"]["name"] == "gpu_verify : Show the verify report":
                    lines += [str(line) for line in result.get("msg") or []]
    return "\n".join(lines)


# Every package dpkg knows: name, version, status (e.g. "ii "), selection (install, hold).
DPKG_PACKAGES = "dpkg-query -W -f '${Package} ${Version} ${db:Status-Abbrev} ${db:Status-Want}\\n'"


def installed_packages(conn) -> dict[str, tuple[str, str]]:
    """Installed packages on a node: name -> (version, selection), read with dpkg-query."""
    out = conn.run(DPKG_PACKAGES, hide=True, in_stream=False).stdout
    packages = {}
    for line in out.splitlines():
        package, version, status, want = line.split()
        if status[1] == "i":  # "ii" installed, "hi" installed and held
            packages[package] = (version, want)
    return packages


@dataclass
class RunningPlaybook:
    proc: subprocess.Popen
    stdout: IO[bytes]
    stderr: IO[bytes]
    label: str = ""  # the command line, for the run's timings (tests/timings.py)
    started: float = 0.0


def start_playbook(lab: Lab, playbook: str, *extra: str) -> RunningPlaybook:
    """ansible-playbook against the lab, started; finish_playbook() collects its result. Its
    output goes to temporary files, not pipes: nobody reads it while it runs, and a full pipe
    would stop it at the end, when the JSON callback writes its whole document."""
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json",
               ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    # Closed by finish_playbook, after the process has ended.
    stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.inventory_path),
         playbook, *extra],
        cwd=REPO, env=env, stdout=stdout, stderr=stderr,
    )
    return RunningPlaybook(proc, stdout, stderr, f"{lab.project_dir.name}: ansible-playbook "
                           + " ".join([playbook, *extra]), time.monotonic())


def finish_playbook(run: RunningPlaybook, timeout: float = 1500) -> tuple[int, dict]:
    """The started playbook's exit code and its ansible.posix.json document."""
    try:
        rc = run.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        run.proc.wait()
        raise
    record_setup(f"{run.label} (rc {rc})", time.monotonic() - run.started)
    stdout, stderr = (_read(f) for f in (run.stdout, run.stderr))
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"ansible-playbook printed no JSON (rc {rc}):\n"
                             f"{stdout[-3000:]}\n{stderr[-3000:]}") from None
    return rc, doc


def _read(file: IO[bytes]) -> str:
    file.seek(0)
    text = file.read().decode(errors="replace")
    file.close()
    return text


def run_playbook(lab: Lab, playbook: str, *extra: str, timeout: float = 1500) -> tuple[int, dict]:
    """ansible-playbook against the lab, its result as the ansible.posix.json document."""
    return finish_playbook(start_playbook(lab, playbook, *extra), timeout)


@pytest.fixture(scope="session")
def playbook(lab):
    """playbook("site.yml", "--check") -> (rc, ansible.posix.json document)."""
    return lambda name, *extra: run_playbook(lab, name, *extra)


# An admin's containerd settings, planted on the GPU nodes before the first site.yml: the
# toolkit role must add NVIDIA's runtime without losing any of them (Debian's default
# config.toml plus a top-level and two CRI settings). restrict_oom_score_adj is the lab node's
# own (gpuprov/lab/image/Containerfile): without it no pod runs in a lab node. The node's
# containerd gets the lab's pod image under this sandbox image name when it restarts.
PLANTED_CONTAINERD = """version = 2
oom_score = -999

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    restrict_oom_score_adj = true
    sandbox_image = "registry.example/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""


# What a run could change on a node, read over SSH: every package with its selection, and
# the files under the directories the roles write to, with their checksums.
_NODE_STATE = (
    f"{DPKG_PACKAGES}; find /etc/apt /etc/containerd /etc/modprobe.d /etc/cdi "
    "/etc/nvidia-container-runtime /usr/share/keyrings "
    "-type f -exec sha256sum {} + 2>/dev/null | sort -k 2; true")


def node_state(lab: Lab) -> dict[str, str]:
    """node -> _NODE_STATE's output there."""
    state = {}
    for node in lab.require().nodes:
        with connect(node_target(lab, node.name)) as conn:
            state[node.name] = conn.run(_NODE_STATE, hide=True, in_stream=False).stdout
    return state


# The one lab node whose admin has the driver role sign DKMS builds for Secure Boot
# (nvidia_driver_secure_boot_sign), so that the lab shows the node with signing and the nodes
# without. Not gpu-pascal: test_verify_lab really builds a DKMS module there.
SECURE_BOOT_NODE = "gpu-kepler"

# node -> installed_packages() as bare_lab found it, before any site.yml: what
# test_lab_node_roles measures the packages site.yml added against.
PACKAGES_BEFORE_SITE: dict[str, dict[str, tuple[str, str]]] = {}


@pytest.fixture(scope="session")
def bare_lab(lab) -> Lab:
    """The session lab before site.yml, with an admin's containerd settings planted on the
    GPU nodes (the toolkit role must keep them), DKMS signing asked for on SECURE_BOOT_NODE,
    and every node's packages recorded in PACKAGES_BEFORE_SITE."""
    # A host_vars file beside the inventory, which Ansible reads with it: `lab up` rewrites
    # hosts.yml itself (tests call it on the session lab), and the setting must outlive that.
    host_vars = lab.inventory_path.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / f"{SECURE_BOOT_NODE}.yml").write_text("nvidia_driver_secure_boot_sign: true\n")
    for node in lab.require().nodes:
        with connect(node_target(lab, node.name)) as conn:
            PACKAGES_BEFORE_SITE[node.name] = installed_packages(conn)
            if node.has_gpu:
                conn.put(io.StringIO(PLANTED_CONTAINERD), "/etc/containerd/config.toml")
                conn.run("systemctl restart containerd", hide=True, in_stream=False)
    return lab


@dataclass
class CheckRun:
    rc: int
    doc: dict
    nodes_before: dict[str, str]
    nodes_after: dict[str, str]
    api_before: list[str]
    api_after: list[str]


@pytest.fixture(scope="session")
def bare_check_run(bare_lab) -> CheckRun:
    """`site.yml --check --diff` on the bare lab, as an admin tries it first, with what the
    nodes and the API held before and after it."""
    nodes, api = node_state(bare_lab), api_objects(bare_lab)
    rc, doc = run_playbook(bare_lab, "site.yml", "--check", "--diff")
    return CheckRun(rc, doc, nodes, node_state(bare_lab), api, api_objects(bare_lab))


def api_objects(lab: Lab) -> list[str]:
    """The lab API's DaemonSets, RuntimeClasses and ConfigMaps, and its nodes' labels."""
    api = kube_api(lab)
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    names = [f"daemonset {d.metadata.namespace}/{d.metadata.name}"
             for d in apps.list_daemon_set_for_all_namespaces().items]
    names += [f"runtimeclass {r.metadata.name}"
              for r in client.NodeV1Api(api).list_runtime_class().items]
    names += [f"configmap {c.metadata.namespace}/{c.metadata.name}"
              for c in core.list_config_map_for_all_namespaces().items]
    names += [f"node {n.metadata.name} {sorted((n.metadata.labels or {}).items())}"
              for n in core.list_node().items]
    return sorted(names)


# A bad setting of a late stage, and one that only a role's argument_specs refuses: site.yml
# must stop on each in its validate stage, before the first change (the driver stage).
BAD_SETTINGS = {
    "device-plugin": ("nvidia_device_plugin_time_slicing_replicas=0",
                      "nvidia_device_plugin_time_slicing_replicas (0) must be 1"),
    "labels-spec": ("gpu_node_labels_reprobe=perhaps", "gpu_node_labels_reprobe"),
    # A misspelt layout name: the MIG stage comes after the driver and toolkit stages.
    "mig": ("gpu_mig_config=all-1g.10gbb", "gpu_mig_config 'all-1g.10gbb': no MIG layout"),
}


@pytest.fixture(scope="session")
def bare_invalid_runs(bare_lab, bare_check_run) -> dict[str, CheckRun]:
    """site.yml on the bare lab with each of BAD_SETTINGS, with the nodes and the API before
    and after."""
    runs = {}
    for name, (setting, _) in BAD_SETTINGS.items():
        nodes, api = node_state(bare_lab), api_objects(bare_lab)
        rc, doc = run_playbook(bare_lab, "site.yml", "-e", setting)
        runs[name] = CheckRun(rc, doc, nodes, node_state(bare_lab), api, api_objects(bare_lab))
    return runs


@pytest.fixture(scope="session")
def site_run(bare_lab, bare_check_run, bare_invalid_runs) -> tuple[int, dict]:
    """The first `ansible-playbook site.yml` on the bare lab (after the check-mode run and the
    runs with bad settings), run once per session: the tests of site.yml read its result, and
    the tests of verify need the converged lab."""
    return run_playbook(bare_lab, "site.yml")
