"""Why an Ansible task failed, in one line: what the rescue of a role that cordons a node (the
driver upgrade, the MIG stage) puts in the Node's annotation and prints (`kubectl describe
node` shows it). Shared by their stages (gpuprov/stages/gpu_node_upgrade.py, gpu_mig.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The annotation holds one line: what failed and why, enough to act on.
REASON_MAX = 400


def one_line(text: Any) -> str:
    if isinstance(text, (list, tuple)):
        text = " ".join(str(t) for t in text)
    return " ".join(str(text).split())


def result_message(result: Mapping) -> str:
    """The failed result's message: a loop's first failed item's, else the module's, else
    the last line of what the command wrote on stderr."""
    for item in result.get("results") or []:
        if isinstance(item, Mapping) and item.get("failed"):
            label = item.get("item")
            message = result_message(item)
            return f"{label}: {message}" if label is not None else message
    message = one_line(result.get("msg") or "")
    stderr = [line for line in str(result.get("stderr") or "").splitlines() if line.strip()]
    if stderr and (not message or message == "non-zero return code"):
        message = f"{message}: {one_line(stderr[-1])}" if message else one_line(stderr[-1])
    return message or "failed"


def reason(task: Any, result: Any) -> str:
    """The failed task's name and its message, one line of at most REASON_MAX characters."""
    task = task if isinstance(task, Mapping) else {}
    result = result if isinstance(result, Mapping) else {}
    name = one_line(task.get("name") or task.get("action") or "unnamed task")
    text = f"{name}: {result_message(result)}"
    if len(text) > REASON_MAX:
        text = text[:REASON_MAX - 3].rstrip() + "..."
    return text
