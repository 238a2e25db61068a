"""The gpu_health role's decisions, called through plugins/filter/gpu_health.py.

    check(settings)                       the role's settings, checked (ValueError: what to change)
    kube_access(kubeconfig_text, path)    the agent's API access from the kubelet's kubeconfig
    agent_config(node, settings, access, hostvars)
                                          /etc/gpuprov/health.json (gpuprov/node/health/agent.py)
    agent_script()                        the agent's payload script (gpuprov/payload.py)
    remediate_check(settings)             the remediation service's settings, checked
    remediate_exec(settings, credential)  its unit's ExecStart line (systemd-quoted)

The agent publishes with the kubelet's identity: the role reads the node's kubelet kubeconfig
(YAML, which a bare node cannot parse) on the controller and hands the agent what it points
to: the server, the CA, the client certificate and key files (the kubelet rotates them in
place, so paths, not copies, wherever the kubeconfig gives paths).
"""

from __future__ import annotations

import base64
import dataclasses
import posixpath
import re
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


# -- `gpuprov health remediate` as a service on a management host ------------------------------

REMEDIATE_SETTINGS = ("gpu_health_remediate_enabled", "gpu_health_remediate_command",
                      "gpu_health_remediate_kubeconfig", "gpu_health_remediate_context",
                      "gpu_health_remediate_interval", "gpu_health_remediate_max_unavailable",
                      "gpu_health_remediate_taint", "gpu_health_remediate_drain",
                      "gpu_health_remediate_plugin_namespace")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def remediate_check(settings: Mapping[str, Any]) -> dict:
    """The remediation service's settings, checked before the first change (ValueError names
    the setting and what to give)."""
    from gpuprov.errors import GpuprovError
    from gpuprov.health import remediate

    unknown = sorted(set(settings) - set(REMEDIATE_SETTINGS))
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
    for key in ("gpu_health_remediate_enabled", "gpu_health_remediate_taint",
                "gpu_health_remediate_drain"):
        if not isinstance(settings.get(key), bool):
            raise ValueError(f"{key} must be true or false, not {settings.get(key)!r}")
    if not settings["gpu_health_remediate_enabled"]:
        return dict(settings)
    for key in ("gpu_health_remediate_command", "gpu_health_remediate_kubeconfig"):
        if not posixpath.isabs(str(settings.get(key) or "")):
            raise ValueError(f"{key} must be an absolute path on the management host, not "
                             f"{settings.get(key)!r}")
    interval = settings.get("gpu_health_remediate_interval")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval < 5:
        raise ValueError("gpu_health_remediate_interval must be a number of seconds >= 5 (each "
                         f"round lists every node), not {interval!r}")
    limit = settings.get("gpu_health_remediate_max_unavailable")
    if limit is not None:
        try:
            remediate.limit(str(limit), 10)
        except GpuprovError:
            raise ValueError("gpu_health_remediate_max_unavailable must be a node count (3) or a "
                             f"percentage of the GPU nodes (10%), or null, not {limit!r}") from None
    namespace = settings.get("gpu_health_remediate_plugin_namespace")
    if not isinstance(namespace, str) or not _DNS_LABEL.match(namespace):
        raise ValueError("gpu_health_remediate_plugin_namespace must be a namespace name, not "
                         f"{namespace!r}")
    context = settings.get("gpu_health_remediate_context")
    if context is not None and (not isinstance(context, str) or not context.strip()):
        raise ValueError(f"gpu_health_remediate_context must be a context name or null, not "
                         f"{context!r}")
    return dict(settings)


def remediate_kubeconfig_check(kubeconfig_text: str, path: str) -> None:
    """The service runs as a dynamic user that gets the kubeconfig, and nothing else, as a
    systemd credential: it must carry its credentials inline (certificate data or a token),
    not name other files or a plugin to run."""
    access = kube_access(kubeconfig_text, path)
    named = sorted(k for k in ("ca_file", "cert_file", "key_file", "token_file") if k in access)
    if named:
        raise ValueError(f"{path}: the kubeconfig names other files ({', '.join(named)}), which "
                         "the remediation service cannot read: give one with the data inline "
                         "(certificate-authority-data, client-certificate-data, client-key-data "
                         "or token), e.g. `kubectl config view --raw --flatten --minify`")


def systemd_quote(word: str) -> str:
    """One ExecStart word as systemd reads it back (systemd.service(5), "Command lines" and
    systemd.unit(5) specifiers): % and $ doubled (a literal, not a specifier or variable),
    quoted where it has spaces, quotes, backslashes or a semicolon."""
    text = word.replace("%", "%%").replace("$", "$$")
    if any(c in text for c in " \t\"'\\;") or not text:
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def remediate_exec(settings: Mapping[str, Any], credential: str = "kubeconfig") -> str:
    """The unit's ExecStart: remediate in a loop, its kubeconfig from the service's credential
    directory (LoadCredential), every option from the settings."""
    argv = [settings["gpu_health_remediate_command"], "health", "remediate",
            "--interval", f"{settings['gpu_health_remediate_interval']:g}",
            "--plugin-namespace", settings["gpu_health_remediate_plugin_namespace"]]
    if settings.get("gpu_health_remediate_context"):
        argv += ["--context", settings["gpu_health_remediate_context"]]
    if settings.get("gpu_health_remediate_max_unavailable") is not None:
        argv += ["--max-unavailable", str(settings["gpu_health_remediate_max_unavailable"])]
    argv += ["--taint"] * bool(settings.get("gpu_health_remediate_taint"))
    argv += ["--drain"] * bool(settings.get("gpu_health_remediate_drain"))
    # ${CREDENTIALS_DIRECTORY} is systemd's, expanded when the service starts: not quoted away.
    return " ".join([*(systemd_quote(w) for w in argv), "--kubeconfig",
                     "${CREDENTIALS_DIRECTORY}/" + credential])
