"""Filters of the gpu_mig role (playbooks/mig.yml; gpuprov/stages/gpu_mig.py decides, with
gpuprov/nvidia/mig.py's profiles and layouts).

The role reads (the probe report, the Node, the pods) and writes (Node patches, evictions, the
node's MIG layout through gpuprov/node/mig_apply.py); what to do with what it read is decided
on the controller.

    gpus | gpuprov_mig_check(config, configs=None)
        -> None, or what is wrong with the layout settings (site.yml's validate stage)
    probe | gpuprov_mig_plan(config, configs=None, node=None)
        -> {"managed", "capable", "change", "skip", "summary", "reason", "apply",
            "take_patch", "done_patch", "failed_patch", "labels_patch", ...}
    stdout | gpuprov_mig_applied(rc)     -> the applier's report, or why it has none

The cordon, the host's GPU clients and the failure's annotation are the gpu_node_maintenance
role's (plugins/filter/gpu_node_maintenance.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_mig_check(gpus: Any, config: Any, configs: Any = None) -> str | None:
    gpus = support.objects(gpus, "gpuprov_mig_check", "GPU records (gpu_preflight_gpus)")
    return support.stage("gpu_mig").check(gpus, None if config in (None, "") else str(config),
                                          configs)


def gpuprov_mig_plan(probe: Any, config: Any, configs: Any = None, node: Any = None) -> dict:
    if not isinstance(probe, Mapping):
        raise AnsibleFilterError(f"gpuprov_mig_plan expects the node's probe report, got "
                                 f"{type(probe).__name__}")
    mig = support.stage("gpu_mig")
    return support.reported(None, lambda: mig.plan(
        probe, None if config in (None, "") else str(config), configs,
        node if isinstance(node, Mapping) else None), (mig.StageError,))


def gpuprov_mig_applied(stdout: Any, rc: Any) -> dict:
    return support.stage("gpu_mig").applied(str(stdout or ""), rc)


FilterModule = support.filter_module(gpuprov_mig_check, gpuprov_mig_plan,
                                     gpuprov_mig_applied)
