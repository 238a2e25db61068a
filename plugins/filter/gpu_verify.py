"""Filters of the gpu_verify role (gpuprov/stages/gpu_verify.py decides).

    ansible_play_hosts | gpuprov_verify_host_vars(hostvars)
        -> {host: {var: value}}: the settings `gpuprov verify` reads, as Ansible resolved them
           for each host (what the role hands verify with --host-vars)
"""

from __future__ import annotations

from typing import Any

from ansible_collections.gpuprov.cluster.plugins.plugin_utils import gpuprov_support as support


def gpuprov_verify_host_vars(hosts: Any, hostvars: Any) -> dict:
    names = support.items(hosts, "gpuprov_verify_host_vars", "host names (ansible_play_hosts)")
    return support.stage("gpu_verify").host_vars(names, hostvars)


FilterModule = support.filter_module(gpuprov_verify_host_vars)
