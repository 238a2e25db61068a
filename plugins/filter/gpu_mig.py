"""Ansible filters that make the gpu_mig role's decisions (playbooks/mig.yml).

The role reads (the probe report, the Node, the pods) and writes (Node patches, evictions, the
node's MIG layout through gpuprov/node/mig_apply.py); what to do with what it read is decided in
gpuprov.stages.gpu_mig and gpuprov.nvidia.mig, in Python with unit tests, on the controller.

    probe | gpuprov_mig_plan(config, configs=None, node=None)
        -> gpuprov.stages.gpu_mig.plan(): {"managed", "capable", "change", "skip", "summary",
           "apply", "start_patch", "done_patch", "labels_patch", "failed_labels", ...}
    pods | gpuprov_mig_gpu_pods          -> [{"namespace", "name"}, ...] to evict
    stdout | gpuprov_mig_applied(rc)     -> the applier's report, or why it has none
    ansible_failed_task | gpuprov_mig_failure(ansible_failed_result, failed_labels)
        -> {"reason", "patch"}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _stage() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.stages import gpu_mig
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return gpu_mig


def mig_plan(probe: Any, config: Any, configs: Any = None, node: Any = None) -> dict:
    if not isinstance(probe, Mapping):
        raise AnsibleFilterError(f"gpuprov_mig_plan expects the node's probe report, got "
                                 f"{type(probe).__name__}")
    stage = _stage()
    try:
        return stage.plan(probe, None if config in (None, "") else str(config), configs,
                          node if isinstance(node, Mapping) else None)
    except stage.StageError as exc:
        raise AnsibleFilterError(str(exc)) from None


def gpu_pods(pods: Any) -> list[dict]:
    if not isinstance(pods, list):
        raise AnsibleFilterError(f"gpuprov_mig_gpu_pods expects a list of Pod objects, got "
                                 f"{type(pods).__name__}")
    return _stage().gpu_pods([p for p in pods if isinstance(p, Mapping)])


def applied(stdout: Any, rc: Any) -> dict:
    """The report gpuprov/node/mig_apply.py printed (its last JSON line), with `error` set where it
    printed none."""
    for line in reversed(str(stdout or "").splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except ValueError:
                break
            if isinstance(report, dict):
                if rc not in (0, "0") and not report.get("error"):
                    report["error"] = f"the MIG applier exited {rc}"
                return report
    return {"error": f"the MIG applier exited {rc} without a report", "gpus": []}


def failure(task: Any, result: Any, failed_labels: Any) -> dict:
    from gpuprov.stages import _task_failure

    reason = _task_failure.reason(task, result)
    labels = failed_labels if isinstance(failed_labels, Mapping) else {}
    return {"reason": reason, "annotation": _stage().FAILED,
            "patch": _stage().failure_patch(reason, labels)}


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_mig_plan": mig_plan,
            "gpuprov_mig_gpu_pods": gpu_pods,
            "gpuprov_mig_applied": applied,
            "gpuprov_mig_failure": failure,
        }
