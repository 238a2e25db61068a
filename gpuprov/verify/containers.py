"""Container phase: smoke containers on every Docker GPU host, through the Docker Engine API over
SSH (the `docker` Python SDK; no docker CLI on the controller), every container removed again
(Ctrl-C included: the removal is in a `finally`, and it removes by this run's label).

Per Docker host (hosts in parallel), with the pod image or --image:
    gpu-count   `--gpus <k>` (k: every GPU NVML shows on the node), then, where Docker injects
                CDI devices (Docker >= 25 in cdi mode), the same k GPUs by CDI names
                (`--device nvidia.com/gpu=<UUID>`): each must list exactly those k, by UUID
    isolation   one `--gpus device=<index>` container per GPU (up to MAX_ISOLATION), running
                together until each has printed the GPU it sees
    no-request  a container that asks for no GPU but sets NVIDIA_VISIBLE_DEVICES=all (as every
                CUDA image does) under Docker's default runtime: it must see none

The SDK connects through gpuprov's own SSH client (gpuprov.ssh.connect: host keys checked
against the inventory's known_hosts, as everywhere in gpuprov), not through its own paramiko
setup, which reads only ~/.ssh/known_hosts. This module records what the engine and the
containers said (ContainerRun); gpuprov/verify/checks/containers.py judges the records.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpuprov.verify.pods import gpu_uuids

log = logging.getLogger(__name__)

LABEL = "io.gpuprov.verify"
MAX_ISOLATION = 8
CDI_KIND = "nvidia.com/gpu"
SMOKE_COMMAND = ["sh", "-c", "nvidia-smi -L"]
HOLD_COMMAND = ["sh", "-c", "nvidia-smi -L && exec sleep 600"]
NO_REQUEST_COMMAND = ["sh", "-c", "nvidia-smi -L 2>/dev/null; exit 0"]
# The Engine API version asked for: Docker 20.10's (1.41), which every later engine serves.
API_VERSION = "1.41"
POOLS, MAX_SESSIONS = 2, 4


@dataclasses.dataclass(frozen=True)
class ContainerRecord:
    name: str
    request: str  # what it asked for, as the docker CLI would say it
    uuids: tuple[str, ...] = ()
    exit_code: int | None = None
    error: str = ""  # what the engine answered when it refused or failed the container
    output: str = ""


@dataclasses.dataclass(frozen=True)
class ContainerRun:
    node: str
    engine: str = ""  # the engine's version (Docker's /version)
    default_runtime: str = ""
    cdi: bool = False  # the CDI requests were made (Docker >= 25 in cdi mode)
    records: Mapping[str, tuple[ContainerRecord, ...]] = dataclasses.field(default_factory=dict)
    error: str = ""  # the engine could not be reached or asked
    swarm_node_id: str = ""  # the host's node in its swarm ("" outside one)
    swarm_manager: bool = False  # its engine manages the swarm


def docker_client(target: Any, timeout: float = 60.0) -> Any:
    """A docker.DockerClient whose requests go to the node's /var/run/docker.sock through an
    SSH connection gpuprov opened and checked (gpuprov.ssh.connect)."""
    import docker
    from docker.transport.sshconn import SSHHTTPAdapter

    from gpuprov.ssh import connect

    conn = connect(target)
    conn.open()

    class Adapter(SSHHTTPAdapter):
        # The SDK's adapter builds its own paramiko client from ~/.ssh; this one takes
        # gpuprov's, already connected with the inventory's host keys checked.
        def _create_paramiko_client(self, base_url: str) -> None:
            self.ssh_client = conn.client
            self.ssh_params = {}

        def _connect(self) -> None:
            if conn.client.get_transport() is None:
                raise ConnectionError(f"SSH connection to {target.name} closed")

    api = docker.APIClient(base_url="tcp://127.0.0.1:1", version=API_VERSION, timeout=timeout)
    # One session channel per pooled HTTP connection (`docker system dial-stdio`), and the
    # SDK's adapter keeps one pool per request URL (25 pools of 10 by default): at most
    # POOLS x MAX_SESSIONS channels, fewer than sshd's MaxSessions (10 by default).
    adapter = Adapter(f"ssh://{target.user}@{target.host}:{target.port}", timeout=timeout,
                      pool_connections=POOLS, max_pool_size=MAX_SESSIONS)
    api.mount("http+docker://ssh", adapter)
    api.base_url = "http+docker://ssh"
    client = docker.DockerClient.__new__(docker.DockerClient)
    client.api = api
    return client


def _gpu_request(docker: Any, *, count: int | None = None,
                 ids: Sequence[str] | None = None, cdi: bool = False) -> Any:
    if cdi:
        # What the docker CLI (>= 25) sends for `--device <vendor>/<class>=<name>`.
        return docker.types.DeviceRequest(driver="cdi", device_ids=list(ids or []))
    if ids is not None:
        return docker.types.DeviceRequest(device_ids=list(ids), capabilities=[["gpu"]])
    return docker.types.DeviceRequest(count=count, capabilities=[["gpu"]])


def _finish(client: Any, container: Any, name: str, request: str,
            timeout: float) -> ContainerRecord:
    try:
        result = container.wait(timeout=timeout)
        output = container.logs().decode(errors="replace")
        return ContainerRecord(name, request, tuple(gpu_uuids(output)),
                               result.get("StatusCode"), output=output.strip())
    except Exception as exc:  # the SDK's errors and requests' timeouts
        return ContainerRecord(name, request, error=str(exc).splitlines()[0][:300])


def _start(client: Any, image: str, name: str, run_id: str, command: list[str],
           request: Any = None, env: Mapping[str, str] | None = None) -> Any:
    return client.containers.run(
        image, command, name=name, detach=True, labels={LABEL: run_id},
        device_requests=[request] if request is not None else None,
        environment=dict(env or {}))


def _one(client: Any, image: str, run_id: str, request_text: str, command: list[str],
         timeout: float, request: Any = None,
         env: Mapping[str, str] | None = None) -> ContainerRecord:
    name = f"gpuprov-verify-{run_id}-{secrets.token_hex(3)}"
    try:
        container = _start(client, image, name, run_id, command, request, env)
    except Exception as exc:  # the engine refused it: its own words
        return ContainerRecord(name, request_text, error=_engine_words(exc))
    return _finish(client, container, name, request_text, timeout)


def _engine_words(exc: BaseException) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).splitlines()[0][:300]


def _isolation(client: Any, image: str, run_id: str, indices: Sequence[int],
               timeout: float) -> tuple[ContainerRecord, ...]:
    import docker

    started = []
    records = []
    for index in indices[:MAX_ISOLATION]:
        name = f"gpuprov-verify-{run_id}-iso{index}"
        try:
            started.append((index, name, _start(client, image, name, run_id, HOLD_COMMAND,
                                                _gpu_request(docker, ids=[str(index)]))))
        except Exception as exc:
            records.append(ContainerRecord(name, f"--gpus device={index}",
                                           error=_engine_words(exc)))
    deadline = time.monotonic() + timeout
    for index, name, container in started:
        output = ""
        while time.monotonic() < deadline:
            output = container.logs().decode(errors="replace")
            container.reload()
            if gpu_uuids(output) or container.status not in ("created", "running"):
                break
            time.sleep(0.2)
        container.reload()
        records.append(ContainerRecord(name, f"--gpus device={index}",
                                       tuple(gpu_uuids(output)),
                                       None if container.status == "running" else
                                       container.attrs["State"].get("ExitCode"),
                                       output=output.strip()))
    return tuple(records)


@contextlib.contextmanager
def _removing(client: Any, run_id: str, node: str = "") -> Iterator[None]:
    """Every container of this run removed on the way out, whatever happened; what could not
    be removed is said on stderr with the command that removes it (never silently left)."""
    label = f"{LABEL}={run_id}"
    try:
        yield
    finally:
        from docker.errors import NotFound

        left: list[str] = []
        try:
            # sparse: no inspect per container, which races with a container going away.
            for container in client.containers.list(all=True, filters={"label": label},
                                                    sparse=True):
                try:
                    container.remove(force=True)
                except NotFound:
                    pass  # gone already
                except Exception:  # the SDK's errors: said below, with the rest
                    left.append(container.short_id)
        except Exception as exc:
            left.append(f"(could not list them: {_engine_words(exc)})")
        if left:
            log.warning("%s: could not remove verify's container(s) %s; remove them with "
                        "`docker rm -f $(docker ps -aq --filter label=%s)` on the host",
                        node, ", ".join(left), label)


def run_node(target: Any, node: str, gpus: Sequence[Mapping[str, Any]], image: str,
             toolkit_mode: str | None, timeout: float, kinds: Sequence[str]) -> ContainerRun:
    """The smoke containers on one Docker host; `gpus`: NVML's GPUs ({index, uuid});
    `toolkit_mode`: the host's nvidia_container_toolkit_mode (None: auto), which with the
    engine's version says whether Docker injects CDI devices there (gpuprov/runtime_mode.py)."""
    import docker

    from gpuprov import runtime_mode

    try:
        client = docker_client(target)
        version = client.version()
        info = client.info()
    except Exception as exc:
        return ContainerRun(node, error=f"the Docker Engine API did not answer over SSH: "
                                        f"{_engine_words(exc)}")
    engine = str(version.get("Version") or "")
    cdi = runtime_mode.choose(toolkit_mode, "docker",
                              f"Docker version {engine}").mode == runtime_mode.CDI
    swarm_info = info.get("Swarm") or {}
    run_id = secrets.token_hex(4)
    records: dict[str, tuple[ContainerRecord, ...]] = {}
    uuids = [str(g.get("uuid")) for g in gpus]
    try:
        with _removing(client, run_id, node):
            if "gpu-count" in kinds and gpus:
                count = [_one(client, image, run_id, f"--gpus {len(gpus)}", SMOKE_COMMAND,
                              timeout, _gpu_request(docker, count=len(gpus)))]
                if cdi:
                    names = [f"{CDI_KIND}={u}" for u in uuids]
                    count.append(_one(client, image, run_id,
                                      " ".join(f"--device {n}" for n in names), SMOKE_COMMAND,
                                      timeout, _gpu_request(docker, ids=names, cdi=True)))
                records["gpu-count"] = tuple(count)
            if "isolation" in kinds and gpus:
                records["isolation"] = _isolation(
                    client, image, run_id, [int(g.get("index", i)) for i, g in enumerate(gpus)],
                    timeout)
            if "no-request" in kinds:
                records["no-request"] = (_one(client, image, run_id,
                                              "-e NVIDIA_VISIBLE_DEVICES=all (no GPU request)",
                                              NO_REQUEST_COMMAND, timeout,
                                              env={"NVIDIA_VISIBLE_DEVICES": "all"}),)
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return ContainerRun(node, engine, str(info.get("DefaultRuntime") or ""), cdi, records,
                        swarm_node_id=str(swarm_info.get("NodeID") or "")
                        if swarm_info.get("LocalNodeState") == "active" else "",
                        swarm_manager=bool(swarm_info.get("ControlAvailable")))


def run(hosts: Sequence[tuple[Any, str, Sequence[Mapping[str, Any]], str | None]], image: str,
        timeout: float, kinds: Sequence[str], concurrency: int = 16) -> dict[str, ContainerRun]:
    """run_node on every (target, node, gpus, toolkit_mode), in parallel."""
    if not hosts:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(concurrency, len(hosts))) as pool:
        futures = {node: pool.submit(run_node, target, node, gpus, image, mode, timeout, kinds)
                   for target, node, gpus, mode in hosts}
        return {node: future.result() for node, future in futures.items()}
