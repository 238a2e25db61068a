"""Docker hosts and Docker Swarm with Debian's real docker.io (issue 34), in a lab of their own:
`gpuprov lab up --nodes <the --with-docker hosts>`: docker-12 (Debian 12, Docker 20.10: GPUs
through NVIDIA's hook) and docker-13 (Debian 13, Docker 26.1: CDI too), in docker_hosts and
docker_swarm, in a real swarm the lab made (docker-12 manages it).

One converged site.yml run serves every test; the tests that change a node put it back.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import node_target, playbook_failures, run_playbook, temporary_lab

from gpuprov.lab.lab import DOCKER_LAB
from gpuprov.ssh import connect

pytestmark = pytest.mark.lab

HOSTS = ("docker-12", "docker-13")
# What a Swarm GPU node cannot refuse (checks/swarm.py swarm.no-request): reported, not failed.
SWARM_WARNING = "swarm.no-request"


@pytest.fixture(scope="module")
def docker_lab(tmp_path_factory):
    yield from temporary_lab(tmp_path_factory, "dockerlab", "--nodes", ",".join(DOCKER_LAB))


# What a run could change on a Docker host, read over SSH.
_HOST_STATE = ("cat /etc/docker/daemon.json 2>/dev/null; dpkg-query -W -f '${Package}\\n' "
               "| grep -c nvidia; ls /etc/nvidia-container-runtime 2>/dev/null; true")


@pytest.fixture(scope="module")
def bare_check(docker_lab):
    """`site.yml --check --diff` on the bare Docker hosts, with what they held before and after."""
    before = {h: _on(docker_lab, h, _HOST_STATE) for h in HOSTS}
    rc, doc = run_playbook(docker_lab, "site.yml", "--check", "--diff")
    return rc, doc, before, {h: _on(docker_lab, h, _HOST_STATE) for h in HOSTS}


@pytest.fixture(scope="module")
def site_runs(docker_lab, bare_check):
    """site.yml twice on the bare Docker hosts (after the check-mode run): (first, second) as
    (rc, document)."""
    first = run_playbook(docker_lab, "site.yml")
    second = run_playbook(docker_lab, "site.yml")
    return first, second


def _verify(lab, *argv: str, timeout: float = 600) -> tuple[int, dict | None, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuprov", "verify", "-i", str(lab.inventory_path), "--json",
         *argv], capture_output=True, text=True, timeout=timeout)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


def _results(doc: dict, family: str) -> dict[tuple[str, str], dict]:
    return {(r["node"], r["check"]): r for r in doc["results"]
            if r["check"].startswith(family + ".")}


def _on(lab, node: str, command: str) -> str:
    with connect(node_target(lab, node)) as conn:
        return conn.run(command, hide=True, in_stream=False).stdout


def test_check_mode_on_the_bare_hosts_changes_nothing_and_shows_the_daemon_json(bare_check):
    rc, doc, before, after = bare_check
    assert rc == 0, playbook_failures(doc)
    assert after == before
    diffs = [d for play in doc["plays"] for task in play["tasks"]
             if task["task"]["name"].endswith("Write Docker's daemon config")
             for result in task["hosts"].values() for d in result.get("diff") or []]
    assert len(diffs) == len(HOSTS) and all('"nvidia"' in d["after"] for d in diffs)


def test_site_yml_converges_on_the_docker_hosts_without_kubernetes(site_runs):
    (rc, doc), _ = site_runs
    assert rc == 0, playbook_failures(doc)
    roles = {task["task"]["name"].split(" : ")[0] for play in doc["plays"]
             for task in play["tasks"] if set(task["hosts"]) & set(HOSTS)}
    assert {"gpu_preflight", "nvidia_driver", "nvidia_container_toolkit"} <= roles
    assert "nvidia_device_plugin" not in roles


def test_a_second_run_changes_nothing(site_runs):
    _, (rc, doc) = site_runs
    assert rc == 0, playbook_failures(doc)
    assert {host: doc["stats"][host]["changed"] for host in HOSTS} == dict.fromkeys(HOSTS, 0)


def test_the_runtime_is_set_up_per_docker_generation(docker_lab, site_runs):
    daemon = {h: json.loads(_on(docker_lab, h, "cat /etc/docker/daemon.json")) for h in HOSTS}
    # Docker 26 injects CDI devices: the feature is on; Docker 20.10 has none to turn on.
    assert daemon["docker-13"]["features"] == {"cdi": True}
    assert "features" not in daemon["docker-12"]
    for host in HOSTS:
        gpus = _on(docker_lab, host, "/opt/gpuprov-sim/bin/nvidia-smi -L").splitlines()
        uuids = [line.split("UUID: ")[1].rstrip(")") for line in gpus]
        assert daemon[host]["node-generic-resources"] == [f"NVIDIA-GPU={u}" for u in uuids]
        toolkit = _on(docker_lab, host, "cat /etc/nvidia-container-runtime/config.toml")
        assert 'swarm-resource = "DOCKER_RESOURCE_NVIDIA-GPU"' in toolkit.splitlines()


def test_verify_passes_every_container_and_swarm_check(docker_lab, site_runs):
    rc, doc, err = _verify(docker_lab)
    assert doc is not None, err
    checks = {**_results(doc, "containers"), **_results(doc, "swarm")}
    bad = {k: (r["status"], r["message"]) for k, r in checks.items()
           if r["status"] != "pass" and not (k[1] == SWARM_WARNING and r["status"] == "warn")
           and not (k[1] in ("containers.cuda-compat", "containers.no-request")
                    and r["status"] == "skip")}
    assert bad == {}, bad
    assert rc == 0, err
    for host in HOSTS:
        for check in ("containers.gpu-count", "containers.isolation", "swarm.generic-resources",
                      "swarm.service"):
            assert checks[host, check]["status"] == "pass", (host, check)
    # CDI names on Docker 26 only: Docker 20.10 refuses them as device paths.
    assert "--device nvidia.com/gpu=" in " ".join(
        checks["docker-13", "containers.gpu-count"]["details"]["requests"])
    assert " ".join(checks["docker-12", "containers.gpu-count"]["details"]["requests"]) \
        == "--gpus 4"
    # The leak Swarm needs, reported on both.
    assert {checks[h, SWARM_WARNING]["status"] for h in HOSTS} == {"warn"}
    for host in HOSTS:
        assert _on(docker_lab, host, "docker ps -aq").strip() == "", f"containers left on {host}"
    assert _on(docker_lab, "docker-12", "docker service ls -q").strip() == "", "services left"


def test_nvidia_as_default_with_the_variable_heard_fails_no_request(docker_lab, site_runs):
    """A plain Docker host (not a Swarm GPU node) whose admin made nvidia the default runtime:
    a container that asks for nothing but sets NVIDIA_VISIBLE_DEVICES=all gets every GPU."""
    settings = ["-e", "nvidia_container_toolkit_docker_swarm=false",
                "-e", "nvidia_container_toolkit_docker_default_runtime=true"]
    # The toolkit stage alone (with the preflight and validate stages, tagged always): site.yml's
    # own verify stage would fail the run on the very check this test is about.
    stage = ["--limit", "docker-12", "--tags", "container_toolkit"]
    rc, doc = run_playbook(docker_lab, "site.yml", *stage, *settings)
    try:
        assert rc == 0, playbook_failures(doc)
        rc, result, err = _verify(docker_lab, "--limit", "docker-12", "--checks", "containers",
                                  "-e", "nvidia_container_toolkit_docker_swarm=false")
        no_request = _results(result, "containers")["docker-12", "containers.no-request"]
        assert (rc, no_request["status"]) == (1, "fail"), err
        assert "accept-nvidia-visible-devices-envvar-when-unprivileged" in no_request["message"]
        assert "nvidia_container_toolkit_docker_default_runtime: false" in \
            no_request["remediation"]
        assert len(no_request["details"]["seen"]) == 4
    finally:
        rc, doc = run_playbook(docker_lab, "site.yml", *stage)
        assert rc == 0, playbook_failures(doc)


def test_a_node_advertising_a_gpu_it_lacks_fails_generic_resources(docker_lab, site_runs):
    docker_lab.fault("docker-13", "gpu-lost", gpu_index=5)
    try:
        rc, doc, err = _verify(docker_lab, "--checks", "swarm.generic-resources")
        results = _results(doc, "swarm")
        lost = results["docker-13", "swarm.generic-resources"]
        assert (rc, lost["status"]) == (1, "fail"), err
        assert "advertises 1 GPU(s) it does not have" in lost["message"]
        assert results["docker-12", "swarm.generic-resources"]["status"] == "pass"
    finally:
        docker_lab.fault("docker-13", "gpu-lost", clear=True)


def test_ctrl_c_during_the_container_phase_leaves_no_container(docker_lab, site_runs):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuprov", "verify", "-i", str(docker_lab.inventory_path),
         "--checks", "containers.isolation"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _on(docker_lab, "docker-13", "docker ps -q").strip():
        time.sleep(0.2)
    assert _on(docker_lab, "docker-13", "docker ps -q").strip(), "no smoke container within 60 s"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err
    for host in HOSTS:
        assert _on(docker_lab, host, "docker ps -aq").strip() == "", host


def test_status_shows_every_gpu_of_the_docker_hosts(docker_lab, site_runs):
    proc = subprocess.run([sys.executable, "-m", "gpuprov", "status", "-i",
                           str(docker_lab.inventory_path), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    counts = {n["node"]: len(n["gpus"]) for n in json.loads(proc.stdout)["nodes"]}
    assert counts == {"docker-12": 4, "docker-13": 8}
