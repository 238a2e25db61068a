"""Filters of the gpu_node_upgrade role (playbooks/upgrade-driver.yml;
gpuprov/stages/gpu_node_upgrade.py decides). The cordon, the host's GPU clients and the
failure's annotation are the gpu_node_maintenance role's filters.

    probe | gpuprov_upgrade_plan(node, version=nvidia_driver_version, branch=...)
        -> {"installed", "module", "target", "at_target", "unfinished", "skip",
            "was_cordoned", "summary", "reason"}
    timeout | gpuprov_upgrade_drain(force=False, delete_emptydir_data=False)
        -> {"timeout", "delete_options", "retries", "delay"}   (k8s_drain's delete_options)
    pods | gpuprov_upgrade_pods_left
        -> ["namespace/name", ...]   pods the drain should have removed that are still running
    stdout | gpuprov_upgrade_verify_failures(rc, stderr)
        -> "gpuprov verify exited 1: FAIL gpu.ecc ... | ..."
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_upgrade_plan(probe: Any, node: Any, version: Any = None, branch: Any = None,
                         allow_vulnerable: Any = False) -> dict:
    name = "gpuprov_upgrade_plan"
    probe = support.mapping(probe, name, "the node's probe report (gpu_preflight_probe)")
    node = support.mapping(node, name, "the Node object (k8s_info's resources[0])")
    upgrade = support.stage("gpu_node_upgrade")
    return support.reported(name, lambda: upgrade.plan(probe, node, version, branch,
                                                           allow_vulnerable),
                            (upgrade.UpgradeError,))


def gpuprov_upgrade_drain(timeout: Any, force: Any = False,
                          delete_emptydir_data: Any = False) -> dict:
    upgrade = support.stage("gpu_node_upgrade")
    return support.reported(None, lambda: upgrade.drain(
        timeout, support.flag(force, "gpu_node_upgrade_drain_force"),
        support.flag(delete_emptydir_data, "gpu_node_upgrade_drain_delete_emptydir_data")),
        (upgrade.UpgradeError,))


def gpuprov_upgrade_pods_left(pods: Any) -> list[str]:
    return support.stage("gpu_node_upgrade").pods_left(
        support.items(pods, "gpuprov_upgrade_pods_left", "Pod objects"))


def gpuprov_upgrade_verify_failures(stdout: Any, rc: Any, stderr: Any = "") -> str:
    return support.stage("gpu_node_upgrade").verify_failures(stdout, rc, stderr)


FilterModule = support.filter_module(
    gpuprov_upgrade_plan, gpuprov_upgrade_drain, gpuprov_upgrade_pods_left,
    gpuprov_upgrade_verify_failures)
