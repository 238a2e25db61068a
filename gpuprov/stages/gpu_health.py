"""The gpu_health role's decisions, called through plugins/filter/gpu_health.py.

    check(settings)                       the role's settings, checked (ValueError: what to change)
    kube_access(kubeconfig_text, path)    the agent's API access from the kubelet's kubeconfig
    agent_config(node, settings, access, hostvars)
                                          /etc/gpuprov/health.json (gpuprov/node/health/agent.py)
    agent_script()                        the agent's payload script (gpuprov/payload.py)

The agent publishes with the kubelet's identity: the role reads the node's kubelet kubeconfig
(YAML, which a bare node cannot parse) on the controller and hands the agent what it points
to: the server, the CA, the client certificate and key files (the kubelet rotates them in
place, so paths, not copies, wherever the kubeconfig gives paths).
"""

from __future__ import annotations

import base64
import dataclasses
import posixpath
from collections.abc import Mapping
from typing import Any

SETTINGS = {
    "gpu_health_interval": (int, float),
    "gpu_health_heartbeat": (int, float),
    "gpu_health_clear_after_passes": (int,),
}
PATH_SETTINGS = ("gpu_health_state_dir", "gpu_health_install_dir")
OPTIONAL_PATHS = ("gpu_health_textfile_dir", "gpu_health_kubelet_kubeconfig")


def check(settings: Mapping[str, Any]) -> dict:
    """The settings, checked before the first change; ValueError names the setting."""
    for key, types in SETTINGS.items():
        value = settings.get(key)
        if isinstance(value, bool) or not isinstance(value, types) or value <= 0:
            raise ValueError(f"{key} must be a positive number, not {value!r}")
    if settings["gpu_health_heartbeat"] < settings["gpu_health_interval"]:
        raise ValueError("gpu_health_heartbeat must be at least gpu_health_interval "
                         f"({settings['gpu_health_interval']} s)")
    for key in PATH_SETTINGS:
        if not posixpath.isabs(str(settings.get(key) or "")):
            raise ValueError(f"{key} must be an absolute path, not {settings.get(key)!r}")
    for key in OPTIONAL_PATHS:
        value = settings.get(key)
        if value not in (None, "") and not posixpath.isabs(str(value)):
            raise ValueError(f"{key} must be an absolute path or null, not {value!r}")
    return dict(settings)


def _named(items: Any, name: str, what: str) -> Mapping[str, Any]:
    for item in items or []:
        if isinstance(item, Mapping) and item.get("name") == name:
            return item.get(what) or {}
    raise ValueError(f"the kubeconfig names {what} {name!r} but has none by that name")


def kube_access(kubeconfig_text: str, path: str) -> dict:
    """The agent's access (gpuprov/node/health/kube.py Client) from a kubeconfig's current
    context; relative file names are taken relative to the kubeconfig, as kubectl does."""
    import yaml

    try:
        doc = yaml.safe_load(kubeconfig_text) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not a kubeconfig ({exc})") from None
    context_name = doc.get("current-context")
    if not context_name:
        raise ValueError(f"{path}: no current-context")
    context = _named(doc.get("contexts"), context_name, "context")
    cluster = _named(doc.get("clusters"), context.get("cluster"), "cluster")
    user = _named(doc.get("users"), context.get("user"), "user") if context.get("user") else {}
    base = posixpath.dirname(path)

    def local(name: str | None) -> str | None:
        return posixpath.join(base, name) if name else None

    def data(value: str | None) -> str | None:
        return base64.b64decode(value).decode() if value else None

    if not cluster.get("server"):
        raise ValueError(f"{path}: cluster {context.get('cluster')!r} has no server")
    access = {
        "server": cluster["server"],
        "ca_file": local(cluster.get("certificate-authority")),
        "ca_data": data(cluster.get("certificate-authority-data")),
        "insecure_skip_tls_verify": bool(cluster.get("insecure-skip-tls-verify")),
        "cert_file": local(user.get("client-certificate")),
        "key_file": local(user.get("client-key")),
        "cert_data": data(user.get("client-certificate-data")),
        "key_data": data(user.get("client-key-data")),
        "token": user.get("token"),
        "token_file": local(user.get("tokenFile")),
    }
    if user.get("exec") or user.get("auth-provider"):
        raise ValueError(f"{path}: user {context.get('user')!r} authenticates through a plugin "
                         "(exec/auth-provider), which the agent cannot run; give it a "
                         "kubeconfig with a client certificate or a token")
    return {k: v for k, v in access.items() if v not in (None, False)}


def agent_config(node_name: str, settings: Mapping[str, Any], access: Mapping[str, Any] | None,
                 hostvars: Mapping[str, Any]) -> dict:
    """The agent's config file (agent.Config) for one node."""
    from gpuprov.verify import inventory

    node = inventory.node_from_vars(node_name, {inventory.GPU_GROUP}, dict(hostvars))
    # NodeSettings names what the node-phase checks read of a node: the agent gets exactly
    # those fields of the inventory's node, no second list to keep in step.
    from gpuprov.verify.node_phase import NodeSettings

    node_settings = {f.name: getattr(node, f.name) for f in dataclasses.fields(NodeSettings)
                     if f.name != "name"}
    node_settings["gpu_expected"] = True
    return {
        "node_name": node.node_name,
        "state_dir": settings["gpu_health_state_dir"],
        "interval_s": settings["gpu_health_interval"],
        "heartbeat_s": settings["gpu_health_heartbeat"],
        "clear_after_passes": settings["gpu_health_clear_after_passes"],
        "textfile_dir": settings.get("gpu_health_textfile_dir") or None,
        "kube": dict(access) if access else None,
        "settings": {k: v for k, v in node_settings.items() if v not in (None, False)},
    }


def agent_script() -> str:
    from gpuprov import payload

    return payload.node_script("health-agent").decode("ascii")
