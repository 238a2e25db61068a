"""Cluster phase: what the Kubernetes API says about the nodes, in a constant number of
requests: one LIST of nodes and one LIST of non-terminated pods, whatever the node count.

Objects stay JSON (no typed client models): a 1000-node LIST deserialises several times
faster, and checks read a few fields.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuprov import gpu_allocation
from gpuprov.errors import GpuprovError

# Pods that hold or may soon hold GPUs: Succeeded/Failed pods release theirs.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
REQUEST_TIMEOUT = (5.0, 60.0)  # connect, read (s)


@dataclasses.dataclass(frozen=True)
class ClusterView:
    server: str
    nodes: Mapping[str, Mapping[str, Any]]  # node name -> Node object
    pods_by_node: Mapping[str, tuple[Mapping[str, Any], ...]]  # non-terminated pods
    # The DRA nodes' ResourceSlices of NVIDIA's driver, by node name; a string where they could
    # not be read (the API serves no resource.k8s.io/v1, say), for dra.slice to report.
    slices_by_node: Mapping[str, tuple[Mapping[str, Any], ...] | str] = dataclasses.field(
        default_factory=dict)


def ready_condition(node: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The Node's Ready condition (None: no such node, or no such condition yet)."""
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), None)


def is_ready(node: Mapping[str, Any] | None) -> bool:
    return (ready_condition(node) or {}).get("status") == "True"


def find_kubeconfig(explicit: str | None, inventory_value: str | None) -> str | None:
    """--kubeconfig, else the inventory's k8s_kubeconfig, else $KUBECONFIG, else
    ~/.kube/config; None when there is none (the cluster checks are then skipped)."""
    if explicit:
        if not Path(explicit).is_file():
            raise GpuprovError(f"kubeconfig {explicit} does not exist; pass the file "
                               "kubectl uses (--kubeconfig FILE)")
        return explicit
    if inventory_value:
        if not Path(inventory_value).is_file():
            raise GpuprovError(f"kubeconfig {inventory_value} (the inventory's "
                               "k8s_kubeconfig) does not exist; is the cluster up?")
        return inventory_value
    for candidate in (os.environ.get("KUBECONFIG", "").split(os.pathsep)[0],
                      str(Path.home() / ".kube" / "config")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def api_client(kubeconfig: str, context: str | None) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context,
                                client_configuration=configuration)
    except config.ConfigException as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if context:
            contexts = _contexts(kubeconfig)
            if contexts is not None and context not in contexts:
                raise GpuprovError(f"context {context!r} is not in {kubeconfig} (it has: "
                                   f"{', '.join(contexts) or 'none'}); pass one of them "
                                   "with --context") from None
        raise GpuprovError(f"cannot use kubeconfig {kubeconfig}: {text}") from None
    except (OSError, ValueError) as exc:
        raise GpuprovError(f"cannot read kubeconfig {kubeconfig}: {exc}") from None
    # One retry: an API server that is down should say so in seconds, not minutes.
    configuration.retries = 1
    return client.ApiClient(configuration)


def _contexts(kubeconfig: str) -> list[str] | None:
    import yaml

    try:
        doc = yaml.safe_load(Path(kubeconfig).read_text())
        return [c["name"] for c in doc.get("contexts") or []]
    except (OSError, yaml.YAMLError, AttributeError, KeyError, TypeError):
        return None


def _list(call: Any, **kwargs: Any) -> list[dict]:
    response = call(_preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
    return json.loads(response.data).get("items") or []


def node_slices(api: Any, node: str) -> tuple[Mapping[str, Any], ...] | str:
    """The ResourceSlices NVIDIA's DRA driver publishes for one node (field selectors on
    spec.nodeName and spec.driver, which the API server supports for ResourceSlices), or why
    they cannot be read."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return tuple(_list(client.ResourceV1Api(api).list_resource_slice,
                           field_selector=f"spec.nodeName={node},spec.driver={gpu_allocation.DRA_DRIVER}"))
    except ApiException as exc:
        if exc.status == 404:
            return ("the API server serves no resource.k8s.io/v1 ResourceSlices (Kubernetes "
                    "1.34 or later is needed for DRA)")
        return f"listing ResourceSlices refused: {exc.status} {exc.reason}"


def snapshot(api: Any, dra_nodes: tuple[str, ...] = ()) -> ClusterView:
    """Two LIST requests, and one per DRA node for its ResourceSlices; GpuprovError (exit 2)
    when the API server cannot be used."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    core = client.CoreV1Api(api)
    server = api.configuration.host
    try:
        nodes = _list(core.list_node)
        pods = _list(core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)
        slices = {name: node_slices(api, name) for name in dra_nodes}
    except ApiException as exc:
        raise GpuprovError(f"Kubernetes API at {server} refused the request: {exc.status} "
                           f"{exc.reason}; check the kubeconfig's credentials") from None
    except (HTTPError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise GpuprovError(f"Kubernetes API at {server} unreachable: "
                           f"{str(reason).splitlines()[0]}; is the cluster up, and is this "
                           "the right kubeconfig/--context?") from None
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            by_node.setdefault(node_name, []).append(pod)
    return ClusterView(
        server=server,
        nodes={n["metadata"]["name"]: n for n in nodes},
        pods_by_node={k: tuple(v) for k, v in by_node.items()},
        slices_by_node=slices,
    )
