"""The lab: several Debian nodes on one machine, with simulated GPUs, reachable over SSH.

Each node runs the Debian release its profile names (profiles.NodeProfile.os, or `P@OS` in
`lab up --nodes`): the default lab mixes Debian 12 (containerd 1.6, Debian's drivers) and
Debian 13 (containerd 2.x, R580 from the lab's mirror of NVIDIA's CUDA repository).

Each node is a podman container with systemd as PID 1 and sshd published on
127.0.0.1:<port> (test traffic never goes to container bridge addresses). A node's
simulated hardware (see SIMULATION.md) lives in the lab directory on the host and is
bind-mounted in, so `gpuprov lab fault` changes it without touching the container.

Lab directory layout (default ./.lab, git-ignored):
    lab.json                     what `lab up` created: the only record `lab down` trusts
    ssh/id_ed25519[.pub]         the admin key the nodes accept
    ssh/known_hosts              every node's host key: host key checking stays on
    nvml/libnvidia-ml.so.1       the simulated NVML (built from lab/nvml/simnvml.c)
    nodes/<node>/pci             simulated /sys/bus/pci/devices
    nodes/<node>/sim             simulated NVML configuration and fault switches (GPU nodes)
    nodes/<node>/ssh_host_ed25519_key[.pub]
    kube/                        the emulated Kubernetes API: pid, URL, log, fault switches
    pkgrepo/                     the simulated NVIDIA container toolkit's signed apt repository
                                 (pkgrepo.py), mounted read-only in every node; kept by `lab down`
    cudarepo/                    the simulated mirror of NVIDIA's CUDA repository (driver
                                 packages for debian12 and debian13: cudarepo.py), the same way

The apt archives of the nodes (apt-archives/lab/<node>/) and the pod image's archive are kept
in the machine's cache (gpuprov/lab/cache.py), not here: downloads survive `lab down`, a
rebuild and another clone.

Next to the inventory, `lab up` writes inventory/lab/kubeconfig for the emulated API
(gpuprov/lab/kube/EMULATION.md).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuprov.errors import GpuprovError
from gpuprov.lab import cudarepo, image, needs, nodefaults, pkgrepo, podman, profiles, simhw
from gpuprov.lab import faults as lab_faults
from gpuprov.lab.cache import CACHE
from gpuprov.lab.kube import app as kube
from gpuprov.lab.kube import faults as kube_faults

log = logging.getLogger(__name__)

LABEL = "io.gpuprov.lab"
STATE_FILE = "lab.json"
INVENTORY = Path("inventory") / "lab" / "hosts.yml"
KUBECONFIG = Path("inventory") / "lab" / "kubeconfig"
SSH_READY_TIMEOUT = 90.0

# Variables the lab sets in its inventory because a container is not a server. Each one is a
# setting real sites may use too; there are no lab-only code paths in the roles.
# The pod image's archive, kept between labs in the machine's cache, and where nodes see it.
POD_IMAGE_CACHE = CACHE / "lab-images"
POD_IMAGE_NODE_PATH = "/var/lib/gpuprov-sim/pod-image.tar"

LAB_OVERRIDES: dict[str, object] = {
    # A container runs the host's kernel: Debian has no headers package for it, DKMS builds
    # nothing, there is no initramfs, and no module can be loaded, so nvidia-persistenced
    # (which needs /dev/nvidiactl) cannot start. Real nodes keep the defaults (true).
    "nvidia_driver_install_kernel_headers": False,
    "nvidia_driver_install_kernel_headers_meta": False,
    "nvidia_driver_rebuild_initramfs": False,
    "nvidia_driver_load_module": False,
    "nvidia_driver_start_persistenced": False,
    # NVIDIA's repositories cannot be reached here: the toolkit comes from the lab's own signed
    # repository (pkgrepo.py), mounted in every node, through the settings an air-gapped site
    # sets for its mirror. apt verifies it against this key as it would NVIDIA's.
    "nvidia_container_toolkit_repo_url": pkgrepo.REPO_URL,
    "nvidia_container_toolkit_repo_key_url": pkgrepo.KEY_URL,
    # Likewise the driver of nodes with nvidia_driver_source: nvidia: the lab's signed mirror of
    # NVIDIA's CUDA repository (cudarepo.py), with NVIDIA's layout, so the role's own {distro},
    # {arch} and {key} fill in the same paths as on developer.download.nvidia.com.
    "nvidia_driver_cuda_repo_url": cudarepo.REPO_URL,
    "nvidia_driver_cuda_repo_key_url": f"file://{cudarepo.NODE_PATH}/{{distro}}/{{arch}}/{{key}}",
}

# The lab admin's driver choice per node OS, written as host variables: Debian 12 nodes keep
# Debian's own drivers (470 for Kepler, 535); Debian 13 nodes take R580, NVIDIA's long-term
# branch (to 2028), from NVIDIA's repository (the lab's mirror, cudarepo.py): Debian 13's
# archive has 550, and unpinned, NVIDIA's repository would give its newest branch. Debian 12's
# own 470 and 535 lack NVIDIA's later security fixes (R535.261.03 is below 535.309.01, R470
# ended) and its archive has nothing newer: the lab's admin accepts them
# (nvidia_driver_allow_vulnerable), so verify's driver.security warns on those nodes; the
# Debian 13 nodes get R580's fixed version from the mirror and pass it.
LAB_DRIVER_SETTINGS: dict[str, dict[str, Any]] = {
    "debian-12": {"nvidia_driver_source": "distro", "nvidia_driver_allow_vulnerable": True},
    "debian-13": {"nvidia_driver_source": "nvidia", "nvidia_driver_branch": "580"},
}


CONTAINERD, DOCKER = "containerd", "docker"
# `lab up --with-docker`: the Docker hosts added to the lab, one per Docker generation the
# roles tell apart: Debian 12's docker.io 20.10 (GPUs through NVIDIA's hook: `--gpus`) and
# Debian 13's 26.1 (CDI as well). Different GPU series, so that a Swarm service placed by
# gputype has one right node. Together they form the lab's swarm (the first one manages it).
DOCKER_LAB = ["docker-12=gpu-pascal@debian-12+docker", "docker-13=gpu-hopper@debian-13+docker"]


@dataclass
class Node:
    name: str
    profile: str
    container: str
    ssh_port: int = 0
    os: str = image.DEFAULT_OS
    image: str = ""
    # containerd: a Kubernetes node (the emulated kubelet drives its containerd); docker: a
    # host with Debian's docker.io and no Kubernetes (groups docker_hosts, docker_swarm).
    engine: str = CONTAINERD

    @property
    def has_gpu(self) -> bool:
        return bool(profiles.NODE_PROFILES[self.profile].gpus)

    @property
    def docker(self) -> bool:
        return self.engine == DOCKER


@dataclass
class LabState:
    lab_id: str
    nodes: list[Node] = field(default_factory=list)
    pod_image: str = ""  # what the lab's pods run (the nodes' containerd has it)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        names = ", ".join(n.name for n in self.nodes)
        raise GpuprovError(f"no lab node named {name!r}; the lab has: {names}")


class Lab:
    def __init__(self, project_dir: Path, lab_dir: Path | None = None) -> None:
        self.project_dir = project_dir.resolve()
        self.dir = (lab_dir or self.project_dir / ".lab").resolve()
        # Containers carry an id derived from the lab directory, so two checkouts on one
        # machine (a developer's and CI's) never touch each other's nodes.
        self.lab_id = hashlib.sha256(str(self.dir).encode()).hexdigest()[:8]

    # -- paths -------------------------------------------------------------------------
    @property
    def inventory_path(self) -> Path:
        return self.project_dir / INVENTORY

    @property
    def kubeconfig_path(self) -> Path:
        return self.project_dir / KUBECONFIG

    @property
    def kube_dir(self) -> Path:
        return self.dir / "kube"

    @property
    def key_path(self) -> Path:
        return self.dir / "ssh" / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.dir / "ssh" / "known_hosts"

    @property
    def apt_cache_dir(self) -> Path:
        # Every lab of this machine (the demo's, the test suite's temporary ones, another
        # clone's) shares one package cache per node name instead of downloading again;
        # GPUPROV_LAB_APT_CACHE puts it elsewhere.
        override = os.environ.get("GPUPROV_LAB_APT_CACHE")
        return Path(override).resolve() if override else CACHE / "apt-archives" / "lab"

    @staticmethod
    def cpu_shares() -> int | None:
        """GPUPROV_LAB_CPU_SHARES: the nodes' CPU weight against other containers of the
        machine (podman --cpu-shares; 1024 is a container's default). The test suite gives
        the labs that run beside its session lab less, so that the longest chain of tests,
        the session lab's, is the one served first when the CPUs are short."""
        text = os.environ.get("GPUPROV_LAB_CPU_SHARES")
        if not text:
            return None
        try:
            shares = int(text)
        except ValueError:
            shares = 0
        if not 2 <= shares <= 262144:  # the kernel's cpu.shares range (cgroup v1)
            raise GpuprovError(f"GPUPROV_LAB_CPU_SHARES={text!r} is not a CPU weight: give a "
                               "whole number from 2 to 262144 (1024 is the default), or unset it")
        return shares

    def node_dir(self, name: str) -> Path:
        return self.dir / "nodes" / name

    # -- state ---------------------------------------------------------------------------
    def load(self) -> LabState | None:
        path = self.dir / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return LabState(raw["lab_id"], [Node(**n) for n in raw["nodes"]],
                        raw.get("pod_image", ""))

    def require(self) -> LabState:
        state = self.load()
        if state is None:
            raise GpuprovError(f"no lab in {self.dir}: run `gpuprov lab up` first")
        return state

    def _save(self, state: LabState) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
        tmp.replace(self.dir / STATE_FILE)

    # -- up ------------------------------------------------------------------------------
    def up(self, node_specs: list[str] | None = None, with_docker: bool = False) -> LabState:
        needs.check()  # every missing piece in one line, before anything is started
        self.cpu_shares()  # a bad GPUPROV_LAB_CPU_SHARES, before anything is started
        existing = self.load()
        asked = bool(node_specs) or with_docker
        wanted = plan_nodes((node_specs or profiles.DEFAULT_LAB)
                            + (DOCKER_LAB if with_docker else []))
        if existing is not None:
            have = [(n.name, n.profile, n.os, n.engine) for n in existing.nodes]
            if asked and have != wanted:
                raise GpuprovError(
                    "a lab with other nodes is already up ("
                    + ", ".join(n[0] for n in have)
                    + "): run `gpuprov lab down` first"
                )
            wanted = have
        refs = {(os_name, engine): (image.ensure_docker_image(os_name) if engine == DOCKER
                                    else image.ensure_node_image(os_name))
                for os_name, engine in dict.fromkeys((o, e) for _, _, o, e in wanted)}
        pod_ref, pod_archive = image.ensure_pod_archive(POD_IMAGE_CACHE)
        self._ensure_ssh_key()
        library = simhw.build_nvml_library(self.dir / "nvml")
        repo = pkgrepo.build_repo(self.dir / "pkgrepo")
        cuda = cudarepo.build_repo(self.dir / "cudarepo")
        state = LabState(
            self.lab_id,
            [Node(name, prof, f"gpuprov-{self.lab_id}-{name}", os=os_name,
                  image=refs[os_name, engine], engine=engine)
             for name, prof, os_name, engine in wanted],
            pod_ref,
        )
        self._save(state)  # before starting anything: `lab down` can clean a half-made lab
        shared = {
            # SIMULATION: the local package repository standing in for NVIDIA's (no network).
            repo.root: pkgrepo.NODE_PATH,
            cuda.root: cudarepo.NODE_PATH,
            # SIMULATION: no registry; each node's containerd imports this (gpuprov-sim-images).
            pod_archive: POD_IMAGE_NODE_PATH,
        }
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(state.nodes)) as pool:
            ports = list(pool.map(lambda n: self._start_node(n, shared, library),
                                  state.nodes))
        for node, port in zip(state.nodes, ports, strict=True):
            node.ssh_port = port
        self._save(state)
        self._write_known_hosts(state)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(state.nodes)) as pool:
            list(pool.map(self._wait_for_ssh, state.nodes))
        self._write_inventory(state)
        self._ensure_swarm([n for n in state.nodes if n.docker])
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(state.nodes)) as pool:
            list(pool.map(self._ensure_node_api, [n for n in state.nodes if not n.docker]))
        try:
            url = kube.start_background(self.kube_dir, lab_dir=self.dir)
        except RuntimeError as exc:
            raise GpuprovError(str(exc)) from None
        kube.write_kubeconfig(self.kubeconfig_path, url)
        return state

    def _ensure_ssh_key(self) -> None:
        if not self.key_path.exists():
            self.key_path.parent.mkdir(parents=True, exist_ok=True)
            _ssh_keygen(self.key_path, "gpuprov-lab-admin")

    def _start_node(self, node: Node, shared: dict[Path, str], library: Path) -> int:
        status = _container_status(node.container)
        if status is None:
            self._create_node(node, shared, library)
        elif status != "running":
            podman.podman("start", node.container)
        port = podman.output("port", node.container, "22/tcp")
        return int(port.rsplit(":", 1)[1])

    def _create_node(self, node: Node, shared: dict[Path, str], library: Path) -> None:
        ndir = self.node_dir(node.name)
        if ndir.exists():
            shutil.rmtree(ndir)
        ndir.mkdir(parents=True)
        simhw.write_node_state(ndir, node.name, profiles.NODE_PROFILES[node.profile])
        hostkey = ndir / "ssh_host_ed25519_key"
        _ssh_keygen(hostkey, f"root@{node.name}")
        apt_cache = self.apt_cache_dir / node.name
        (apt_cache / "partial").mkdir(parents=True, exist_ok=True)
        mounts = {
            ndir / "pci": "/sys/bus/pci/devices",
            self.key_path.with_suffix(".pub"): "/root/.ssh/authorized_keys",
            hostkey: "/etc/ssh/ssh_host_ed25519_key",
            hostkey.with_suffix(".pub"): "/etc/ssh/ssh_host_ed25519_key.pub",
            **shared,
            # SIMULATION: the node's kernel log (simhw.KMSG_FILE), the same on every machine.
            ndir / simhw.KMSG_FILE: "/dev/kmsg",
        }
        if node.has_gpu:
            mounts[ndir / "sim"] = "/etc/gpuprov-sim"
            mounts[library.parent] = "/opt/gpuprov-sim/lib"
        if not node.docker:
            # SIMULATION: the node's way to the emulated API with its kubelet's identity
            # (kube/app.py NODE_API_DIR): read-write, a socket is connected to by writing.
            (ndir / kube.NODE_API_DIR).mkdir()
            mounts_rw = {ndir / kube.NODE_API_DIR: kube.NODE_API_PATH}
        else:
            mounts_rw = {}
        containerd_root = ndir / "containerd"
        containerd_root.mkdir()
        args = [
            # --privileged: the node's own containerd runs the lab's pods as containers, which
            # takes what a real server's root has (mounts, namespaces, cgroups); SIMULATION.md.
            "run", "--detach", "--privileged", "--name", node.container,
            "--hostname", node.name, "--label", f"{LABEL}={self.lab_id}", "--systemd=always",
            "--publish", "127.0.0.1::22",
        ]
        shares = self.cpu_shares()
        if shares is not None:
            args += ["--cpu-shares", str(shares)]
        for src, dst in mounts.items():
            args += ["--volume", f"{src}:{dst}:ro"]
        for src, dst in mounts_rw.items():
            args += ["--volume", f"{src}:{dst}"]
        # Downloaded packages outlive the lab, so rebuilding it does not download them again.
        args += ["--volume", f"{apt_cache}:/var/cache/apt/archives"]
        if node.has_gpu:
            # SIMULATION: the MIG state the driver keeps (simnvml.c), written by NVML calls in
            # the node and read by the emulated device plugin on this machine.
            mig_state = ndir / simhw.MIG_STATE_DIR
            mig_state.mkdir(exist_ok=True)
            args += ["--volume", f"{mig_state}:{simhw.MIG_STATE_NODE_PATH}"]
        # containerd's root on the host's filesystem: its overlayfs snapshotter cannot mount
        # layers on top of the node container's own overlay root.
        args += ["--volume", f"{containerd_root}:/var/lib/containerd"]
        if node.docker:
            # The same for Docker's overlay2 storage.
            docker_root = ndir / "docker"
            docker_root.mkdir()
            args += ["--volume", f"{docker_root}:/var/lib/docker"]
        podman.podman(*args, node.image, "/sbin/init")

    def _write_known_hosts(self, state: LabState) -> None:
        lines = []
        for node in state.nodes:
            key = (self.node_dir(node.name) / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"[127.0.0.1]:{node.ssh_port} {key[0]} {key[1]}")
        self.known_hosts_path.write_text("\n".join(lines) + "\n")

    def ssh_command(self, node: Node, *remote: str) -> list[str]:
        return [
            "ssh", "-i", str(self.key_path), "-p", str(node.ssh_port),
            "-o", f"UserKnownHostsFile={self.known_hosts_path}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5", "root@127.0.0.1", *remote,
        ]

    def _wait_for_ssh(self, node: Node) -> None:
        deadline = time.monotonic() + SSH_READY_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            proc = subprocess.run(
                self.ssh_command(node, "true"), capture_output=True, timeout=15, check=False
            )
            if proc.returncode == 0:
                return
            last = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
            time.sleep(0.3)
        raise GpuprovError(
            f"lab node {node.name} did not answer SSH on 127.0.0.1:{node.ssh_port} within "
            f"{SSH_READY_TIMEOUT:.0f} s ({' '.join(last)}); see `podman logs {node.container}`"
        )

    def _write_inventory(self, state: LabState) -> None:
        def host_vars(node: Node) -> dict:
            driver = LAB_DRIVER_SETTINGS.get(node.os, {}) if node.has_gpu else {}
            return {"ansible_port": node.ssh_port, **driver}

        def hosts(gpu: bool) -> dict:
            return {n.name: host_vars(n) for n in state.nodes
                    if n.has_gpu is gpu and not n.docker}

        docker = {n.name: host_vars(n) for n in state.nodes if n.docker}
        groups: dict = {
            "k8s_cluster": {
                "children": {
                    "gpu_nodes": {"hosts": hosts(True)},
                    "cpu_nodes": {"hosts": hosts(False)},
                }
            }
        }
        if docker:
            # Docker hosts, all of them in the lab's swarm (_ensure_swarm). The admin's choice
            # of runtime for the toolkit role: Docker, where the default is containerd.
            groups["docker_hosts"] = {"hosts": docker,
                                      "vars": {"nvidia_container_toolkit_runtime": "docker"}}
            groups["docker_swarm"] = {"hosts": {name: {} for name in docker}}

        doc = {
            "all": {
                "vars": {
                    "ansible_host": "127.0.0.1",
                    "ansible_user": "root",
                    "ansible_ssh_private_key_file": str(self.key_path),
                    # Host keys are checked, against the keys the lab generated.
                    "ansible_ssh_common_args": (
                        f"-o UserKnownHostsFile={self.known_hosts_path} "
                        "-o StrictHostKeyChecking=yes"
                    ),
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "gpuprov_lab": True,
                    # The roles that talk to the Kubernetes API use the lab's emulated one.
                    "k8s_kubeconfig": str(self.kubeconfig_path),
                    # No registry here: the role's smoke test and verify's pods run the lab's
                    # pod image, which every node's containerd has.
                    "nvidia_device_plugin_smoke_image": state.pod_image,
                    **LAB_OVERRIDES,
                },
                "children": groups,
            }
        }
        self.inventory_path.parent.mkdir(parents=True, exist_ok=True)
        header = (
            "# Written by `gpuprov lab up` for this lab; rewritten on every `lab up`,\n"
            "# removed by `lab down`. Not tracked by git.\n"
        )
        self.inventory_path.write_text(header + yaml.safe_dump(doc, sort_keys=False))

    def _ensure_swarm(self, nodes: list[Node]) -> None:
        """A real swarm across the Docker hosts, as their admin makes it before gpuprov runs
        (gpuprov does not create the swarm, as it does not create the Kubernetes cluster): the
        first node inits it and manages it, the others join as workers. Their traffic goes over
        the lab's podman network, node to node; nothing here talks to it but the nodes."""
        if not nodes:
            return
        manager, workers = nodes[0], nodes[1:]
        for node in nodes:  # docker.service is active once the pod image is loaded too
            self._ssh(node, "timeout 180 sh -c 'until systemctl is-active --quiet docker; do "
                            "sleep 0.5; done'")
        if self._ssh(manager, "docker info --format '{{.Swarm.LocalNodeState}}'") != "active":
            self._ssh(manager, "docker swarm init --advertise-addr eth0 >/dev/null")
        address = self._ssh(manager, "docker info --format '{{.Swarm.NodeAddr}}'")
        token = self._ssh(manager, "docker swarm join-token --quiet worker")
        for node in workers:
            if self._ssh(node, "docker info --format '{{.Swarm.LocalNodeState}}'") != "active":
                self._ssh(node, f"docker swarm join --token {token} {address}:2377 >/dev/null")

    def _ensure_node_api(self, node: Node) -> None:
        """SIMULATION: the node's side of its way to the emulated API (kube/app.py
        NODE_API_DIR): systemd-socket-proxyd on 127.0.0.1:6443, and the kubelet's kubeconfig
        where kubeadm puts it, so that what reads the kubelet's credentials on a real node
        (the gpu_health role, for its agent) finds them here. Plain HTTP, no client
        certificate: the socket is the identity (EMULATION.md)."""
        self._ssh(node, _node_api_script(node.name))

    def _ssh(self, node: Node, command: str) -> str:
        proc = subprocess.run(self.ssh_command(node, command), capture_output=True, text=True,
                              timeout=120, check=False)
        if proc.returncode != 0:
            raise GpuprovError(f"lab node {node.name}: `{command}` failed: "
                               f"{proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
        return proc.stdout.strip()

    # -- down ----------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Remove this lab's containers and files; keep images and downloaded packages."""
        kube.stop(self.kube_dir)
        out = podman.output("ps", "--all", "--filter", f"label={LABEL}={self.lab_id}",
                            "--format", "{{.Names}}")
        names = [n for n in out.splitlines() if n]
        if names:
            podman.podman("rm", "--force", "--time", "0", *names)
        for path in (self.dir / "nodes", self.dir / "ssh", self.dir / "nvml", self.kube_dir):
            shutil.rmtree(path, ignore_errors=True)
        (self.dir / STATE_FILE).unlink(missing_ok=True)
        self.inventory_path.unlink(missing_ok=True)
        self.kubeconfig_path.unlink(missing_ok=True)
        return names

    # -- status and faults ---------------------------------------------------------------
    def status(self) -> dict:
        state = self.load()
        if state is None:
            return {"lab_dir": str(self.dir), "up": False, "nodes": []}
        nodes = [self.status_of(node) for node in state.nodes]
        return {
            "lab_dir": str(self.dir),
            "up": True,
            "inventory": str(self.inventory_path),
            "kubernetes": {"url": kube.url(self.kube_dir),
                           "kubeconfig": str(self.kubeconfig_path)},
            "nodes": nodes,
        }

    def status_of(self, node: Node) -> dict:
        ndir = self.node_dir(node.name)
        return {
            "name": node.name,
            "profile": node.profile,
            "os": node.os,
            "image": node.image,
            "container": node.container,
            "state": _container_status(node.container) or "missing",
            "ssh": f"127.0.0.1:{node.ssh_port}",
            "gpus": len(profiles.NODE_PROFILES[node.profile].gpus),
            "faults": (simhw.active_faults(ndir) if node.has_gpu else [])
            + nodefaults.active_faults(ndir)
            + kube_faults.active_faults(self.kube_dir, node.name),
        }

    def fault(self, node_name: str, fault: str, clear: bool = False,
              gpu_index: int | None = None) -> list[str]:
        node = self.require().node(node_name)
        spec = lab_faults.get(fault)
        if spec.layer in ("kube", "node"):
            # Whole-node faults of the emulated cluster or of the node's own files.
            if spec.needs_gpu and not node.has_gpu:
                raise GpuprovError(
                    f"node {node.name} has no GPUs: fault {fault!r} needs a GPU node"
                )
            if gpu_index is not None:
                raise GpuprovError(f"fault {fault!r} hits the whole node: leave out --gpu")
        if spec.layer == "kube":
            change = kube_faults.clear_fault if clear else kube_faults.set_fault
            change(self.kube_dir, node.name, fault)
        elif spec.layer == "node":
            change = nodefaults.clear_fault if clear else nodefaults.set_fault
            change(self.node_dir(node.name), node.container, fault)
        elif clear:
            simhw.clear_fault(self.node_dir(node.name), fault)
        else:
            simhw.set_fault(self.node_dir(node.name), fault, gpu_index=gpu_index)
        return self.status_of(node)["faults"]


def _node_api_script(name: str) -> str:
    server = f"http://127.0.0.1:{kube.NODE_API_PORT}"
    kubeconfig = yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "default-cluster", "cluster": {"server": server}}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "users": [{"name": "default-auth", "user": {}}],
    }, sort_keys=False)
    socket_unit = (
        "[Unit]\nDescription=gpuprov lab: the emulated Kubernetes API on 127.0.0.1\n"
        f"[Socket]\nListenStream=127.0.0.1:{kube.NODE_API_PORT}\n"
        "[Install]\nWantedBy=sockets.target\n")
    service_unit = (
        "[Unit]\nDescription=gpuprov lab: forward to the emulated Kubernetes API\n"
        "Requires=gpuprov-lab-apiserver.socket\nAfter=gpuprov-lab-apiserver.socket\n"
        "[Service]\nExecStart=/lib/systemd/systemd-socket-proxyd "
        f"{kube.NODE_API_PATH}/{kube.NODE_API_SOCKET}\n")
    files = {"/etc/systemd/system/gpuprov-lab-apiserver.socket": socket_unit,
             "/etc/systemd/system/gpuprov-lab-apiserver.service": service_unit,
             "/etc/kubernetes/kubelet.conf": kubeconfig}
    writes = " && ".join(
        f"mkdir -p {shlex.quote(os.path.dirname(path))} && printf %s {shlex.quote(text)} "
        f"> {shlex.quote(path)}" for path, text in files.items())
    return (f"{writes} && chmod 600 /etc/kubernetes/kubelet.conf && systemctl daemon-reload "
            "&& systemctl enable --now --quiet gpuprov-lab-apiserver.socket")


def plan_nodes(specs: list[str]) -> list[tuple[str, str, str, str]]:
    """`[NAME=]PROFILE[@OS][+docker]` -> (node name, profile, OS, engine); repeats get -2, -3 ...

    OS defaults to the profile's own (`gpu-pascal@debian-13`: the same hardware on Debian 13).
    `+docker`: a Docker host (Debian's docker.io, no Kubernetes) instead of a Kubernetes node.
    """
    plan: list[tuple[str, str, str, str]] = []
    seen: dict[str, int] = {}
    for spec in specs:
        name, _, prof = spec.strip().partition("=")
        if not prof:
            name, prof = "", name
        prof, plus, engine = prof.partition("+")
        if plus and engine != DOCKER:
            raise GpuprovError(f"lab node {spec!r}: the only engine after '+' is docker "
                               "(e.g. gpu-pascal@debian-12+docker)")
        prof, _, os_name = prof.partition("@")
        if prof not in profiles.NODE_PROFILES:
            known = ", ".join(sorted(profiles.NODE_PROFILES))
            raise GpuprovError(f"unknown lab node profile {prof!r}; known profiles: {known}")
        os_name = image.node_os(os_name or profiles.NODE_PROFILES[prof].os).name
        if not name:
            seen[prof] = seen.get(prof, 0) + 1
            name = prof if seen[prof] == 1 else f"{prof}-{seen[prof]}"
        if any(name == n[0] for n in plan):
            raise GpuprovError(f"lab node name {name!r} given twice in --nodes")
        plan.append((name, prof, os_name, DOCKER if plus else CONTAINERD))
    if not plan:
        raise GpuprovError("--nodes is empty: give at least one profile, e.g. --nodes gpu-pascal")
    return plan


def _container_status(name: str) -> str | None:
    proc = podman.podman("container", "inspect", "--format", "{{.State.Status}}", name,
                         check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def _ssh_keygen(path: Path, comment: str) -> None:
    path.unlink(missing_ok=True)
    path.with_suffix(".pub").unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
