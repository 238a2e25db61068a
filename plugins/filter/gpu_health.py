"""Filters of the gpu_health role (gpuprov/stages/gpu_health.py decides).

    settings | gpuprov_health_check            -> the settings, checked (one-line error otherwise)
    kubeconfig_b64 | gpuprov_health_kube_access(path)
        -> the agent's API access from the kubelet's kubeconfig (slurped: base64)
    node_name | gpuprov_health_agent_config(settings, access, hostvars[inventory_hostname])
        -> the agent's config file (/etc/gpuprov/health.json)
    '' | gpuprov_health_agent_script           -> the agent's payload script
    settings | gpuprov_health_remediate_check  -> the remediation service's settings, checked
    kubeconfig_b64 | gpuprov_health_remediate_kubeconfig_check(path) -> true, or what is wrong
    settings | gpuprov_health_remediate_exec   -> its unit's ExecStart line
"""

from __future__ import annotations

import base64
from typing import Any

from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_health_check(settings: Any) -> dict:
    settings = support.mapping(settings, "gpuprov_health_check", "the role's settings")
    return support.reported(None, lambda: support.stage("gpu_health").check(dict(settings)))


def gpuprov_health_kube_access(content_b64: Any, path: Any) -> dict:
    text = base64.b64decode(str(content_b64)).decode("utf-8", "replace")
    return support.reported("gpuprov_health_kube_access",
                            lambda: support.stage("gpu_health").kube_access(text, str(path)))


def gpuprov_health_agent_config(node_name: Any, settings: Any, access: Any,
                                hostvars: Any) -> dict:
    settings = support.mapping(settings, "gpuprov_health_agent_config", "the role's settings")
    hostvars = support.mapping(hostvars, "gpuprov_health_agent_config", "the host's vars")
    return support.reported("gpuprov_health_agent_config", lambda: support.stage(
        "gpu_health").agent_config(str(node_name), dict(settings), access or None,
                                   dict(hostvars)))


def gpuprov_health_agent_script(_: Any = None) -> str:
    return support.reported("gpuprov_health_agent_script",
                            lambda: support.stage("gpu_health").agent_script(),
                            (ImportError, OSError))


def gpuprov_health_remediate_check(settings: Any) -> dict:
    settings = support.mapping(settings, "gpuprov_health_remediate_check",
                               "the remediation service's settings")
    return support.reported(None, lambda: support.stage("gpu_health").remediate_check(
        dict(settings)))


def gpuprov_health_remediate_kubeconfig_check(content_b64: Any, path: Any) -> bool:
    text = base64.b64decode(str(content_b64)).decode("utf-8", "replace")
    support.reported(None, lambda: support.stage("gpu_health").remediate_kubeconfig_check(
        text, str(path)))
    return True


def gpuprov_health_remediate_exec(settings: Any) -> str:
    settings = support.mapping(settings, "gpuprov_health_remediate_exec",
                               "the remediation service's settings")
    return support.reported("gpuprov_health_remediate_exec",
                            lambda: support.stage("gpu_health").remediate_exec(dict(settings)))


FilterModule = support.filter_module(gpuprov_health_check, gpuprov_health_kube_access,
                                     gpuprov_health_agent_config, gpuprov_health_agent_script,
                                     gpuprov_health_remediate_check,
                                     gpuprov_health_remediate_kubeconfig_check,
                                     gpuprov_health_remediate_exec)
