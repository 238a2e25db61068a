"""Probe sections read from files: PCI sysfs, host, kernel module, kernel log (fixture trees)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.node.probe import host, pci
from gpuprov.node.probe.fs import Root
from gpuprov.nvidia import hardware

ROOTS = Path(__file__).parent.parent / "fixtures" / "probe" / "roots"
GPU_NODE = Root(str(ROOTS / "gpu-node"))
CPU_ONLY = Root(str(ROOTS / "cpu-only"))


def test_pci_lists_only_nvidia_display_controllers():
    devices = pci.collect(GPU_NODE)
    # Not the Intel host bridge, the HDMI audio function (0x0403) or the NVSwitch (0x0680).
    assert [d["address"] for d in devices] == ["0000:3b:00.0", "0000:86:00.0"]


def test_pci_device_facts():
    p100, h100 = pci.collect(GPU_NODE)
    assert p100 == {
        "address": "0000:3b:00.0",
        "device_id": "10de:15f8",
        "class": "0x030200",
        "subsystem_id": "10de:118f",
        "revision": "0xa1",
        "numa_node": 0,
        "link": {
            "current_speed": "2.5 GT/s PCIe",
            "current_gen": 1,
            "current_width": 16,
            "max_speed": "8.0 GT/s PCIe",
            "max_gen": 3,
            "max_width": 16,
        },
        "driver": "nvidia",
        "pci_ids_name": None,  # read only for a device the table lacks
        "classification": p100["classification"],
        "classification_error": None,
    }
    assert p100["classification"]["name"] == "Tesla P100-PCIE-16GB"
    assert p100["classification"]["architecture"] == "pascal"
    assert h100["classification"]["architecture"] == "hopper"
    assert h100["driver"] is None
    assert (h100["numa_node"], h100["link"]["current_width"], h100["link"]["max_gen"]) == (1, 8, 5)


def test_a_device_the_table_lacks_is_classified_from_the_nodes_pci_ids(tmp_path):
    """An H100 variant (10de:2336) gpuprov's table lacks: the probe reads its name from the
    node's real pci.ids (Debian's package, copied into the node's tree) and classifies it by
    its chip."""
    import shutil

    root = tmp_path / "node"
    shutil.copytree(ROOTS / "gpu-node", root, symlinks=True)
    (root / "sys/bus/pci/devices/0000:86:00.0/device").write_text("0x2336\n")
    system = next(Path(p) for p in hardware.PCI_IDS_PATHS if Path(p).exists())
    (root / "usr/share/misc").mkdir(parents=True)
    shutil.copy(system, root / "usr/share/misc/pci.ids")
    _, variant = pci.collect(Root(str(root)))
    assert variant["pci_ids_name"] == "GH100 [H100]"
    assert {k: variant["classification"][k] for k in ("architecture", "status", "source")} == \
        {"architecture": "hopper", "status": "supported", "source": "pci.ids"}
    # Without pci.ids on the node it stays unknown, as before.
    (root / "usr/share/misc/pci.ids").unlink()
    _, variant = pci.collect(Root(str(root)))
    assert variant["pci_ids_name"] is None and variant["classification"]["status"] == "unknown"


def test_cpu_only_node_has_no_gpu():
    # A virtio VGA controller is a display controller, but not NVIDIA's.
    assert pci.collect(CPU_ONLY) == []


def test_missing_sysfs_gives_no_devices(tmp_path):
    assert pci.collect(Root(str(tmp_path))) == []


@pytest.mark.parametrize(
    ("speed", "gen"),
    [
        ("2.5 GT/s PCIe", 1),
        ("5.0 GT/s PCIe", 2),
        ("8 GT/s", 3),
        ("16.0 GT/s PCIe", 4),
        ("32.0 GT/s PCIe", 5),
        ("64.0 GT/s PCIe", 6),
        ("Unknown", None),
        (None, None),
    ],
)
def test_link_generation(speed, gen):
    assert pci.link_generation(speed) == gen


def test_host_facts():
    facts = host.collect_host(GPU_NODE)
    assert facts["hostname"] == "gpu-node-01"
    assert facts["kernel"] == "5.15.0-105-generic"
    assert facts["boot_id"] == "0b6f2c1e-1111-4222-8333-944455556666"
    assert facts["os"] == {
        "id": "ubuntu",
        "id_like": "debian",
        "version_id": "22.04",
        "version_codename": "jammy",
        "pretty_name": "Ubuntu 22.04.4 LTS",
    }


def test_kernel_module_open_flavour_and_nouveau_blacklist():
    module = host.collect_kernel_module(GPU_NODE)
    assert module["loaded"] is True
    assert module["version"] == "535.161.08"
    assert module["flavor"] == "open"
    assert module["modules"] == {
        "nvidia": True,
        "nvidia_uvm": True,
        "nvidia_modeset": False,
        "nvidia_drm": False,
        "nouveau": False,
    }
    assert module["nouveau_blacklisted_in"] == ["/etc/modprobe.d/nvidia-blacklists-nouveau.conf"]


def test_kernel_module_version_from_proc_when_sysfs_lacks_it():
    module = host.collect_kernel_module(Root(str(ROOTS / "malformed")))
    assert (module["version"], module["flavor"], module["loaded"]) == (
        "470.256.02",
        "proprietary",
        False,
    )


def test_kernel_module_absent():
    module = host.collect_kernel_module(CPU_ONLY)
    assert (module["loaded"], module["version"], module["flavor"]) == (False, None, None)


def test_kernel_log_xid_events():
    log = host.collect_kernel_log(GPU_NODE)
    assert log["readable"] is True
    assert log["xid_count"] == 2
    assert log["xid_events"][0] == {
        "pci": "0000:86:00",
        "xid": 79,
        "usec_since_boot": 9123456,
        "message": "pid=1234, name=python3, GPU has fallen off the bus.",
        "gpu_instance": None,
        "compute_instance": None,
    }
    assert [(e["pci"], e["xid"]) for e in log["xid_events"]] == [
        ("0000:86:00", 79),
        ("0000:3b:00", 48),
    ]


def test_kernel_log_xid_events_of_mig_instances(tmp_path):
    """The MIG forms of an XID record, as NVIDIA's A100 memory error management guide and
    kernel_rc.c print them: the GPU instance (and compute instance) inside the parentheses."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/kmsg").write_text(
        "4,10,100,-;NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User "
        "Channel (0x9). RST: No, D-RST: No\n"
        "4,11,200,-;NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x1). "
        "RST: Yes, D-RST: No\n"
        "4,12,300,-;NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, "
        "Graphics Exception\n")
    log = host.collect_kernel_log(Root(str(tmp_path)))
    assert [(e["pci"], e["xid"], e["gpu_instance"], e["compute_instance"])
            for e in log["xid_events"]] == [("0000:01:00", 94, 5, None),
                                            ("0000:01:00", 95, None, None),
                                            ("0000:3b:00", 13, 1, 2)]
    assert log["xid_events"][0]["message"].startswith("pid=7194, Contained: CE User Channel")


def test_kernel_log_unreadable_is_data():
    log = host.collect_kernel_log(CPU_ONLY)
    assert log["readable"] is False and log["error"] and log["xid_events"] == []
