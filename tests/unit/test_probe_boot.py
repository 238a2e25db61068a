"""The probe's boot section (gpuprov/node/probe/boot.py) on node trees built here: kernels in
/boot, the nvidia module each has (DKMS build or packaged, plain or compressed, signed or
not), Secure Boot's EFI variable and the kernel's trusted keys."""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

from gpuprov.node.probe import boot
from gpuprov.node.probe.fs import Root

RUNNING, NEWER = "6.1.0-9-amd64", "6.1.0-10-amd64"
# /proc/keys as the kernel prints it (security/keys/proc.c: type cut to 9 characters); the
# descriptions are those of Debian's and DKMS's signing certificates.
PROC_KEYS = (
    "1a3ea7e8 I------     1 perm 1f030000     0     0 asymmetri Debian Secure Boot CA: "
    "6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1: X509.rsa 4c6c0d1f []\n"
    "2b4fc0a1 I------     1 perm 1f030000     0     0 keyring   .platform: 2\n"
    "3c1d22f0 I------     1 perm 1f010000     0     0 asymmetri DKMS module signing key: "
    "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678: X509.rsa 12345678 []\n"
)


def _module(version: str, signed: bool = False) -> bytes:
    """A module file's .modinfo strings (what the probe reads), and the marker sign-file
    appends after a signature."""
    data = f"\0license=NVIDIA\0version={version}\0srcversion=ABC\0name=nvidia\0".encode()
    return data + (b"\x30\x82signature" + boot.SIGNATURE_MARKER if signed else b"")


def _node(tmp_path: Path, modules: dict[str, tuple[str, bytes]]) -> Root:
    for release in (RUNNING, NEWER, "0-rescue-0123abcd"):
        (tmp_path / "boot").mkdir(exist_ok=True)
        (tmp_path / f"boot/vmlinuz-{release}").write_bytes(b"")
    for release, (rel_path, data) in modules.items():
        path = tmp_path / f"lib/modules/{release}" / rel_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (tmp_path / f"lib/modules/{NEWER}/kernel").mkdir(parents=True, exist_ok=True)
    return Root(str(tmp_path))


def _no_modinfo(argv):
    raise AssertionError(f"modinfo run for an unsigned, readable module: {argv}")


def test_next_kernel_is_the_newest_in_boot_and_its_missing_module_is_none(tmp_path):
    root = _node(tmp_path, {RUNNING: ("updates/dkms/nvidia.ko", _module("535.261.03"))})
    doc = boot.collect(root, RUNNING, _no_modinfo)
    assert doc["kernels"] == [RUNNING, NEWER]  # natural order; the rescue image left out
    assert (doc["running_kernel"], doc["next_kernel"]) == (RUNNING, NEWER)
    assert doc["modules"] == {
        RUNNING: {"path": f"/lib/modules/{RUNNING}/updates/dkms/nvidia.ko", "kind": "dkms",
                  "version": "535.261.03", "signer": None, "sig_key": None, "signed": False,
                  "error": None},
        NEWER: None,
    }
    assert (doc["secure_boot"], doc["trusted_keys"]) == (None, [])


def test_compressed_and_packaged_modules_and_dkms_first(tmp_path):
    root = _node(tmp_path, {
        RUNNING: ("updates/dkms/nvidia.ko.xz", lzma.compress(_module("580.105.08"))),
        NEWER: ("kernel/nvidia-580srv/nvidia.ko.gz", gzip.compress(_module("580.95.05"))),
    })
    doc = boot.collect(root, RUNNING, _no_modinfo)
    assert doc["modules"][RUNNING]["version"] == "580.105.08"
    assert (doc["modules"][NEWER]["kind"], doc["modules"][NEWER]["version"]) == \
        ("packaged", "580.95.05")
    # A DKMS build beside the packaged one: modprobe takes updates/ first, so does the probe.
    extra = tmp_path / f"lib/modules/{NEWER}/updates/dkms/nvidia.ko"
    extra.parent.mkdir(parents=True)
    extra.write_bytes(_module("580.105.08"))
    assert boot.module(root, NEWER, _no_modinfo)["kind"] == "dkms"


def test_debians_renamed_modules_are_the_nvidia_module(tmp_path):
    # Debian's nvidia-kernel-dkms builds nvidia-current.ko, the Tesla 470 flavour
    # nvidia-tesla-470.ko (modprobe maps nvidia to them); their -uvm siblings are not it.
    root = _node(tmp_path, {
        RUNNING: ("updates/dkms/nvidia-current-uvm.ko", _module("535.261.03")),
        NEWER: ("updates/dkms/nvidia-tesla-470.ko", _module("470.256.02")),
    })
    doc = boot.collect(root, RUNNING, _no_modinfo)
    assert doc["modules"][RUNNING] is None
    assert doc["modules"][NEWER]["path"].endswith("/updates/dkms/nvidia-tesla-470.ko")
    (tmp_path / f"lib/modules/{RUNNING}/updates/dkms/nvidia-current.ko").write_bytes(
        _module("535.261.03"))
    assert boot.module(root, RUNNING, _no_modinfo)["version"] == "535.261.03"


def test_signed_and_zstd_modules_ask_modinfo(tmp_path):
    root = _node(tmp_path, {
        RUNNING: ("updates/dkms/nvidia.ko", _module("580.105.08", signed=True)),
        NEWER: ("updates/dkms/nvidia.ko.zst", b"(\xb5/\xfd zstd frame"),
    })
    calls = []

    def modinfo(argv):
        calls.append(argv[1])
        # kmod's modinfo output for a signed module (its fields, abridged).
        return 0, ("filename:       " + argv[1] + "\nversion:        580.105.08\n"
                   "signer:         DKMS module signing key\n"
                   "sig_key:        12:34:56:78\nsig_hashalgo:   sha256\n"
                   "signature:      30:82:01:BC\n\t\t3F:21\n"), ""
    doc = boot.collect(root, RUNNING, modinfo)
    signed = doc["modules"][RUNNING]
    assert (signed["signed"], signed["signer"], signed["sig_key"]) == \
        (True, "DKMS module signing key", "12:34:56:78")
    assert doc["modules"][NEWER]["version"] == "580.105.08"  # from modinfo: zstd unread
    assert len(calls) == 2


def test_secure_boot_variable_and_trusted_keys(tmp_path):
    root = _node(tmp_path, {})
    var = tmp_path / boot.SECURE_BOOT_VAR.lstrip("/")
    var.parent.mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/keys").write_text(PROC_KEYS)
    var.write_bytes(b"\x06\x00\x00\x00\x01")  # attributes (NV, BS, RT), then 1: on
    doc = boot.collect(root, RUNNING, _no_modinfo)
    assert doc["secure_boot"] is True
    assert doc["trusted_keys"] == [
        "Debian Secure Boot CA: 6ccece7e4c6c0d1f6149f3dd27dfcc5cbb419ea1: X509.rsa 4c6c0d1f []",
        "DKMS module signing key: a1b2c3d4e5f60718293a4b5c6d7e8f9012345678: X509.rsa 12345678 "
        "[]"]
    var.write_bytes(b"\x06\x00\x00\x00\x00")
    assert boot.collect(root, RUNNING, _no_modinfo)["secure_boot"] is False


def test_a_container_has_no_kernel_image(tmp_path):
    doc = boot.collect(Root(str(tmp_path)), RUNNING, _no_modinfo)
    assert (doc["kernels"], doc["next_kernel"], doc["modules"]) == ([], None, {RUNNING: None})
