#!/usr/bin/python3
"""List the NVIDIA GPUs on a node's PCI bus from sysfs: no driver, no lspci needed.

Runs on the managed node with only python3's standard library (plus the module_utils
Ansible ships with every module). It only reads, so it runs unchanged in check mode.
What counts as a GPU is the rule of gpuprov/probe/pci.py (vendor 0x10de, display class
0x03xxxx); tests/unit/test_filter_plugin.py checks that both agree on every fixture tree.
The probe itself is not reused here because Ansible can only ship module_utils with a
module, and the probe's package is not one.
"""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuprov_pci_devices
short_description: List NVIDIA GPUs on PCI from sysfs
description:
  - Reads C(vendor), C(device), C(class), C(subsystem_vendor), C(subsystem_device),
    C(revision) and C(numa_node) of every entry under I(path), which the kernel exposes
    whether or not a driver is bound.
  - Keeps NVIDIA display controllers (class C(0x03xxxx)); NVSwitch bridges, audio and USB
    functions of NVIDIA boards are not GPUs and are left out.
  - Never changes anything.
options:
  path:
    description: The PCI devices directory.
    type: path
    default: /sys/bus/pci/devices
"""

RETURN = r"""
devices:
  description: NVIDIA GPUs, sorted by PCI address.
  returned: always
  type: list
  elements: dict
  sample:
    - address: "0000:04:00.0"
      pci_id: "10de:15f8"
      class: "0x030200"
      subsystem_id: "10de:118f"
      revision: "0xa1"
      numa_node: 0
"""

NVIDIA_VENDOR = 0x10DE
DISPLAY_CLASS = 0x03


def _read_hex(entry: str, name: str) -> int | None:
    try:
        with open(os.path.join(entry, name), encoding="ascii") as handle:
            return int(handle.read().strip(), 16)
    except (OSError, ValueError):
        return None


def _read_text(entry: str, name: str) -> str | None:
    try:
        with open(os.path.join(entry, name), encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _read_int(entry: str, name: str) -> int | None:
    try:
        return int(_read_text(entry, name) or "")
    except ValueError:
        return None


def read_gpus(path: str) -> list[dict]:
    gpus = []
    for address in sorted(os.listdir(path)):
        entry = os.path.join(path, address)
        pci_class = _read_hex(entry, "class")
        device = _read_hex(entry, "device")
        if (
            _read_hex(entry, "vendor") != NVIDIA_VENDOR
            or pci_class is None
            or pci_class >> 16 != DISPLAY_CLASS
            or device is None
        ):
            continue
        sub_vendor = _read_hex(entry, "subsystem_vendor")
        sub_device = _read_hex(entry, "subsystem_device")
        gpus.append(
            {
                "address": address,
                "pci_id": f"{NVIDIA_VENDOR:04x}:{device:04x}",
                "class": f"0x{pci_class:06x}",
                "subsystem_id": (
                    f"{sub_vendor:04x}:{sub_device:04x}"
                    if sub_vendor is not None and sub_device is not None
                    else None
                ),
                "revision": _read_text(entry, "revision"),
                "numa_node": _read_int(entry, "numa_node"),
            }
        )
    return gpus


def main() -> None:
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "default": "/sys/bus/pci/devices"}},
        supports_check_mode=True,
    )
    path = module.params["path"]
    if not os.path.isdir(path):
        module.fail_json(
            msg=f"{path} is not a directory: sysfs is not mounted there. Point "
            "gpu_preflight_pci_devices_path at the node's PCI devices directory."
        )
    module.exit_json(changed=False, devices=read_gpus(path))


if __name__ == "__main__":
    main()
