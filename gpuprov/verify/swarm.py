"""Swarm phase: what a manager of the swarm says of the Swarm GPU nodes (docker_swarm), and smoke
services scheduled by Swarm itself, through the Docker Engine API over SSH (as the container
phase: gpuprov.verify.containers.docker_client). Every service it creates carries this run's
label and is removed on the way out (Ctrl-C included); Swarm removes their tasks' containers.

    generic-resources   the manager's Node objects: each node's named generic resources of the
                        GPU kind (Description.Resources.GenericResources)
    service             per GPU node, a one-replica service that reserves one GPU
                        (`--generic-resource KIND=1`) pinned to the node (node.id): the GPU Swarm
                        assigned (the task's AssignedGenericResources) and what `nvidia-smi -L`
                        printed in its container (its log, read from the node's engine);
                        per GPU series, a service placed by the series label
                        (`node.labels.gputype==<series>`): the node it landed on
Judged by gpuprov/verify/checks/swarm.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpuprov.nvidia.labels import compute_labels
from gpuprov.verify.containers import LABEL, _engine_words, docker_client
from gpuprov.verify.pods import gpu_uuids

log = logging.getLogger(__name__)

DONE_STATES = ("complete", "failed", "rejected", "shutdown", "orphaned")


@dataclasses.dataclass(frozen=True)
class ServiceRecord:
    name: str
    request: str  # what it asked Swarm for
    node_id: str = ""  # where Swarm ran its task
    state: str = ""  # the task's last state
    assigned: tuple[str, ...] = ()  # the GPUs Swarm assigned it (generic resources)
    seen: tuple[str, ...] = ()  # the GPUs its container saw
    error: str = ""  # what the manager or the task said when it did not run


@dataclasses.dataclass(frozen=True)
class SwarmView:
    error: str = ""  # no manager could be asked
    manager: str = ""
    # swarm node ID -> {"hostname", "resources": [(kind, value)], "labels"}
    nodes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    node_ids: Mapping[str, str] = dataclasses.field(default_factory=dict)  # inventory -> ID
    services: Mapping[str, ServiceRecord] = dataclasses.field(default_factory=dict)
    # series value -> the placed service's record; series_nodes: value -> IDs that have it
    placed: Mapping[str, ServiceRecord] = dataclasses.field(default_factory=dict)
    series_nodes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def _resources(node: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    described = ((node.get("Description") or {}).get("Resources") or {})
    for resource in described.get("GenericResources") or []:
        named = resource.get("NamedResourceSpec")
        discrete = resource.get("DiscreteResourceSpec")
        if named:
            out.append((str(named.get("Kind")), str(named.get("Value"))))
        elif discrete:
            out.append((str(discrete.get("Kind")), str(discrete.get("Value"))))
    return out


def _assigned(task: Mapping[str, Any], kind: str) -> tuple[str, ...]:
    """The GPUs Swarm assigned a task: the Engine API's Task.GenericResources (moby
    daemon/cluster/convert/task.go fills it from swarmkit's AssignedGenericResources;
    api/types/swarm/task.go)."""
    return tuple(str((r.get("NamedResourceSpec") or {}).get("Value"))
                 for r in task.get("GenericResources") or []
                 if (r.get("NamedResourceSpec") or {}).get("Kind") == kind)


@contextlib.contextmanager
def _removing(client: Any, run_id: str, manager: str,
              node_clients: Mapping[str, Any]) -> Iterator[None]:
    """Every service of this run removed on the way out, and its tasks' containers with it:
    Swarm keeps a finished task's container as task history (task-history-limit) and its
    agents remove them only some time after the service is gone, so they are removed here
    from each node's engine (by the service's label). What could not be removed is said on
    stderr with the command that removes it."""
    label = f"{LABEL}={run_id}"
    try:
        yield
    finally:
        left: list[str] = []
        removed: list[str] = []
        try:
            for service in client.services.list(filters={"label": label}):
                try:
                    service.remove()
                    removed.append(service.id)
                except Exception:  # the SDK's errors: said below
                    left.append(service.name)
        except Exception as exc:
            left.append(f"(could not list them: {_engine_words(exc)})")
        from docker.errors import NotFound

        for node_client in node_clients.values():
            for service_id in removed:
                try:
                    owned = {"label": f"com.docker.swarm.service.id={service_id}"}
                    for container in node_client.containers.list(all=True, filters=owned,
                                                                sparse=True):
                        with contextlib.suppress(NotFound):  # Swarm's agent was quicker
                            container.remove(force=True)
                except Exception as exc:
                    left.append(f"a container of service {service_id[:12]} "
                                f"({_engine_words(exc)})")
        if left:
            log.warning("could not remove verify's Swarm service(s) or their containers: %s; "
                        "remove them with `docker service rm $(docker service ls -q --filter "
                        "label=%s)` on %s and `docker rm -f` on the nodes",
                        ", ".join(left), label, manager)


def _service(client: Any, node_clients: Mapping[str, Any], image: str, run_id: str,
             name: str, request: str, kind: str, constraints: list[str],
             timeout: float) -> ServiceRecord:
    import docker

    try:
        service = client.services.create(
            image, ["sh", "-c", "nvidia-smi -L"], name=name, labels={LABEL: run_id},
            constraints=constraints,
            resources=docker.types.Resources(generic_resources={kind: 1}),
            restart_policy=docker.types.RestartPolicy(condition="none"),
            mode=docker.types.ServiceMode("replicated", replicas=1))
    except Exception as exc:
        return ServiceRecord(name, request, error=_engine_words(exc))
    deadline = time.monotonic() + timeout
    task: Mapping[str, Any] = {}
    while time.monotonic() < deadline:
        tasks = service.tasks()
        task = tasks[0] if tasks else {}
        if (task.get("Status") or {}).get("State") in DONE_STATES:
            break
        time.sleep(0.3)
    status = task.get("Status") or {}
    node_id = str(task.get("NodeID") or "")
    seen: tuple[str, ...] = ()
    container_id = (status.get("ContainerStatus") or {}).get("ContainerID")
    node_client = node_clients.get(node_id)
    if container_id and node_client is not None:
        with contextlib.suppress(Exception):
            seen = tuple(gpu_uuids(node_client.containers.get(container_id).logs()
                                   .decode(errors="replace")))
    state = str(status.get("State") or "not scheduled")
    error = "" if state == "complete" else str(status.get("Err") or status.get("Message") or
                                               f"the task is {state} after {timeout:.0f} s")
    return ServiceRecord(name, request, node_id, state, _assigned(task, kind), seen, error)


def collect(members: Sequence[Any], runs: Mapping[str, Any], image: str, timeout: float,
            check_ids: set[str]) -> SwarmView:
    """`members`: the probe results of the Swarm GPU nodes; `runs`: their ContainerRuns (which
    say each one's swarm node ID and whether its engine manages the swarm)."""
    ids = {r.node.name: runs[r.node.name].swarm_node_id for r in members
           if r.node.name in runs and runs[r.node.name].swarm_node_id}
    manager = next((r for r in members if r.node.name in runs
                    and runs[r.node.name].swarm_manager), None)
    if manager is None:
        return SwarmView(error="no host of docker_swarm answered as a manager of its swarm "
                               "(docker info: Swarm.ControlAvailable); the swarm was not checked")
    try:
        client = docker_client(manager.node.target)
        nodes = {n.attrs["ID"]: {"hostname": (n.attrs.get("Description") or {}).get("Hostname"),
                                 "resources": _resources(n.attrs),
                                 "labels": (n.attrs.get("Spec") or {}).get("Labels") or {}}
                 for n in client.nodes.list()}
    except Exception as exc:
        return SwarmView(error=f"the manager {manager.node.name} did not answer: "
                               f"{_engine_words(exc)}")
    view = SwarmView(manager=manager.node.name, nodes=nodes, node_ids=ids)
    if "swarm.service" not in check_ids:
        return view
    run_id = secrets.token_hex(4)
    node_clients: dict[str, Any] = {}
    services: dict[str, ServiceRecord] = {}
    placed: dict[str, ServiceRecord] = {}
    series_nodes: dict[str, list[str]] = {}
    try:
        with _removing(client, run_id, manager.node.name, node_clients):
            for result in members:
                node_id = ids.get(result.node.name)
                if node_id:
                    with contextlib.suppress(Exception):
                        node_clients[node_id] = docker_client(result.node.target)
            for result in members:
                node_id = ids.get(result.node.name)
                if not node_id:
                    continue
                kind = result.node.swarm_kind
                services[result.node.name] = _service(
                    client, node_clients, image, run_id,
                    f"gpuprov-verify-{run_id}-{len(services)}", f"{kind}=1 on node.id=={node_id}",
                    kind, [f"node.id=={node_id}"], timeout)
                key = result.node.series_key
                series = compute_labels(result.report or {}, key).get(key)
                if series:
                    series_nodes.setdefault(series, []).append(node_id)
            for series in series_nodes:
                key = members[0].node.series_key
                kind = members[0].node.swarm_kind
                placed[series] = _service(
                    client, node_clients, image, run_id,
                    f"gpuprov-verify-{run_id}-{series}", f"{kind}=1 on node.labels.{key}=={series}",
                    kind, [f"node.labels.{key}=={series}"], timeout)
    finally:
        for other in node_clients.values():
            with contextlib.suppress(Exception):
                other.close()
        with contextlib.suppress(Exception):
            client.close()
    return dataclasses.replace(view, services=services, placed=placed,
                               series_nodes={k: tuple(v) for k, v in series_nodes.items()})
