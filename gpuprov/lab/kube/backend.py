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
import posixpath
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuprov.errors import GpuprovError
from gpuprov.lab.kube import cri
from gpuprov.lab.toolkit import toolkit_rules

NVIDIA_RUNTIME_BINARY = "nvidia-container-runtime"
LOG_LIMIT = 1 << 20  # bytes of output kept per container run, like the kubelet's log rotation
# The variable the lab's simulated NVML reads for the GPUs a container was given
# (SIMULATION.md). On lab nodes the lab's nvidia-container-runtime sets it, by NVIDIA's rules
# (gpuprov/lab/toolkit/toolkit_rules.py); the FakeBackend sets it by the same rules.
CONTAINER_GPUS_ENV = "GPUPROV_SIM_CONTAINER_GPUS"
# The CDI kind of NVIDIA's DRA driver's per-claim specs (draplugin.CDI_VENDOR/CDI_CLASS).
CLAIM_CDI_KIND = "k8s.gpu.nvidia.com/claim"


@dataclass(frozen=True)
class MigDevice:
    """A MIG device as NVML lists it under its GPU (nvmlDeviceGetMigDeviceHandleByIndex).

    `index` is the slot NVML returned it at (go-nvlib's VisitMigDevices passes that slot as
    the device plugin's "<gpu>:<mig>" index); `profile` is the MIG profile as go-nvlib's
    MigProfileInfo.String() writes it ("1g.10gb", "1g.10gb+me", "1c.2g.20gb" for a compute
    instance smaller than its GPU instance)."""

    uuid: str
    profile: str
    index: int = 0
    # What NVIDIA's DRA plugin reads of it (v0.4.1 cmd/gpu-kubelet-plugin/nvlib.go
    # getMigDevices): its GPU instance's profile ID and placement (nvmlGpuInstanceGetInfo)
    # and that profile's nvmlGpuInstanceProfileInfo_t; None where NVML did not answer.
    placement: tuple[int, int] | None = None  # (start, size)
    gi_profile: MigProfileInfo | None = None


@dataclass(frozen=True)
class MigProfileInfo:
    """nvmlGpuInstanceProfileInfo_t's fields the DRA plugin publishes (mig.go
    CommonCapacitiesMig)."""

    id: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int
    memory_mb: int


@dataclass(frozen=True)
class GpuFacts:
    """What NVIDIA's DRA kubelet plugin reads of a GPU through NVML when it starts
    (kubernetes-sigs/dra-driver-nvidia-gpu v0.4.1 cmd/gpu-kubelet-plugin/nvlib.go
    getGpuInfo), as NVML answers: the two system-wide versions are repeated on each GPU."""

    minor: int  # nvmlDeviceGetMinorNumber: /dev/nvidia<minor>
    name: str  # nvmlDeviceGetName
    brand: int  # nvmlDeviceGetBrand (nvmlBrandType)
    architecture: int  # nvmlDeviceGetArchitecture (nvmlDeviceArchitecture_t)
    compute_capability: str  # nvmlDeviceGetCudaComputeCapability as "<major>.<minor>"
    memory_total: int  # nvmlDeviceGetMemoryInfo().total, bytes
    pci_bus_id: str  # nvmlDeviceGetPciInfo().busId, "00000000:18:00.0"
    driver_version: str  # nvmlSystemGetDriverVersion
    cuda_driver_version: int  # nvmlSystemGetCudaDriverVersion, 12080 for 12.8


@dataclass(frozen=True)
class Gpu:
    uuid: str
    healthy: bool = True
    mig_enabled: bool = False  # MIG mode current (nvmlDeviceGetMigMode)
    mig_devices: tuple[MigDevice, ...] = ()
    facts: GpuFacts | None = None  # None: NVML did not answer one of the calls


@dataclass(frozen=True)
class NodeSpec:
    name: str
    cpu: str = "8"
    memory: str = "32Gi"


@dataclass(frozen=True)
class NodeInfo:
    """What a kubelet reads on its node for the Node's status.nodeInfo: the kernel release,
    /etc/os-release PRETTY_NAME, /proc/sys/kernel/random/boot_id, /etc/machine-id,
    /sys/class/dmi/id/product_uuid (cadvisor's machine info) and the runtime's CRI Version
    answer as `<runtime name>://<runtime version>` (kubernetes pkg/kubelet/nodestatus/setters.go
    MachineInfo, VersionInfo)."""

    os_image: str
    kernel_version: str
    container_runtime_version: str
    boot_id: str
    machine_id: str = ""
    system_uuid: str = ""
    # Why the runtime did not answer the CRI call ("": it did): the kubelet then reports
    # "container runtime is down" and skips pod synchronization (pkg/kubelet/runtime.go).
    runtime_error: str = ""


def read_node_info(root: str, runtime_version: str, runtime_error: str = "") -> NodeInfo:
    """NodeInfo from a node's files below `root`, read by gpuprov's own probe (the same reader
    `gpuprov probe` runs on the node: gpuprov.node.probe.host)."""
    from gpuprov.node.probe.fs import Root
    from gpuprov.node.probe.host import collect_host

    node = Root(root)
    host = collect_host(node)
    return NodeInfo(
        os_image=(host["os"] or {}).get("pretty_name") or "", kernel_version=host["kernel"] or "",
        container_runtime_version=runtime_version, boot_id=host["boot_id"] or "",
        machine_id=node.read_line("/etc/machine-id") or "",
        system_uuid=node.read_line("/sys/class/dmi/id/product_uuid") or "",
        runtime_error=runtime_error)


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


@dataclass(frozen=True)
class ContainerRequest:
    """One container of a pod as a kubelet asks its runtime for it (CRI CreateContainer, in
    the pod's sandbox): the pod's spec with the device plugin's Allocate answer added (env,
    mounts, annotations, CDI devices). Which GPUs it gets is the node runtime's decision."""

    pod_uid: str
    pod_name: str
    namespace: str
    name: str
    image: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    attempt: int = 0
    mounts: tuple[toolkit_rules.Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
    privileged: bool = False
    add_capabilities: tuple[str, ...] = ()
    drop_capabilities: tuple[str, ...] = ()
    handler: str = ""  # the RuntimeClass's handler; "" is the runtime's default
    sandbox_privileged: bool = False  # some container of the pod is privileged

    @property
    def security_context(self) -> dict:
        return {"privileged": self.privileged,
                "capabilities": {"add": list(self.add_capabilities),
                                 "drop": list(self.drop_capabilities)}}


class StartError(RuntimeError):
    """A container could not be started; `reason` is the kubelet's waiting reason
    (ErrImagePull, CreateContainerError, RunContainerError, ContainerCreating)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Process(Protocol):
    container_id: str

    def output(self) -> str: ...
    def poll(self) -> int | None: ...
    def kill(self) -> None: ...


class NodeBackend(Protocol):
    def nodes(self) -> list[NodeSpec]: ...
    def node_info(self, node: str) -> NodeInfo | None:
        """What the node's kubelet reads on it now; None while the node is not running (its
        kubelet posts nothing and renews no lease)."""
    def gpus(self, node: str) -> list[Gpu] | None:
        """GPUs NVML enumerates on the node (None: NVML does not initialise)."""
    def runtime(self, node: str) -> RuntimeConfig: ...
    def start(self, node: str, request: ContainerRequest,
              on_exit: Callable[[], None] | None = None) -> Process:
        """Run the container on the node (raises StartError); on_exit is called once it has
        exited."""
    def stop_pod(self, node: str, uid: str) -> None:
        """The pod has finished: stop its sandbox (its containers stay for their logs)."""
    def collect(self, node: str, alive: set[str]) -> None:
        """Remove the sandboxes and containers of pods that are not in `alive` (UIDs)."""
    def write_cdi_spec(self, node: str, vendor: str, cls: str, id_strategy: str,
                       path: str) -> str | None:
        """Make sure the node has a CDI spec of its GPUs (names by id_strategy) at `path`:
        written where it is missing; the problem, or None."""
    def write_claim_cdi_spec(self, node: str, path: str, devices: Mapping[str, str]
                             ) -> str | None:
        """NVIDIA's DRA plugin's prepare: the claim's CDI spec at `path` with one device per
        entry (CDI device name -> the GPU's UUID); the problem, or None."""
    def delete_claim_cdi_spec(self, node: str, path: str) -> None:
        """Its unprepare: the claim's spec file goes."""
    def claim_cdi_spec_exists(self, node: str, path: str) -> bool: ...


class ClaimSpecs:
    """The FakeBackend's stand-in for a node's /var/run/cdi claim specs: spec path -> CDI ID
    -> the GPU (UUID) its device injects."""

    def __init__(self) -> None:
        self.specs: dict[tuple[str, str], dict[str, str]] = {}

    def resolve(self, node: str, ids: Iterable[str]) -> list[str]:
        """The GPUs of the claim CDI IDs; StartError for one no spec defines (containerd:
        "unresolvable CDI devices")."""
        known = {i: uuid for (n, _), devices in self.specs.items() if n == node
                 for i, uuid in devices.items()}
        missing = [i for i in ids if i not in known]
        if missing:
            raise StartError("RunContainerError", "failed to create containerd container: "
                             "CDI device injection failed: unresolvable CDI devices "
                             + ", ".join(missing))
        return [known[i] for i in ids if known[i]]  # "": a device without device nodes


class LocalProcess:
    """A child process whose merged stdout/stderr is collected by a reader thread.

    on_exit runs in that thread once the process has exited, so its owner (the emulated
    kubelet) can react at once instead of at its next periodic pass."""

    def __init__(self, argv: list[str], env: dict[str, str],
                 on_exit: Callable[[], None] | None = None, container_id: str = "") -> None:
        self.container_id = container_id
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
        if self._proc.poll() is None:
            self._proc.kill()


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

# A FakeNode's containerRuntimeVersion: its containers are local processes, no runtime.
FAKE_RUNTIME_VERSION = "fake://0"


@dataclass
class FakeNode:
    gpus: list[Gpu] | None = field(default_factory=list)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    spec: NodeSpec | None = None
    info: NodeInfo | None = None  # None: this machine's own (read_node_info of "/")
    running: bool = True  # False: the node is down (no node info, no lease renewal)
    runtime_down: str = ""  # why its runtime does not answer ("": it does)
    # (seq, NVML index, XID) of the XID records in its kernel log (LabBackend.xid_records)
    xids: list[tuple[int, int, int]] = field(default_factory=list)


class FakeBackend:
    """Nodes held in memory; a container is a local process with the pod's environment.

    It stands in for the node's runtime too: NVIDIA's rules (toolkit_rules) decide the GPUs
    a container gets from the request, as the lab's nvidia-container-runtime does on a lab
    node, and CONTAINER_GPUS_ENV tells the process which ("void": none)."""

    def __init__(self, nodes: dict[str, FakeNode]) -> None:
        self.node_map = nodes
        self.started: list[tuple[str, list[str], dict[str, str]]] = []
        self.stopped_pods: list[str] = []
        self.cdi_specs: list[tuple[str, str, str, str]] = []
        self.claim_specs = ClaimSpecs()
        self._count = 0

    def nodes(self) -> list[NodeSpec]:
        return [n.spec or NodeSpec(name) for name, n in self.node_map.items()]

    def gpus(self, node: str) -> list[Gpu] | None:
        return self.node_map[node].gpus

    def xid_records(self, node: str) -> list[tuple[int, int, int]]:
        return list(self.node_map[node].xids)

    def node_info(self, node: str) -> NodeInfo | None:
        fake = self.node_map[node]
        if not fake.running:
            return None
        if fake.runtime_down:
            return read_node_info("/", "fake://Unknown", fake.runtime_down)
        return fake.info or read_node_info("/", FAKE_RUNTIME_VERSION)

    def runtime(self, node: str) -> RuntimeConfig:
        return self.node_map[node].runtime

    def start(self, node: str, request: ContainerRequest,
              on_exit: Callable[[], None] | None = None) -> Process:
        fake = self.node_map[node]
        if not request.argv:
            raise StartError("CreateContainerError",
                             f"the fake backend runs commands only: container {request.name!r} "
                             "has none")
        # The DRA driver's claim devices are containerd's own CDI injection (their kind is no
        # NVIDIA runtime kind); the rest go by NVIDIA's rules.
        claim_ids = [d for d in request.cdi_devices if d.startswith(CLAIM_CDI_KIND + "=")]
        claimed = self.claim_specs.resolve(node, claim_ids)
        container = toolkit_rules.Container(
            dict(request.env), tuple(request.mounts),
            toolkit_rules.is_privileged(request.security_context),
            request.annotations, tuple(d for d in request.cdi_devices if d not in claim_ids))
        try:
            seen = toolkit_rules.container_gpus(
                container, fake.runtime.toolkit_settings, [g.uuid for g in fake.gpus or []],
                fake.runtime.handler_is_nvidia(request.handler),
                {g.uuid: [(d.index, d.uuid) for d in g.mig_devices]
                 for g in fake.gpus or [] if g.mig_enabled})
        except toolkit_rules.UnknownDevice as exc:
            raise StartError("RunContainerError", f"OCI runtime create failed: "
                             f"nvidia-container-runtime: {exc}") from None
        # The node's GPUs in their order, then the MIG devices (by NVIDIA's rules, or claimed).
        node_order = [g.uuid for g in fake.gpus or []]
        seen = [u for u in node_order if u in seen or u in claimed] + list(dict.fromkeys(
            u for u in [*seen, *claimed] if u not in node_order))
        env = {**request.env, CONTAINER_GPUS_ENV: ",".join(seen) or "void"}
        self.started.append((node, list(request.argv), env))
        self._count += 1
        base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        return LocalProcess(list(request.argv), {**base, **env}, on_exit=on_exit,
                            container_id=f"{self._count:064x}")

    def stop_pod(self, node: str, uid: str) -> None:
        self.stopped_pods.append(uid)

    def write_cdi_spec(self, node: str, vendor: str, cls: str, id_strategy: str,
                       path: str) -> str | None:
        spec = (node, f"{vendor}/{cls}", id_strategy, path)
        if spec not in self.cdi_specs:
            self.cdi_specs.append(spec)
        return None

    def write_claim_cdi_spec(self, node: str, path: str, devices: Mapping[str, str]
                             ) -> str | None:
        """devices: CDI device name in the spec -> GPU UUID ("": no device node)."""
        self.claim_specs.specs[(node, path)] = {
            f"{CLAIM_CDI_KIND}={name}": uuid for name, uuid in devices.items()}
        return None

    def delete_claim_cdi_spec(self, node: str, path: str) -> None:
        self.claim_specs.specs.pop((node, path), None)

    def claim_cdi_spec_exists(self, node: str, path: str) -> bool:
        return (node, path) in self.claim_specs.specs

    def collect(self, node: str, alive: set[str]) -> None:
        pass


# -- the lab backend (podman containers) ----------------------------------------------------

_NVML_SCRIPT = r"""
import json, pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as err:
    print(json.dumps({"error": str(err)})); raise SystemExit(0)
def text(value):
    return value if isinstance(value, str) else value.decode()
def gi_profiles(handle):
    # Every GPU instance profile of the GPU by its ID (nvlib.go getGpuInfo's migProfiles).
    found = {}
    for i in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            p = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, i)
        except pynvml.NVMLError:
            continue
        found[p.id] = {"id": p.id, "multiprocessors": p.multiprocessorCount,
                       "copy_engines": p.copyEngineCount, "decoders": p.decoderCount,
                       "encoders": p.encoderCount, "jpeg": p.jpegCount, "ofa": p.ofaCount,
                       "memory_mb": p.memorySizeMB}
    return found
def placement(handle, device, profiles):
    # The MIG device's GPU instance: its profile and placement (nvmlGpuInstanceGetInfo).
    try:
        gi = pynvml.nvmlDeviceGetGpuInstanceById(
            handle, pynvml.nvmlDeviceGetGpuInstanceId(device))
        info = pynvml.nvmlGpuInstanceGetInfo(gi)
    except (pynvml.NVMLError, AttributeError):
        return {}
    return {"placement": [info.placement.start, info.placement.size],
            "gi_profile": profiles.get(info.profileId)}
def mig(handle):
    # MIG mode and devices, as go-nvlib's VisitMigDevices reads them for the device plugin.
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except (pynvml.NVMLError, AttributeError):
        return False, []
    devices = []
    profiles = gi_profiles(handle) if current else {}
    for j in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) if current else 0):
        try:
            device = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except pynvml.NVMLError:
            continue
        name = text(pynvml.nvmlDeviceGetName(device))
        attrs = pynvml.nvmlDeviceGetAttributes_v2(device)
        profile = name.rpartition(" MIG ")[2]
        if attrs.computeInstanceSliceCount != attrs.gpuInstanceSliceCount:
            profile = f"{attrs.computeInstanceSliceCount}c.{profile}"
        devices.append({"uuid": text(pynvml.nvmlDeviceGetUUID(device)), "profile": profile,
                        "index": j, **placement(handle, device, profiles)})
    return bool(current), devices
def facts(handle):
    # What NVIDIA's DRA plugin reads of each GPU (GpuFacts); None where a call fails.
    try:
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return {"minor": pynvml.nvmlDeviceGetMinorNumber(handle),
                "name": text(pynvml.nvmlDeviceGetName(handle)),
                "brand": pynvml.nvmlDeviceGetBrand(handle),
                "architecture": pynvml.nvmlDeviceGetArchitecture(handle),
                "compute_capability": f"{major}.{minor}",
                "memory_total": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
                "pci_bus_id": text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                "driver_version": text(pynvml.nvmlSystemGetDriverVersion()),
                "cuda_driver_version": pynvml.nvmlSystemGetCudaDriverVersion()}
    except (pynvml.NVMLError, AttributeError):
        return None
gpus = []
for i in range(pynvml.nvmlDeviceGetCount()):
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        uuid = pynvml.nvmlDeviceGetUUID(handle)
    except pynvml.NVMLError:
        gpus.append({"uuid": "", "healthy": False})
        continue
    enabled, devices = mig(handle)
    gpus.append({"uuid": text(uuid), "healthy": True, "mig_enabled": enabled,
                 "mig_devices": devices, "facts": facts(handle)})
print(json.dumps({"gpus": gpus}))
"""

RUNTIME_CACHE_SECONDS = 1.0
# A deleted pod's containers get SIGTERM, then SIGKILL this long after (a real kubelet's
# grace period is the pod's; the smoke pods' `sleep` ends at once).
KILL_GRACE_SECONDS = 2
# How often a running container's state is asked (CRI ContainerStatus), and how often the
# sandboxes of pods that are gone are looked for (CRI ListPodSandbox).
STATUS_POLL_SECONDS = 0.2
COLLECT_SECONDS = 2.0
# A container whose node's containerd does not answer this long counts as exited (255).
UNREACHABLE_SECONDS = 60.0


def _mig_device(record: dict) -> MigDevice:
    placement = record.get("placement")
    profile = record.get("gi_profile")
    return MigDevice(record["uuid"], record["profile"], record["index"],
                     tuple(placement) if placement else None,
                     MigProfileInfo(**profile) if profile else None)


class LabBackend:
    """`gpuprov lab` nodes: lab.json names them and their containers; the simulated NVML's
    configuration is on the host under nodes/<node>/sim, read through pynvml and the lab's
    simulated libnvidia-ml.so.1 (the same path the probe uses, so both see the same GPUs).
    The container runtime's configuration is what the production probe reports, run in the
    node container."""

    def __init__(self, lab_dir: Path) -> None:
        self.lab_dir = Path(lab_dir)
        state = json.loads((self.lab_dir / "lab.json").read_text())
        # Kubernetes nodes only: a Docker host (engine docker) has no kubelet.
        self.containers = {n["name"]: n["container"] for n in state["nodes"]
                           if n.get("engine", "containerd") == "containerd"}
        self._gpu_cache: dict[str, tuple[tuple, list[Gpu] | None]] = {}
        self._xid_cache: dict[str, tuple[int, list[tuple[int, int, int]]]] = {}
        self._runtime_cache: dict[str, tuple[float, RuntimeConfig]] = {}
        # node -> (host PID of its container's init, the container's ID)
        self._inits: dict[str, tuple[str, str]] = {}
        self._lock = threading.Lock()
        self._clients: dict[str, tuple[cri.Client, str]] = {}  # node -> (client, node root)
        self._sandboxes: dict[tuple[str, str], str] = {}  # (node, pod UID) -> sandbox ID
        self._pod_locks: dict[tuple[str, str], threading.Lock] = {}
        self._collected: dict[str, float] = {}
        self._runtime_names: dict[str, str] = {}  # node -> runtime name of its last CRI Version

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

    def _podman(self, *args: str, timeout: float = 30,
                stdin: bytes | None = None) -> subprocess.CompletedProcess:
        from gpuprov.lab import podman  # the lab's one way to run podman

        return subprocess.run(["podman", *args], env=podman.environment(), capture_output=True,
                              timeout=timeout, check=False, input=stdin)

    def xid_records(self, node: str) -> list[tuple[int, int, int]]:
        """(seq, NVML index, XID) of the XID records in the node's simulated kernel log
        (simhw.KMSG_FILE), parsed as the health agent parses /dev/kmsg: what NVIDIA's plugin
        gets as NVML XID events (EventTypeXidCriticalError) on a real node. Read again when
        the file changed."""
        from gpuprov.node.health import kmsg

        node_dir = self.lab_dir / "nodes" / node
        path = node_dir / "kmsg"
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            return []
        cached = self._xid_cache.get(node)
        if cached and cached[0] == stamp:
            return cached[1]
        pcis = []
        conf = node_dir / "sim" / "nvml.conf"
        if conf.exists():
            for line in conf.read_text().splitlines():
                if line.startswith("pci_bus_id"):
                    domain, bus, dev = line.split("=", 1)[1].strip().lower().split(":")
                    pcis.append(f"{domain[-4:]}:{bus}:{dev.split('.')[0]}")
        found = []
        for raw in kmsg.split_records(path.read_bytes())[0]:
            record = kmsg.parse_record(raw)
            event = kmsg.gpu_event(record) if record else None
            if event is not None and event.kind == "xid" and event.pci in pcis:
                found.append((record.seq, pcis.index(event.pci), event.xid))
        self._xid_cache[node] = (stamp, found)
        return found

    def gpus(self, node: str) -> list[Gpu] | None:
        sim = self.lab_dir / "nodes" / node / "sim"
        if not sim.is_dir():
            return []
        mig_state = sim.parent / "mig"  # simhw.MIG_STATE_DIR: the driver's MIG state
        # NVML inside the node reports the driver installed there (simnvml.c
        # installed_driver_version): read from here, it looks under the node's root, and a
        # package installed or removed (dpkg's status file) is read again.
        root = self._node_root(node)
        packages = Path(root, "var/lib/dpkg/status") if root else None
        signature = (root, tuple(sorted(
            (str(p), p.stat().st_mtime_ns)
            for p in [*sim.rglob("*"), *mig_state.glob("mig-state"),
                      *([packages] if packages is not None and packages.exists() else [])]
            if p.is_file())))
        cached = self._gpu_cache.get(node)
        if cached and cached[0] == signature:
            return cached[1]
        env = {k: v for k, v in os.environ.items() if k != CONTAINER_GPUS_ENV}
        env["GPUPROV_SIM_DIR"] = str(sim)
        env["GPUPROV_SIM_STATE_DIR"] = str(mig_state)
        env["LD_LIBRARY_PATH"] = str(self.lab_dir / "nvml")
        if root:
            env["GPUPROV_SIM_DRIVER_ROOT"] = root
        proc = subprocess.run([sys.executable, "-c", _NVML_SCRIPT], env=env,
                              capture_output=True, text=True, timeout=30, check=False)
        try:
            doc = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            doc = {"error": proc.stderr.strip()[-200:]}
        result = None if "error" in doc else [
            Gpu(g["uuid"], g["healthy"], bool(g.get("mig_enabled")),
                tuple(_mig_device(d) for d in g.get("mig_devices") or []),
                GpuFacts(**g["facts"]) if g.get("facts") else None)
            for g in doc["gpus"]]
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

    def node_info(self, node: str) -> NodeInfo | None:
        """The node's files through its container's root, and its containerd's answer to the
        CRI Version call. A runtime that does not answer is `<name>://Unknown`, as the kubelet
        reports it (setters.go VersionInfo), with the name it answered with last. The boot ID is
        the kernel's, which every container on a host shares: restarting a node container does
        not change it, as no kernel boots."""
        root = self._node_root(node)
        if root is None:
            return None
        name = self._runtime_names.get(node, "containerd")
        error = ""
        try:
            client, _ = self._client(node)
            name, version = client.version()
            self._runtime_names[node] = name
        except (StartError, cri.CriError) as exc:
            code = getattr(exc, "code", getattr(exc, "reason", ""))
            version, error = "Unknown", f"the CRI Version call failed: {code}: {exc}"
        except GpuprovError as exc:  # no api.proto, stubs not generated
            version, error = "Unknown", exc.message
        except ImportError as exc:  # grpcio missing: `gpuprov lab up` checks it, tests may not
            version, error = "Unknown", (f"the lab's kubelet cannot load {exc.name or exc}: "
                                         "pip install -e '.[dev]'")
        try:
            return read_node_info(root, f"{name}://{version}", error)
        except OSError:  # the container stopped while it was read
            return None

    def runtime(self, node: str) -> RuntimeConfig:
        """What the production probe's runtime section (gpuprov.node.probe.runtime) reads in the
        node's files, read from the host through the container's root: file reads, not a
        `podman exec` of the whole probe, so the controllers' passes can ask at every pass
        (cached RUNTIME_CACHE_SECONDS). Absolute symlinks inside the node would resolve on
        the host; the configs, drop-ins and NVIDIA binaries it reads are plain files."""
        from gpuprov.node.probe import runtime as probe_runtime
        from gpuprov.node.probe.fs import Root

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

    # -- pods, through the node's containerd (CRI) --------------------------------------------
    def _client(self, node: str) -> tuple[cri.Client, str]:
        """The CRI client of the node's containerd and the node's root, as the host sees it.
        A node that is not running has no runtime to ask."""
        root = self._node_root(node)
        if root is None:
            raise StartError("ContainerCreating", f"node {node} is not running")
        with self._lock:
            known = self._clients.get(node)
            if known is not None and known[1] == root:
                return known
            if known is not None:
                known[0].close()
            self._clients[node] = (cri.Client(root), root)
            return self._clients[node]

    def start(self, node: str, request: ContainerRequest,
              on_exit: Callable[[], None] | None = None) -> Process:
        """The container in the pod's sandbox, created and started by the node's containerd
        with the runtime the sandbox's handler names: NVIDIA's (the lab's stand-in) decides
        there which GPUs it gets, from the request and the node's files."""
        client, root = self._client(node)
        try:
            if not client.image_present(request.image):
                raise StartError("ErrImagePull", f'image "{request.image}" is not in the '
                                 "node's containerd, and the lab pulls no images (gpuprov lab "
                                 "imports its pod image into every node)")
            sandbox = self._sandbox(node, client, request)
            container_id = client.create_container(sandbox, request)
        except cri.CriError as exc:
            raise StartError("ContainerCreating" if exc.code == "UNAVAILABLE"
                             else "CreateContainerError", str(exc)) from None
        try:
            client.start_container(container_id)
        except cri.CriError as exc:
            raise StartError("RunContainerError", str(exc)) from None
        return CriContainer(client, container_id, root, on_exit)

    def _sandbox(self, node: str, client: cri.Client, request: ContainerRequest) -> str:
        """The pod's sandbox, made by its first container (containers start side by side: the
        pod's lock keeps them to one sandbox)."""
        key = (node, request.pod_uid)
        with self._lock:
            pod_lock = self._pod_locks.setdefault(key, threading.Lock())
        with pod_lock:
            known = self._sandboxes.get(key)
            if known is None:
                known = self._sandboxes[key] = client.run_sandbox(request)
        return known

    def write_cdi_spec(self, node: str, vendor: str, cls: str, id_strategy: str,
                       path: str) -> str | None:
        """With the node's own nvidia-ctk (the lab's stand-in: NVML through the node's
        library, nvcdi's naming), as the plugin's nvcdi would from its container; a spec
        already there is kept (a file check through the node's root, no podman exec)."""
        root = self._node_root(node)
        if root is not None and Path(root + path).is_file():
            return None
        try:
            proc = self._podman("exec", self.containers[node], "nvidia-ctk", "cdi", "generate",
                                f"--vendor={vendor}", f"--class={cls}",
                                f"--device-name-strategy={id_strategy}", "--format=json",
                                f"--output={path}", timeout=30)
        except subprocess.TimeoutExpired:
            return "nvidia-ctk did not answer in 30 s"
        if proc.returncode != 0:
            return (proc.stderr.decode(errors="replace").strip() or
                    f"nvidia-ctk exited {proc.returncode}")[-300:]
        return None

    def write_claim_cdi_spec(self, node: str, path: str, devices: Mapping[str, str]
                             ) -> str | None:
        """NVIDIA's DRA plugin's prepare on a lab node: the node's nvidia-ctk (the lab's
        stand-in for nvcdi, NVML through the node's library) generates the spec of its GPUs
        named by UUID under the claim kind; the claim's GPUs are kept, renamed to their claim
        device names (cdi.go CreateClaimSpecFile: `<claimUID>-<device>`), and written to
        `path` (the common edits stay: control devices, libraries). A device whose GPU is ""
        keeps no device node (the dra-cdi-spec-empty fault)."""
        vendor, _, cls = CLAIM_CDI_KIND.partition("/")
        try:
            proc = self._podman("exec", self.containers[node], "nvidia-ctk", "cdi", "generate",
                                f"--vendor={vendor}", f"--class={cls}",
                                "--device-name-strategy=uuid", "--format=json", timeout=30)
        except subprocess.TimeoutExpired:
            return "nvidia-ctk did not answer in 30 s"
        if proc.returncode != 0:
            return (proc.stderr.decode(errors="replace").strip() or
                    f"nvidia-ctk exited {proc.returncode}")[-300:]
        try:
            spec = json.loads(proc.stdout)
        except ValueError:
            return "nvidia-ctk wrote no JSON spec"
        generated = {d.get("name"): d for d in spec.get("devices") or []}
        kept = []
        for name, uuid in devices.items():
            if uuid and uuid not in generated:
                return f"GPU {uuid} is not in the node's CDI spec"
            edits = (generated[uuid].get("containerEdits") if uuid else
                     {"env": ["NVIDIA_VISIBLE_DEVICES=void"]})
            kept.append({"name": name, "containerEdits": edits})
        spec["devices"] = kept
        # YAML is a superset of JSON: the .yaml file containerd's CDI registry loads.
        text = json.dumps(spec, indent=2).encode()
        tmp = f"{path}.tmp"
        try:
            proc = self._podman("exec", "-i", self.containers[node], "sh", "-c",
                                f'mkdir -p "$(dirname {path})" && cat > {tmp} && '
                                f"chmod 0644 {tmp} && mv {tmp} {path}", stdin=text, timeout=30)
        except subprocess.TimeoutExpired:
            return "writing the claim's CDI spec did not finish in 30 s"
        if proc.returncode != 0:
            return (proc.stderr.decode(errors="replace").strip() or
                    f"writing {path} exited {proc.returncode}")[-300:]
        return None

    def delete_claim_cdi_spec(self, node: str, path: str) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._podman("exec", self.containers[node], "rm", "-f", path, timeout=30)

    def claim_cdi_spec_exists(self, node: str, path: str) -> bool:
        root = self._node_root(node)
        return root is not None and Path(root + path).is_file()

    def stop_pod(self, node: str, uid: str) -> None:
        with self._lock:
            sandbox = self._sandboxes.get((node, uid))
            known = self._clients.get(node)
        if sandbox is not None and known is not None:
            _in_background(known[0].stop_sandbox, sandbox)

    def collect(self, node: str, alive: set[str]) -> None:
        """Every COLLECT_SECONDS: remove the sandboxes of pods that are gone (their containers
        go with them), those of an earlier emulator's run included."""
        clock = time.monotonic()
        if clock - self._collected.get(node, 0.0) < COLLECT_SECONDS:
            return
        self._collected[node] = clock
        try:
            client, _ = self._client(node)
            sandboxes = client.list_sandboxes()
        except (StartError, cri.CriError):
            return
        for sandbox_id, uid in sandboxes:
            if uid not in alive:
                with self._lock:
                    self._sandboxes.pop((node, uid), None)
                    self._pod_locks.pop((node, uid), None)
                _in_background(client.remove_sandbox, sandbox_id)


def _in_background(call: Callable[[str], None], arg: str) -> None:
    """A CRI call the kubelet does not wait for (stopping takes the containers' grace time).
    Not a daemon thread: exiting waits for it."""
    def run() -> None:
        with contextlib.suppress(cri.CriError):
            call(arg)

    threading.Thread(target=run, name="cri-background").start()


class CriContainer:
    """A container in a lab node's containerd, as the emulated kubelet follows it: a thread
    asks its state every STATUS_POLL_SECONDS until it has exited; its output is the CRI log
    file containerd writes (read through the node's root)."""

    def __init__(self, client: cri.Client, container_id: str, root: str,
                 on_exit: Callable[[], None] | None) -> None:
        self.container_id = container_id
        self._client = client
        self._root = root
        self._on_exit = on_exit
        self._exit_code: int | None = None
        self._log_path = ""
        self._log_seen: tuple[tuple[int, int] | None, str] = (None, "")  # (size, mtime), text
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="cri-status")
        self._watcher.start()

    def _watch(self) -> None:
        unreachable_since = None
        while True:
            try:
                state, code, self._log_path = self._client.container_status(self.container_id)
                unreachable_since = None
            except cri.CriError as exc:
                if exc.code == "NOT_FOUND":
                    state, code = cri.CONTAINER_EXITED, 137  # removed under us
                else:
                    unreachable_since = unreachable_since or time.monotonic()
                    if time.monotonic() - unreachable_since < UNREACHABLE_SECONDS:
                        time.sleep(STATUS_POLL_SECONDS)
                        continue
                    state, code = cri.CONTAINER_EXITED, 255
            if state == cri.CONTAINER_EXITED:
                self._exit_code = code
                if self._on_exit is not None:
                    self._on_exit()
                return
            time.sleep(STATUS_POLL_SECONDS)

    def output(self) -> str:
        """The log so far. The kubelet asks at every pass: the file is read again only when
        containerd has written to it since (its size and mtime changed)."""
        if not self._log_path:
            return ""
        path = f"{self._root}{self._log_path}"
        try:
            stat = os.stat(path)
            if self._log_seen[0] == (stat.st_size, stat.st_mtime_ns):
                return self._log_seen[1]
            with open(path, "rb") as f:
                f.seek(max(0, stat.st_size - LOG_LIMIT))
                raw = f.read()
        except OSError:
            return self._log_seen[1]
        self._log_seen = ((stat.st_size, stat.st_mtime_ns), cri.parse_log(
            raw.decode(errors="replace")))
        return self._log_seen[1]

    def poll(self) -> int | None:
        return self._exit_code

    def kill(self) -> None:
        if self._exit_code is None:
            _in_background(lambda cid: self._client.stop_container(cid, KILL_GRACE_SECONDS),
                           self.container_id)

