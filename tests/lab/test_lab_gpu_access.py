"""Who gets GPUs on the lab after site.yml (issue 16): the toolkit's config.toml as the role
merges it, no GPU for a pod that did not ask (pods.no-request), the toolkit at a version with
no known CVE (runtime.toolkit-version), and a plain rerun of site.yml repairing both on the
node that drifted while changing nothing on a node that did not. Pods are real containers in
the node's containerd, run by the runtime the RuntimeClass's handler names."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest
from conftest import installed_packages, kube_api, playbook_failures, run_playbook
from kubernetes import client

from gpuprov.lab import pkgrepo
from gpuprov.lab.kube.testing import wait_for

TOOLKIT_PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                    "libnvidia-container-tools", "libnvidia-container1")
OLD = "1.17.7-1"  # served by the lab's repository next to the pin; has known CVEs
CONFIG = "/etc/nvidia-container-runtime/config.toml"
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"
TASK_DIR = "/run/containerd/io.containerd.runtime.v2.task/k8s.io"  # containerd's bundles


@pytest.fixture(scope="module")
def converged(site_run):
    rc, doc = site_run
    assert rc == 0, playbook_failures(doc)


def verify(lab, *argv: str) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "verify", "-i",
                           str(lab.inventory_path), "--json", *argv],
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def results(doc: dict, check: str) -> dict[str, dict]:
    return {r["node"]: r for r in doc["results"] if r["check"] == check}


@pytest.mark.parametrize("name", ["gpu-kepler", "gpu-pascal", "gpu-hopper"])
def test_toolkit_is_pinned_held_and_refuses_the_variable(converged, node_connection, name):
    conn = node_connection(name)
    packages = installed_packages(conn)
    assert {p: packages[p] for p in TOOLKIT_PACKAGES} == \
        dict.fromkeys(TOOLKIT_PACKAGES, (pkgrepo.TOOLKIT_VERSION, "hold"))
    text = conn.run(f"cat {CONFIG}", hide=True, in_stream=False).stdout
    lines = text.splitlines()
    assert f"{ENVVAR_KEY} = false" in lines and f"{MOUNTS_KEY} = true" in lines
    # The package's own settings are still there (merged, not replaced).
    assert '[nvidia-container-runtime]' in lines and 'mode = "auto"' in lines
    backups = conn.run(f"ls {CONFIG}.*~", hide=True, in_stream=False, warn=True).stdout
    assert backups.strip(), "the role changed the package's config.toml without a backup"


def test_drifted_nodes_fail_their_check_alone_and_a_rerun_repairs_them(lab, converged,
                                                                      node_connection):
    pascal, hopper = node_connection("gpu-pascal"), node_connection("gpu-hopper")
    # NVIDIA's default put back on one node; an old, vulnerable toolkit on another.
    pascal.run(f"sed -i 's/^{ENVVAR_KEY} = false/{ENVVAR_KEY} = true/' {CONFIG}",
               hide=True, in_stream=False)
    hopper.run("apt-get install -y -q --allow-downgrades --allow-change-held-packages "
               "-o Dpkg::Options::=--force-confold "
               + " ".join(f"{p}={OLD}" for p in TOOLKIT_PACKAGES), hide=True, in_stream=False)
    assert installed_packages(hopper)["nvidia-container-toolkit"][0] == OLD

    rc, doc = verify(lab, "--checks", "runtime,pods.no-request")
    assert rc == 1
    failed = {(r["node"], r["check"]) for r in doc["results"] if r["status"] == "fail"}
    assert failed == {("gpu-pascal", "pods.no-request"), ("gpu-hopper", "runtime.toolkit-version")}
    leak = results(doc, "pods.no-request")["gpu-pascal"]
    assert leak["message"].startswith("a pod that requested no GPU saw 4 GPU(s)")
    assert ENVVAR_KEY in leak["message"]
    old = results(doc, "runtime.toolkit-version")["gpu-hopper"]
    assert {"CVE-2025-23266", "CVE-2025-23267"} <= {c["cve"] for c in old["details"]["cves"]}
    assert "CVE-2025-23266" in old["message"] and "install 1.19.1 or later" in old["message"]

    rc, run = run_playbook(lab, "site.yml")
    assert rc == 0, playbook_failures(run)
    changed = {host: stats["changed"] for host, stats in run["stats"].items()}
    assert changed["gpu-kepler"] == 0 and changed["cpu-only"] == 0, changed
    assert changed["gpu-pascal"] > 0 and changed["gpu-hopper"] > 0, changed
    assert f"{ENVVAR_KEY} = false" in pascal.run(f"cat {CONFIG}", hide=True,
                                                 in_stream=False).stdout.splitlines()
    assert installed_packages(hopper)["nvidia-container-toolkit"] == \
        (pkgrepo.TOOLKIT_VERSION, "hold")
    rc, doc = verify(lab, "--checks", "runtime,pods.no-request")
    assert rc == 0, [r for r in doc["results"] if r["status"] == "fail"]


# -- pods are containers in the node's containerd ------------------------------------------------

def _pod(name: str, image: str, gpus: int, command: str, node: str = "gpu-pascal",
         runtime_class: str | None = "nvidia") -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"nodeName": node, "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": image,
                                    "command": ["sh", "-c", command],
                                    "resources": {"limits": limits}}]}}
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    return pod


def _finished_log(core, name: str) -> str:
    def done():
        pod = core.read_namespaced_pod(name, "default")
        return pod.status.phase if pod.status.phase in ("Succeeded", "Failed") else None

    assert wait_for(done, f"pod {name} to finish", 60, 0.2) == "Succeeded"
    return core.read_namespaced_pod_log(name, "default")


def test_in_cdi_mode_containerd_itself_gives_a_pod_exactly_its_gpus(lab, converged,
                                                                    node_connection):
    """gpu-hopper (containerd 2.x, CDI mode): a pod without a RuntimeClass runs with runc;
    the plugin's cdi-cri answer names CDI devices, which the node's real containerd resolves
    from the plugin's spec into device nodes; NVML in the pod sees exactly those GPUs. A pod
    that asked for none gets no NVIDIA device node and no NVML at all."""
    core = client.CoreV1Api(kube_api(lab))
    image = lab.require().pod_image
    command = "nvidia-smi -L; ls /dev | grep '^nvidia' || true"
    core.create_namespaced_pod("default", _pod("cdi-two", image, 2, command, "gpu-hopper", None))
    core.create_namespaced_pod("default", _pod("cdi-none", image, 0,
                                               "ls /dev | grep '^nvidia' || echo no-device; "
                                               "nvidia-smi -L || echo no-smi",
                                               "gpu-hopper", None))
    try:
        two = _finished_log(core, "cdi-two").split()
        seen = [line for line in _finished_log(core, "cdi-two").splitlines()
                if line.startswith("GPU ")]
        assert len(seen) == 2, two
        minors = sorted(w for w in two if w.startswith("nvidia") and w[6:].isdigit())
        assert len(minors) == 2 and "nvidiactl" in two
        # The plugin's spec, written on the node when the plugin started, resolved it.
        spec = json.loads(node_connection("gpu-hopper").run(
            "cat /var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json", hide=True,
            in_stream=False).stdout)
        assert spec["kind"] == "k8s.device-plugin.nvidia.com/gpu"
        uuids = {line.split("UUID: ")[1].rstrip(")") for line in seen}
        assert uuids <= {d["name"] for d in spec["devices"]}
        none = _finished_log(core, "cdi-none")
        assert "no-device" in none and "no-smi" in none and "GPU " not in none
    finally:
        for name in ("cdi-two", "cdi-none"):
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_a_gpu_pod_is_a_container_run_by_nvidia_runtime_and_goes_with_the_pod(
        lab, converged, node_connection):
    core = client.CoreV1Api(kube_api(lab))
    conn = node_connection("gpu-pascal")
    image = lab.require().pod_image
    core.create_namespaced_pod("default", _pod("real-container", image, 1,
                                               "nvidia-smi -L; exec sleep 600"))
    try:
        def started():
            pod = core.read_namespaced_pod("real-container", "default")
            statuses = pod.status.container_statuses or []
            return statuses[0].container_id if statuses and statuses[0].state.running else None

        container_id = wait_for(started, "the pod's container to run", 60, 0.2)
        assert container_id.startswith("containerd://")
        cid = container_id.removeprefix("containerd://")
        info = json.loads(conn.run(f"ctr -n k8s.io containers info {cid}", hide=True,
                                   in_stream=False).stdout)
        # The handler the role wrote into containerd's config: runc's shim with NVIDIA's
        # runtime as its binary (runc's Options, protobuf: field 6, BinaryName).
        options = base64.b64decode(info["Runtime"]["Options"]["value"])
        assert info["Runtime"]["Name"] == "io.containerd.runc.v2"
        assert b"/usr/bin/nvidia-container-runtime" in options
        assert info["Labels"]["io.kubernetes.pod.name"] == "real-container"
        seen = wait_for(lambda: core.read_namespaced_pod_log("real-container", "default"),
                        "nvidia-smi's output", 30, 0.2)
        assert len(seen.strip().splitlines()) == 1 and "(UUID: GPU-" in seen
        # NVIDIA's runtime (the lab's stand-in) edited the bundle's spec on `create`: the GPU
        # it gave is the one nvidia-smi shows.
        bundle = json.loads(conn.run(f"cat {TASK_DIR}/{cid}/config.json", hide=True,
                                     in_stream=False).stdout)
        given = [e.split("=", 1)[1] for e in bundle["process"]["env"]
                 if e.startswith("GPUPROV_SIM_CONTAINER_GPUS=")]
        assert given and f"(UUID: {given[0]})" in seen
    finally:
        core.delete_namespaced_pod("real-container", "default", grace_period_seconds=0)
    wait_for(lambda: conn.run(f"ctr -n k8s.io containers info {cid}", hide=True,
                              in_stream=False, warn=True).failed,
             "containerd to remove the deleted pod's container", 30, 0.2)


def test_an_image_the_node_does_not_have_fails_the_pod_with_err_image_pull(lab, converged):
    core = client.CoreV1Api(kube_api(lab))
    core.create_namespaced_pod("default", _pod("no-image", "registry.example/absent:1", 0,
                                               "true"))
    try:
        def waiting():
            pod = core.read_namespaced_pod("no-image", "default")
            statuses = pod.status.container_statuses or []
            state = statuses[0].state.waiting if statuses else None
            return state if state and state.reason == "ErrImagePull" else None

        state = wait_for(waiting, "ErrImagePull", 30, 0.2)
        assert "registry.example/absent:1" in state.message
    finally:
        core.delete_namespaced_pod("no-image", "default", grace_period_seconds=0)
