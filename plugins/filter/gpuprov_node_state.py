"""Ansible filters over a node's state as the gpuprov_node_state module reads it.

The nvidia_driver and nvidia_container_toolkit roles read each node once with the
gpuprov_node_state module (plugins/modules/gpuprov_node_state.py: gpuprov's probe collectors,
run on the node); these filters answer the roles' questions about that state.

    files | gpuprov_file_current(path, content, mode="0644")
        -> whether the node's file (in the state's "files") has this content (sha1), mode and
           root ownership already: a role then skips the template/copy task, which costs
           two module runs even when it changes nothing
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

INSTALL_HINT = (
    "gpuprov is not importable by the Python that runs ansible ({error}): "
    "install gpuprov in the Python that runs ansible: pip install -e ."
)


def _checks() -> Any:
    # Imported on first use: Ansible loads every filter plugin for every template.
    try:
        from gpuprov.stages import _node_read
    except ImportError as exc:
        raise AnsibleFilterError(INSTALL_HINT.format(error=exc)) from None
    return _node_read


def file_current(files: Any, path: Any, content: Any, mode: str = "0644") -> bool:
    if isinstance(files, (str, bytes, Mapping)) or not isinstance(files, Iterable):
        raise AnsibleFilterError(f"gpuprov_file_current expects a list of files, got {files!r}")
    return _checks().file_current(files, path, content, mode)


class FilterModule:
    def filters(self) -> dict:
        return {
            "gpuprov_file_current": file_current,
        }
