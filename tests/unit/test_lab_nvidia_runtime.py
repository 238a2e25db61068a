"""The lab's nvidia-container-runtime stand-in (gpuprov/lab/toolkit/nvidia-container-runtime)
as containerd's shim calls it: it edits the bundle's config.json on `create` by NVIDIA's
rules, with the node's GPUs from the simulated NVML and the toolkit's config.toml, then runs
runc with the same arguments (here a fake runc that records them)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from gpuprov.lab import pkgrepo, profiles, simhw

RUNTIME = pkgrepo.TOOLKIT_DIR / "nvidia-container-runtime"
FAKE_RUNC = """#!/bin/sh
printf '%s\\n' "$@" > "$RUNC_LOG"
"""
SECURE = ("accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
          "accept-nvidia-visible-devices-as-volume-mounts = true\n")
UNPRIVILEGED = ["CAP_CHOWN", "CAP_KILL"]


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    base = tmp_path_factory.mktemp("node")
    library = simhw.build_nvml_library(base / "nvml")
    simhw.write_node_state(base / "gpu-pascal", "gpu-pascal",
                           profiles.NODE_PROFILES["gpu-pascal"])
    uuids = [g.uuid for g in profiles.expected_gpus("gpu-pascal",
                                                   profiles.NODE_PROFILES["gpu-pascal"])]
    return library, base / "gpu-pascal", uuids


def run(node, tmp_path: Path, spec: dict, config: str | None, *args: str):
    """(exit code, stderr, runc's arguments or None, config.json afterwards)."""
    library, node_dir, _ = node
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(spec))
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "runc").write_text(FAKE_RUNC)
    (bindir / "runc").chmod(0o755)
    xdg = tmp_path / "xdg"
    if config is not None:
        (xdg / "nvidia-container-runtime").mkdir(parents=True, exist_ok=True)
        (xdg / "nvidia-container-runtime/config.toml").write_text(config)
    log = tmp_path / "runc.log"
    log.unlink(missing_ok=True)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "RUNC_LOG": str(log), "XDG_CONFIG_HOME": str(xdg),
           "LD_LIBRARY_PATH": str(library.parent), "GPUPROV_SIM_DIR": str(node_dir / "sim")}
    argv = [a.replace("BUNDLE", str(bundle)) for a in args]
    proc = subprocess.run([sys.executable, str(RUNTIME), *argv], env=env, capture_output=True,
                          text=True, timeout=30)
    runc_args = log.read_text().splitlines() if log.exists() else None
    return proc.returncode, proc.stderr, runc_args, json.loads((bundle / "config.json").read_text())


def spec(env=(), mounts=(), caps=UNPRIVILEGED) -> dict:
    return {"ociVersion": "1.1.0",
            "process": {"args": ["sh"], "env": ["PATH=/usr/bin:/bin", *env],
                        "capabilities": {"bounding": list(caps)}},
            "mounts": [{"destination": d, "type": "bind", "source": s, "options": ["ro"]}
                       for s, d in mounts]}


def given(config_json: dict) -> str | None:
    for item in config_json["process"]["env"]:
        if item.startswith("GPUPROV_SIM_CONTAINER_GPUS="):
            return item.split("=", 1)[1]
    return None


CREATE = ("--root", "/run/containerd/runc/k8s.io", "create", "--bundle", "BUNDLE",
          "--pid-file", "BUNDLE/init.pid", "ctr-1")


def test_volume_mount_request_gets_exactly_that_gpu_and_runc_the_same_arguments(node, tmp_path):
    uuid = node[2][2]
    request = spec(["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"],
                   [("/dev/null", f"/var/run/nvidia-container-devices/{uuid}")])
    rc, err, runc, after = run(node, tmp_path, request, SECURE, *CREATE)
    assert rc == 0, err
    assert runc == [a.replace("BUNDLE", str(tmp_path / "bundle")) for a in CREATE]
    assert given(after) == uuid
    mounted = {m["destination"]: m for m in after["mounts"]}
    assert mounted["/usr/bin/nvidia-smi"]["source"] == "/opt/gpuprov-sim/bin/nvidia-smi"
    assert "ro" in mounted["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]["options"]
    assert mounted["/etc/gpuprov-sim"]["source"] == "/etc/gpuprov-sim"


@pytest.mark.parametrize(("config", "caps", "seen"), [
    (SECURE, UNPRIVILEGED, 0),  # the secure settings: nothing for the variable alone
    ("", UNPRIVILEGED, 4),  # NVIDIA's defaults: every GPU, no request needed
    (None, UNPRIVILEGED, 4),  # no config.toml at all: the same defaults
    (SECURE, [*UNPRIVILEGED, "CAP_SYS_ADMIN"], 4),  # privileged (the device plugin)
])
def test_no_request_container_asking_by_environment(node, tmp_path, config, caps, seen):
    rc, err, runc, after = run(node, tmp_path, spec(["NVIDIA_VISIBLE_DEVICES=all"], caps=caps),
                               config, *CREATE)
    assert rc == 0 and runc, err
    assert given(after) == (",".join(node[2]) if seen else None)
    if not seen:
        assert after == spec(["NVIDIA_VISIBLE_DEVICES=all"], caps=caps)  # untouched


def test_mounts_on_a_toolkit_that_refuses_them_fail_the_create(node, tmp_path):
    request = spec(["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"],
                   [("/dev/null", f"/var/run/nvidia-container-devices/{node[2][0]}")])
    rc, err, runc, _ = run(node, tmp_path, request, "", *CREATE)
    assert rc == 1 and runc is None
    assert "/var/run/nvidia-container-devices: unknown device" in err


def test_other_subcommands_pass_through_untouched(node, tmp_path):
    request = spec(["NVIDIA_VISIBLE_DEVICES=all"])
    rc, _, runc, after = run(node, tmp_path, request, "", "--root", "/r", "start", "ctr-1")
    assert rc == 0 and runc == ["--root", "/r", "start", "ctr-1"]
    assert after == request


def test_create_detection_and_bundle_as_nvidia_parses_them():
    # The stand-in is a script without .py: loaded by path.
    loader = SourceFileLoader("nvidia_container_runtime_sim", str(RUNTIME))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    assert module.has_create_subcommand(["--bundle", "create", "start", "x"]) is False
    assert module.has_create_subcommand(["--log", "l", "create", "-b", "b", "x"]) is True
    assert module.bundle_dir(["create", "--bundle=/b1", "x"]) == "/b1"
    assert module.bundle_dir(["create", "-b", "/b2", "x"]) == "/b2"
    assert module.bundle_dir(["create", "x"]) == os.getcwd()
