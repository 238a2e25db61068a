"""NVIDIA GPUs on the PCI bus, read from sysfs: no driver needed.

Only display controllers count as GPUs: PCI class 0x03xxxx (0x0300 VGA, 0x0302 3D
controller). The other functions NVIDIA boards expose are not GPUs and are left out:
the HDMI audio function (0x0403), the USB-C controller of Turing boards (0x0c03,
0x0c80) and NVSwitch bridges (0x0680).
"""

from __future__ import annotations

import os
import re

from ...nvidia import hardware
from .fs import Root

NVIDIA_VENDOR = 0x10DE
SYSFS_PCI_DEVICES = "/sys/bus/pci/devices"
DISPLAY_CLASS = 0x03

# Transfer rate per lane -> PCIe generation, as sysfs spells it ("8.0 GT/s PCIe"; old
# kernels write "8 GT/s").
_GEN_BY_RATE = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
_RATE = re.compile(r"^\s*([\d.]+)\s*GT/s")


def _hex(text: str | None) -> int | None:
    try:
        return int(text.strip(), 16) if text else None
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


def link_generation(speed: str | None) -> int | None:
    match = _RATE.match(speed or "")
    return _GEN_BY_RATE.get(float(match.group(1))) if match else None


def _classify(pci_id: str, subsystem_device: int | None,
              chip_name: str | None) -> tuple[dict | None, str | None]:
    try:
        # The subsystem ID tells boards sharing a chip apart (an A2 from an A16).
        return hardware.classify(pci_id, subsystem_device, chip_name).to_dict(), None
    except Exception as exc:  # the table is data: a bug there must not hide the GPU
        return None, f"{type(exc).__name__}: {exc}"


def chip_name(root: Root, device: int, pci_ids: dict) -> str | None:
    """The device's name in the node's pci.ids, read only for a device gpuprov's table lacks
    (hardware.classify infers its architecture from the chip in it). pci_ids holds the file's
    text for one collect(): an 8-GPU node reads its 1.3 MB file once, not once per GPU."""
    if hardware.lookup(device) is not None:
        return None
    if "text" not in pci_ids:
        readable = (root.read(path) for path in hardware.PCI_IDS_PATHS)
        pci_ids["text"] = next((text for text in readable if text is not None), None)
    return hardware.pci_ids_name(device, pci_ids["text"]) if pci_ids["text"] else None


def _device(root: Root, address: str, pci_ids: dict) -> dict | None:
    base = f"{SYSFS_PCI_DEVICES}/{address}"
    if _hex(root.read_line(f"{base}/vendor")) != NVIDIA_VENDOR:
        return None
    pci_class = _hex(root.read_line(f"{base}/class"))
    if pci_class is None or pci_class >> 16 != DISPLAY_CLASS:
        return None
    device = _hex(root.read_line(f"{base}/device"))
    pci_id = f"{NVIDIA_VENDOR:04x}:{device:04x}" if device is not None else None
    sub_vendor = _hex(root.read_line(f"{base}/subsystem_vendor"))
    sub_device = _hex(root.read_line(f"{base}/subsystem_device"))
    link = {}
    for which in ("current", "max"):
        speed = root.read_line(f"{base}/{which}_link_speed")
        link[f"{which}_speed"] = speed
        link[f"{which}_gen"] = link_generation(speed)
        link[f"{which}_width"] = _int(root.read_line(f"{base}/{which}_link_width"))
    driver_link = root.path(f"{base}/driver")
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    chip = chip_name(root, device, pci_ids) if device is not None else None
    classification, classification_error = (_classify(pci_id, sub_device, chip) if pci_id
                                            else (None, None))
    return {
        "address": address,
        "device_id": pci_id,
        "class": f"0x{pci_class:06x}",
        "subsystem_id": (
            f"{sub_vendor:04x}:{sub_device:04x}"
            if sub_vendor is not None and sub_device is not None
            else None
        ),
        "revision": root.read_line(f"{base}/revision"),
        "numa_node": _int(root.read_line(f"{base}/numa_node")),
        "link": link,
        "driver": driver,
        "pci_ids_name": chip,
        "classification": classification,
        "classification_error": classification_error,
    }


def collect(root: Root) -> list[dict]:
    """NVIDIA GPUs on PCI, sorted by address."""
    try:
        addresses = sorted(os.listdir(root.path(SYSFS_PCI_DEVICES)))
    except OSError:
        return []
    pci_ids: dict = {}  # the node's pci.ids text, read at the first device the table lacks
    devices = (_device(root, address, pci_ids) for address in addresses)
    return [device for device in devices if device is not None]
