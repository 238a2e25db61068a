"""The gpu_verify role's decision: which of each host's settings it hands `gpuprov verify`,
called through plugins/filter/gpu_verify.py.

    host_vars(hosts, hostvars)   {host: {var: value}} of the settings verify reads
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def host_vars(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{host: {var: value}} of the settings gpuprov verify reads (its SETTING_VARS), as Ansible
    resolved them for each host: what the role hands verify (--host-vars), so that a playbook's
    -e and the play's variables reach it, not only the inventory's. Unset and null ones are
    left out."""
    # Imported here: verify's inventory module brings the SSH client along.
    from gpuprov.verify.inventory import SETTING_VARS

    found = {}
    for host in hosts:
        values = hostvars[host]
        found[str(host)] = {key: values[key] for key in SETTING_VARS
                            if key in values and values[key] is not None}
    return found
