"""The lab's simulated NVIDIA container toolkit repository (gpuprov/lab/pkgrepo.py) and its
nvidia-ctk stand-in, on this machine (no containers): signed as apt will check it, cached, and
a CDI spec of the simulated GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from gpuprov.lab import pkgrepo, profiles, simhw

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("dpkg-deb", "dpkg-scanpackages", "gpg", "gpgv")),
    reason="needs dpkg-dev and gnupg (scripts/install-system-deps.sh)",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> pkgrepo.Repo:
    return pkgrepo.build_repo(tmp_path_factory.mktemp("pkgrepo"))


def test_repository_has_nvidias_layout_and_packages(repo):
    arch = repo.root / "stable" / "deb" / "amd64"
    names = sorted(p.name for p in arch.iterdir())
    assert names == ["InRelease", "Packages", "Packages.gz", "Release", "Release.gpg"] + sorted(
        f"{name}_{version}_amd64.deb" for version in ("1.17.7-1", "1.20.1-1")
        for name in ("libnvidia-container-tools", "libnvidia-container1",
                     "nvidia-container-toolkit-base", "nvidia-container-toolkit"))
    text = (arch / "Packages").read_text()
    stanzas = {(s.split("\n", 1)[0].split(": ")[1],
                next(line for line in s.splitlines() if line.startswith("Version: "))[9:]): s
               for s in text.split("\n\n") if s}
    for version in ("1.17.7-1", "1.20.1-1"):
        toolkit = stanzas[("nvidia-container-toolkit", version)]
        assert f"Depends: nvidia-container-toolkit-base (= {version})" in toolkit
    contents = subprocess.run(
        ["dpkg-deb", "--contents", str(arch / "nvidia-container-toolkit-base_1.20.1-1_amd64.deb")],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "-rwxr-xr-x root/root" in contents and "./usr/bin/nvidia-ctk" in contents
    assert "./usr/bin/nvidia-container-runtime" in contents


def test_release_is_signed_by_the_published_key_only(repo, tmp_path, assert_signed_by):
    assert_signed_by(repo.key_file, repo.root / "stable" / "deb" / "amd64", repo.fingerprint,
                     tmp_path)


def test_rebuilt_only_when_inputs_change(tmp_path, monkeypatch):
    first = pkgrepo.build_repo(tmp_path)
    stamp = first.root / ".inputs"
    mtime = stamp.stat().st_mtime_ns
    assert pkgrepo.build_repo(tmp_path) == first and stamp.stat().st_mtime_ns == mtime
    monkeypatch.setattr(pkgrepo, "TOOLKIT_VERSIONS", ("1.17.9-1",))
    again = pkgrepo.build_repo(tmp_path)
    assert again.fingerprint == first.fingerprint  # the key is kept: nodes keep trusting it
    debs = sorted(p.name for p in (again.root / "stable/deb/amd64").glob("*.deb"))
    assert debs and all("1.17.9-1" in name for name in debs)


def test_nvidia_ctk_writes_a_cdi_spec_of_the_simulated_gpus(tmp_path):
    profile = profiles.NODE_PROFILES["gpu-pascal"]
    library = simhw.build_nvml_library(tmp_path / "nvml")
    simhw.write_node_state(tmp_path / "node", "gpu-pascal", profile)
    env = {**os.environ, "LD_LIBRARY_PATH": str(library.parent),
           "GPUPROV_SIM_DIR": str(tmp_path / "node" / "sim")}
    ctk = [sys.executable, str(pkgrepo.TOOLKIT_DIR / "nvidia-ctk")]
    out = tmp_path / "cdi" / "nvidia.yaml"
    subprocess.run([*ctk, "cdi", "generate", f"--output={out}"], env=env, check=True,
                   capture_output=True)
    spec = yaml.safe_load(out.read_text())
    expected = profiles.expected_gpus("gpu-pascal", profile)
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == "nvidia.com/gpu"
    names = [d["name"] for d in spec["devices"]]
    assert names == [str(g.index) for g in expected] + [g.uuid for g in expected] + ["all"]
    assert spec["containerEdits"]["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    stdout = subprocess.run([*ctk, "cdi", "generate"], env=env, check=True,
                            capture_output=True, text=True).stdout
    assert stdout == out.read_text()
    # What the simulated GPUs stand on in a container: the lab's NVML under the real library's
    # name, its configuration, the lab's nvidia-smi (where the node has them).
    mounts = {m["containerPath"] for m in spec["containerEdits"].get("mounts") or []}
    assert mounts <= {"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", "/etc/gpuprov-sim",
                      "/usr/bin/nvidia-smi"}
    # nvidia-cdi-refresh.service's way (the output path from the environment), and the device
    # plugin's (its own vendor and class, UUID names, JSON).
    refreshed = tmp_path / "run" / "nvidia.yaml"
    subprocess.run([*ctk, "cdi", "generate"], check=True, capture_output=True,
                   env={**env, "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH": str(refreshed)})
    assert refreshed.read_text() == out.read_text()
    plugin = tmp_path / "run" / "k8s.device-plugin.nvidia.com-gpu.json"
    subprocess.run([*ctk, "cdi", "generate", "--vendor=k8s.device-plugin.nvidia.com",
                    "--class", "gpu", "--device-name-strategy=uuid", "--format=json",
                    f"--output={plugin}"], env=env, check=True, capture_output=True)
    doc = yaml.safe_load(plugin.read_text())
    assert doc["kind"] == "k8s.device-plugin.nvidia.com/gpu"
    assert [d["name"] for d in doc["devices"]] == [g.uuid for g in expected] + ["all"]
    # No NVML configuration: fails like nvidia-ctk on a node without a driver.
    failed = subprocess.run([*ctk, "cdi", "generate"], capture_output=True, text=True,
                            env={**env, "GPUPROV_SIM_DIR": str(tmp_path / "none")}, check=False)
    assert failed.returncode == 1 and "failed to initialize NVML" in failed.stderr
    version = subprocess.run([*ctk, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("NVIDIA Container Toolkit CLI version @VERSION@")
    unknown = subprocess.run([*ctk, "runtime", "configure"], capture_output=True, text=True,
                             check=False)
    assert unknown.returncode == 2 and "not simulated" in unknown.stderr


def test_a_key_directory_too_deep_for_gpg_agents_socket_still_signs(tmp_path,
                                                                   assert_signed_by):
    """gpg-agent's socket must fit in a Unix socket path (108 bytes): labs in pytest-xdist's
    temp directories are that deep, and gpg said "No agent running" there."""
    deep = tmp_path / ("d" * (120 - len(str(tmp_path)))) / "pkgrepo"
    assert len(str(deep / "gnupg" / "S.gpg-agent.browser")) > 108
    repo = pkgrepo.build_repo(deep)
    work = tmp_path / "verify"
    work.mkdir(mode=0o700)
    assert_signed_by(repo.key_file, repo.root / "stable" / "deb" / "amd64", repo.fingerprint,
                     work)
