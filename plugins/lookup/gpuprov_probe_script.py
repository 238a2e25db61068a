"""Ansible lookup that gives roles gpuprov's probe as one self-contained python3 script.

Roles run it on a node with ``python3 -I - [--root DIR]``, the script on stdin, as
``gpuprov probe`` over SSH does: one probe, shipped from the gpuprov installed on the
controller, instead of a second GPU reader kept in step with it.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpuprov.cluster.plugins.plugin_utils.gpuprov_support import INSTALL_HINT

DOCUMENTATION = r"""
name: gpuprov_probe_script
author: gpuprov maintainers
short_description: gpuprov's node probe as a self-contained python3 script
description:
  - Returns the script that C(gpuprov.payload.probe_script()) builds, as text. Fed to
    C(python3 -I - [--root DIR]) on a node, it prints the probe's JSON report (see
    C(gpuprov/node/probe/__init__.py) for the schema) and writes nothing there.
  - Needs gpuprov (and nvidia-ml-py) importable by the Python that runs Ansible.
  - Takes no terms for the probe. The term C(mig-apply) gives the MIG stage's applier
    instead (C(gpuprov/node/mig_apply.py), run as C(python3 -I - PLAN [--apply]) by the gpu_mig
    role), packed the same way.
options:
  _terms:
    description: Nothing (the probe), or C(mig-apply).
    required: false
"""

EXAMPLES = r"""
- name: Run the probe
  ansible.builtin.command:
    argv: [python3, -I, -]
    stdin: "{{ lookup('gpuprov_probe_script') }}"
  register: probe
  changed_when: false
"""

RETURN = r"""
_raw:
  description: The probe script, one ASCII string.
  type: list
  elements: str
"""



class LookupModule(LookupBase):
    def run(self, terms: list, variables: Any = None, **kwargs: Any) -> list[str]:
        if kwargs or len(terms) > 1 or (terms and terms[0] not in ("probe", "mig-apply")):
            raise AnsibleLookupError(
                "gpuprov_probe_script takes no options and at most one term, probe or mig-apply")
        entry = terms[0] if terms else "probe"
        # Imported on use, not at load time: a playbook that never probes must not fail on a
        # missing gpuprov. node_script() raises ImportError for a missing pynvml (which the
        # payload ships) too, so both are covered.
        try:
            from gpuprov.payload import node_script

            script = node_script(entry)
        except ImportError as exc:
            raise AnsibleLookupError(
                "gpuprov_probe_script: " + INSTALL_HINT.format(error=exc)) from None
        return [script.decode("ascii")]
