"""Ansible module: what the nvidia_driver and nvidia_container_toolkit roles read on a node.

A thin wrapper: the reading is gpuprov.node.probe.node_state, shipped to the node as this module's
module_utils (plugins/module_utils/gpuprov is a link to the gpuprov package; ansible.cfg
names plugins/module_utils), so the roles and gpuprov's probe read each fact with one reader.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpuprov_node_state
author: gpuprov maintainers
short_description: Read a node's packages, kernel modules, units and the roles' files
description:
  - Reads, never writes. It reads the package manager and its installed packages (and
    whether dpkg was interrupted), nouveau and the nvidia kernel module (loaded by
    C(initstate), the module's version), systemd units, the checksums and modes of named
    files, the text of named configs, and the first line a version command prints.
  - Facts come from gpuprov's probe collectors (gpuprov/node/probe/node_state.py), the same the
    C(gpuprov probe) and C(gpuprov verify) commands use.
  - Runs in check mode too, so that C(--check) reports what a real run would change.
options:
  packages:
    description: Read the package database (dpkg, or rpm with versionlock holds).
    type: bool
    default: false
  units:
    description: systemd units to report (C(is-enabled) and C(is-active) as one systemctl call).
    type: list
    elements: str
    default: []
  files:
    description: Files to report with sha1, mode, uid and gid (missing ones are left out).
    type: list
    elements: path
    default: []
  configs:
    description: Config files whose text to return (missing ones are left out, unreadable
      ones named in C(unreadable)).
    type: list
    elements: path
    default: []
  version_command:
    description: A version command's argv, e.g. C([containerd, --version]); its exit status and
      first line of output are returned.
    type: list
    elements: str
    default: []
  boot:
    description: Read the kernels in /boot, the one the node boots next and the nvidia module
      each has (gpuprov/node/probe/boot.py).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Read the node
  gpuprov_node_state:
    packages: true
    units: [nvidia-persistenced]
    files: [/etc/modprobe.d/gpuprov-blacklist-nouveau.conf]
  register: node
"""

RETURN = r"""
state:
  description: The node's state (see gpuprov/node/probe/node_state.py).
  returned: always
  type: dict
  contains:
    package_manager: {description: dpkg, rpm or null, type: str}
    packages: {description: "{name: {version, state, held}}", type: dict}
    packages_error: {description: why the package database could not be read, type: str}
    interrupted: {description: why dpkg must finish first, type: list, elements: str}
    nouveau_loaded: {description: nouveau is loaded, type: bool}
    module_version: {description: the loaded nvidia module's version, type: str}
    units: {description: "{unit: {enabled, active}}", type: dict}
    files: {description: "[{path, checksum, mode, uid, gid}]", type: list, elements: dict}
    contents: {description: "{path: text}", type: dict}
    unreadable: {description: configs that exist but could not be read, type: list,
                 elements: str}
    version: {description: "{rc, output} of version_command, or null", type: dict}
    boot: {description: "kernels, running_kernel, next_kernel, modules, ... or null", type: dict}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.cluster.plugins.module_utils.gpuprov.node.probe import node_state
from ansible_collections.gpuprov.cluster.plugins.module_utils.gpuprov.node.probe.fs import Root


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "bool", "default": False},
            "units": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "path", "default": []},
            "configs": {"type": "list", "elements": "path", "default": []},
            "version_command": {"type": "list", "elements": "str", "default": []},
            "boot": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params = module.params
    state = node_state.read(
        Root("/"), read_packages=params["packages"], units=tuple(params["units"]),
        files=tuple(params["files"]), configs=tuple(params["configs"]),
        version_command=tuple(params["version_command"]), read_boot=params["boot"])
    module.exit_json(changed=False, state=state)


if __name__ == "__main__":
    main()
