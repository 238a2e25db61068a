"""Node backends: where the simulated kubelet and device plugin meet a node.

A backend answers three questions about a node (which GPUs does NVML report, how is the
container runtime configured, run this command there) and lists the nodes. `LabBackend`
answers them for `gpuprov lab` nodes (podman containers; the simulated NVML on the host);
`FakeBackend` answers them from memory and runs commands as local processes, for unit tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import posixpath
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

NVIDIA_RUNTIME_BINARY = "nvidia-container-runtime"
LOG_LIMIT = 1 << 20  # bytes of output kept per container run, like the kubelet's log rotation


@dataclass(frozen=True)
class Gpu:
    uuid: str
    healthy: bool = True


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: str = "8"
    memory: str = "32Gi"


@dataclass(frozen=True)
class RuntimeConfig:
    """What the node's container runtime can run: handler names whose runtime is NVIDIA's,
    the handler used when a pod names no RuntimeClass, and the NVIDIA toolkit's settings
    that decide which GPU requests its runtime honours (its config.toml, as the probe reads
    it; absent keys at the toolkit's defaults)."""

    nvidia_handlers: frozenset[str] = frozenset()
    default_handler: str = "runc"
    runtime: str = "containerd"
    toolkit_settings: Mapping[str, bool] = field(default_factory=dict)

    def handler_is_nvidia(self, handler: str | None) -> bool:
        return (handler or self.default_handler) in self.nvidia_handlers


class Process(Protocol):
    def output(self) -> str: ...
    def poll(self) -> int | None: ...
    def kill(self) -> None: ...


class NodeBackend(Protocol):
    def nodes(self) -> list[NodeSpec]: ...
    def gpus(self, node: str) -> list[Gpu] | None:
        """GPUs NVML enumerates on the node (None: NVML does not initialise)."""
    def runtime(self, node: str) -> RuntimeConfig: ...
    def start(self, node: str, key: str, argv: list[str], env: dict[str, str],
              on_exit: Callable[[], None] | None = None) -> Process:
        """Run argv in the node; on_exit is called once the process has exited."""


class LocalProcess:
    """A child process whose merged stdout/stderr is collected by a reader thread.

    on_exit runs in that thread once the process has exited, so its owner (the emulated
    kubelet) can react at once instead of at its next periodic pass."""

    def __init__(self, argv: list[str], env: dict[str, str],
                 on_exit: Callable[[], None] | None = None, group: bool = False) -> None:
        # group: the process leads a process group of its own, and stopping it stops the group
        # (SIGTERM, then SIGKILL after KILL_GRACE_SECONDS): what nsenter starts is its child.
        self._group = group
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=group)
        self._buf = bytearray()
        self._lock = threading.Lock()
        self._on_exit = on_exit
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for chunk in iter(lambda: self._proc.stdout.read1(65536), b""):
            with self._lock:
                self._buf += chunk
                if len(self._buf) > LOG_LIMIT:
                    del self._buf[: len(self._buf) - LOG_LIMIT]
        if self._on_exit is not None:
            self._proc.wait()  # end of output comes just before the exit status
            self._on_exit()

    def output(self) -> str:
        with self._lock:
            return self._buf.decode(errors="replace")

    def poll(self) -> int | None:
        code = self._proc.poll()
        if code is not None:
            self._reader.join(timeout=5)  # all output is in before the exit is reported
        return code

    def kill(self) -> None:
        """Stop the process. A process group gets SIGTERM and, KILL_GRACE_SECONDS later,
        SIGKILL, in a thread of its own: the emulated kubelet deleting eight pods does not
        wait for them, as a real kubelet's sync loop does not wait for containers to stop.
        Not a daemon thread: exiting waits for it."""
        if self._group:
            threading.Thread(target=self._stop, name="pod-kill").start()
        else:
            self._stop()

    def _stop(self) -> None:
        if self._group:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(KILL_GRACE_SECONDS)
            self._signal_group(signal.SIGKILL)
        if self._proc.poll() is None:
            self._proc.kill()

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)


# -- runtime configuration, from the probe's report ----------------------------------------------

# (probe section, runtime name, default handler when the config names none), in the order the
# emulator picks a node's runtime when several are configured.
_RUNTIME_SECTIONS = (("containerd", "containerd", "runc"), ("crio", "cri-o", "crun"),
                     ("docker", "docker", "runc"))


def _runs_nvidia(binary: object, binaries: dict) -> bool:
    """The handler's binary is NVIDIA's runtime (or its .cdi/.legacy variant) and is installed.

    The probe reports where nvidia-container-runtime itself is; the variants ship in the same
    package, so its presence stands for theirs."""
    if not isinstance(binary, str):
        return False
    name = posixpath.basename(binary)
    if not name.startswith(NVIDIA_RUNTIME_BINARY):
        return False
    return binaries.get(name, binaries.get(NVIDIA_RUNTIME_BINARY)) is not None


def runtime_from_probe(report: dict) -> RuntimeConfig:
    """The probe report's container_runtime section -> RuntimeConfig of the first runtime
    configured on the node (containerd, then CRI-O, then Docker)."""
    section = report.get("container_runtime") or {}
    binaries = section.get("binaries") or {}
    settings = dict((section.get("toolkit_config") or {}).get("settings") or {})
    for key, runtime, default in _RUNTIME_SECTIONS:
        found = section.get(key) or {}
        if not found.get("present"):
            continue
        handlers = frozenset(name for name, spec in (found.get("runtimes") or {}).items()
                             if _runs_nvidia((spec or {}).get("binary"), binaries))
        return RuntimeConfig(handlers, found.get("default_runtime_name") or default, runtime,
                             settings)
    return RuntimeConfig(toolkit_settings=settings)


# -- the fake backend (unit tests) --------------------------------------------------------------

@dataclass
class FakeNode:
    gpus: list[Gpu] | None = field(default_factory=list)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    spec: NodeSpec | None = None


class FakeBackend:
    """Nodes held in memory; commands run as local processes with the pod's environment."""

    def __init__(self, nodes: dict[str, FakeNode]) -> None:
        self.node_map = nodes
        self.started: list[tuple[str, list[str], dict[str, str]]] = []

    def nodes(self) -> list[NodeSpec]:
        return [n.spec or NodeSpec(name) for name, n in self.node_map.items()]

    def gpus(self, node: str) -> list[Gpu] | None:
        return self.node_map[node].gpus

    def runtime(self, node: str) -> RuntimeConfig:
        return self.node_map[node].runtime

    def start(self, node: str, key: str, argv: list[str], env: dict[str, str],
              on_exit: Callable[[], None] | None = None) -> Process:
        self.started.append((node, argv, env))
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return LocalProcess(argv, {**base, **env}, on_exit=on_exit)


# -- the lab backend (podman containers) ----------------------------------------------------

_NVML_SCRIPT = r"""
import json, pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    print(json.dumps({"error": str(err)})); raise SystemExit(0)
gpus = []
for i in range(pynvml.nvmlDeviceGetCount()):
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
        gpus.append({"uuid": uuid if isinstance(uuid, str) else uuid.decode(), "healthy": True})
    except pynvml.NVMLError:
        gpus.append({"uuid": "", "healthy": False})
print(json.dumps({"gpus": gpus}))
"""

RUNTIME_CACHE_SECONDS = 1.0
# A pod's processes get SIGTERM when it is deleted, SIGKILL this long after (a real kubelet's
# grace period is the pod's; the smoke pods' `sleep` ends at once).
KILL_GRACE_SECONDS = 2.0
# A pod process's environment before the pod's own: what the node image's config gives
# `podman exec` (the lab's image sets no other).
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root"}
# The variable the lab's simulated NVML reads for the GPUs a container was given
# (SIMULATION.md): set by the emulated kubelet from NVIDIA's runtime rules
# (gpuprov/lab/toolkit/toolkit_rules.py), in place of the /dev/nvidia<N> device nodes the real
# runtime would give the container.
CONTAINER_GPUS_ENV = "GPUPROV_SIM_CONTAINER_GPUS"
# A GPU pod's PATH in a lab node: the simulated nvidia-smi (gpuprov/lab/image/nvidia-smi, the
# one the container toolkit would inject) before the node's own, which would be Debian's real
# nvidia-smi once the driver is installed, and which cannot talk to the simulated NVML.
SIM_PATH = "/opt/gpuprov-sim/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class LabBackend:
    """`gpuprov lab` nodes: lab.json names them and their containers; the simulated NVML's
    configuration is on the host under nodes/<node>/sim, read through pynvml and the lab's
    simulated libnvidia-ml.so.1 (the same path the probe uses, so both see the same GPUs).
    The container runtime's configuration is what the production probe reports, run in the
    node container."""

    def __init__(self, lab_dir: Path) -> None:
        self.lab_dir = Path(lab_dir)
        state = json.loads((self.lab_dir / "lab.json").read_text())
        self.containers = {n["name"]: n["container"] for n in state["nodes"]}
        self._gpu_cache: dict[str, tuple[tuple, list[Gpu] | None]] = {}
        self._runtime_cache: dict[str, tuple[float, RuntimeConfig]] = {}
        # node -> (host PID of its container's init, the container's ID)
        self._inits: dict[str, tuple[str, str]] = {}

    def nodes(self) -> list[NodeSpec]:
        # A node container sees the host's CPUs and memory, and so would a kubelet in it.
        cpu = str(os.cpu_count() or 1)
        memory = "32Gi"
        meminfo = Path("/proc/meminfo")
        if meminfo.exists():
            for line in meminfo.read_text().splitlines():
                if line.startswith("MemTotal:"):
                    memory = f"{line.split()[1]}Ki"
        return [NodeSpec(name, cpu, memory) for name in self.containers]

    def _podman(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        from gpuprov.lab import podman  # the lab's one way to run podman

        return subprocess.run(["podman", *args], env=podman.environment(), capture_output=True,
                              timeout=timeout, check=False)

    def gpus(self, node: str) -> list[Gpu] | None:
        sim = self.lab_dir / "nodes" / node / "sim"
        if not sim.is_dir():
            return []
        signature = tuple(sorted((str(p), p.stat().st_mtime_ns) for p in sim.rglob("*")
                                 if p.is_file()))
        cached = self._gpu_cache.get(node)
        if cached and cached[0] == signature:
            return cached[1]
        env = {k: v for k, v in os.environ.items() if k != CONTAINER_GPUS_ENV}
        env["GPUPROV_SIM_DIR"] = str(sim)
        env["LD_LIBRARY_PATH"] = str(self.lab_dir / "nvml")
        proc = subprocess.run([sys.executable, "-c", _NVML_SCRIPT], env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        try:
            doc = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            doc = {"error": proc.stderr.strip()[-200:]}
        result = None if "error" in doc else [Gpu(g["uuid"], g["healthy"]) for g in doc["gpus"]]
        self._gpu_cache[node] = (signature, result)
        return result

    def _init_pid(self, node: str) -> str | None:
        """The host PID of the node container's init (its root is /proc/<pid>/root), None
        while the container is not running. Checked on every use (its cgroup names the
        container): a container started again has another init."""
        known = self._inits.get(node)
        if known is not None:
            pid, container_id = known
            try:
                if container_id in Path(f"/proc/{pid}/cgroup").read_text():
                    return pid
            except OSError:
                pass
        proc = self._podman("container", "inspect", "--format", "{{.Id}} {{.State.Pid}}",
                            self.containers[node], timeout=15)
        fields = proc.stdout.decode().split()
        if proc.returncode != 0 or len(fields) != 2 or fields[1] == "0":
            self._inits.pop(node, None)
            return None
        self._inits[node] = (fields[1], fields[0])
        return fields[1]

    def _node_root(self, node: str) -> str | None:
        """The node container's root directory as the host sees it, None while it is stopped."""
        pid = self._init_pid(node)
        return None if pid is None else f"/proc/{pid}/root"

    def runtime(self, node: str) -> RuntimeConfig:
        """What the production probe's runtime section (gpuprov.probe.runtime) reads in the
        node's files, read from the host through the container's root: file reads, not a
        `podman exec` of the whole probe, so the controllers' passes can ask at every pass
        (cached RUNTIME_CACHE_SECONDS). Absolute symlinks inside the node would resolve on
        the host; the configs, drop-ins and NVIDIA binaries it reads are plain files."""
        from gpuprov.probe import runtime as probe_runtime
        from gpuprov.probe.fs import Root

        cached = self._runtime_cache.get(node)
        if cached and time.monotonic() - cached[0] < RUNTIME_CACHE_SECONDS:
            return cached[1]
        root = self._node_root(node)
        if root is None:
            # A stopped node says nothing about its config: keep the last one. Read as "no
            # NVIDIA runtime", it would take the node's GPUs away for a moment.
            return cached[1] if cached else RuntimeConfig()
        try:
            section = probe_runtime.collect(Root(root))
        except OSError:  # the container stopped while it was read
            return cached[1] if cached else RuntimeConfig()
        config = runtime_from_probe({"container_runtime": section})
        self._runtime_cache[node] = (time.monotonic(), config)
        return config

    def start(self, node: str, key: str, argv: list[str], env: dict[str, str],
              on_exit: Callable[[], None] | None = None) -> Process:
        """A pod's process in the node: `nsenter` into every namespace of the node container's
        init (about 20 ms, where `podman exec` costs about 130 ms of CPU; eight isolation pods
        start at once). It runs in the node's filesystem, PID namespace and network, not in
        the container's cgroup, and is stopped from the host as a process group. A node that
        is not running gets `podman exec`, which fails as a real runtime would."""
        from gpuprov.lab import podman

        if env.get(CONTAINER_GPUS_ENV, "void") not in ("void", "none", ""):
            # What NVIDIA's runtime does to a GPU container: its nvidia-smi is there to run.
            env = {"PATH": SIM_PATH, **env}
        pid = self._init_pid(node)
        if pid is not None:
            args = ["nsenter", "--target", pid, "--all", "--root", "--wd",
                    "env", "-i", *(f"{k}={v}" for k, v in {**BASE_ENV, **env}.items()), *argv]
            return LocalProcess(args, dict(os.environ), on_exit=on_exit, group=True)
        args = ["podman", "exec"]
        for name, value in env.items():
            args += ["--env", f"{name}={value}"]
        args += [self.containers[node], *argv]
        return LocalProcess(args, podman.environment(), on_exit=on_exit)


def host_kernel() -> str:
    return platform.release()
