"""gpuprov/runtime_mode.py: which nodes get native CDI, and when the toolkit's spec is
current. Runtime versions as the real binaries and Debian's packages print them."""

from __future__ import annotations

import pytest

from gpuprov import runtime_mode as rm
from gpuprov.node.probe import runtime as probe_runtime

# `containerd --version` of Debian 12's, Debian 13's and unstable's binaries (fetched into the
# machine's cache by scripts/fetch-containerd.sh).
BOOKWORM = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3"
TRIXIE = "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1"
UNSTABLE = "containerd github.com/containerd/containerd/v2 2.1.9+unknown "


@pytest.mark.parametrize("setting, runtime, version, mode", [
    ("auto", "containerd", BOOKWORM, "legacy"),
    ("auto", "containerd", TRIXIE, "cdi"),
    ("auto", "containerd", UNSTABLE, "cdi"),
    ("auto", "containerd", "1.6.20~ds1-1+deb12u3", "legacy"),  # a package version
    ("auto", "containerd", "2.1.9~ds1-1", "cdi"),
    ("legacy", "containerd", UNSTABLE, "legacy"),
    ("cdi", "containerd", TRIXIE, "cdi"),
    ("auto", "crio", "crio version 1.31.3", "cdi"),
    # Docker: CDI from 25.0 (features.cdi), NVIDIA's hook before.
    ("auto", "docker", "Docker version 28.3.2, build 578ccf6", "cdi"),
    ("auto", "docker", "Docker version 26.1.5+dfsg1, build a72d7cd", "cdi"),
    ("auto", "docker", "Docker version 20.10.24+dfsg1, build 297e128", "legacy"),
    ("auto", "containerd", None, "legacy"),
    (None, "containerd", UNSTABLE, "cdi"),
])
def test_the_mode_follows_the_runtime(setting, runtime, version, mode):
    choice = rm.choose(setting, runtime, version)
    assert (choice.mode, choice.problem) == (mode, None)
    assert choice.reason


@pytest.mark.parametrize("setting, runtime, version, words", [
    ("cdi", "containerd", BOOKWORM, "containerd 1.6 cannot inject CDI devices"),
    ("cdi", "docker", "Docker version 20.10.24+dfsg1", "it needs Docker >= 25"),
    ("cdi", "containerd", None, "version is unknown"),
    ("native", "containerd", UNSTABLE, "must be one of auto, cdi, legacy"),
])
def test_an_impossible_mode_is_refused_with_what_to_do(setting, runtime, version, words):
    choice = rm.choose(setting, runtime, version)
    assert choice.mode is None and words in choice.problem and "\n" not in choice.problem


def test_cdi_is_on_by_default_from_containerd_2():
    assert rm.containerd_cdi_default(rm.runtime_version(UNSTABLE)) is True
    assert rm.containerd_cdi_default(rm.runtime_version(TRIXIE)) is False
    assert rm.containerd_cdi_default(None) is False


def test_the_runtime_version_comes_from_its_package():
    packages = {"runtime": [{"name": "docker.io", "version": "26.1.5", "state": "installed"},
                            {"name": "containerd", "version": "1.7.24~ds1-6+deb13u1",
                             "state": "installed"}]}
    assert rm.packaged_version("containerd", packages) == "1.7.24~ds1-6+deb13u1"
    assert rm.packaged_version("docker", packages) == "26.1.5"
    assert rm.packaged_version("crio", packages) is None


# The block YAML nvidia-ctk writes: top-level list items at column 0 (as the probe fixture
# tests/fixtures/probe/roots/gpu-node/etc/cdi/nvidia.yaml), driver libraries by version.
SPEC = """---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: GPU-aaaa
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.105.08
    containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.105.08
"""
GPUS = [{"index": 0, "uuid": "GPU-aaaa"}]


def _record(text: str = SPEC) -> dict:
    return probe_runtime.cdi_record(rm.CDI_SPEC, text)


def test_a_current_spec_has_no_problem():
    record = _record()
    assert record["devices"] == ["0", "GPU-aaaa", "all"]
    assert record["driver_versions"] == ["580.105.08"]
    assert rm.spec_problem(record, GPUS, "580.105.08") is None


@pytest.mark.parametrize("record, gpus, driver, words", [
    (None, GPUS, "580.105.08", "no CDI spec at /var/run/cdi/nvidia.yaml"),
    (_record(SPEC.replace("kind: nvidia.com/gpu", "kind: example.com/gpu")), GPUS, "580.105.08",
     "not nvidia.com/gpu"),
    (_record(), [*GPUS, {"index": 1, "uuid": "GPU-bbbb"}], "580.105.08",
     "does not name GPU(s) 1, GPU-bbbb"),
    (_record(), GPUS, "590.44.01", "generated for driver 580.105.08, the node runs 590.44.01"),
    (_record("{not json"), GPUS, "580.105.08", "invalid"),
])
def test_a_stale_or_missing_spec_says_why(record, gpus, driver, words):
    if record is not None and record["path"].endswith(".yaml") and "invalid" in words:
        record = probe_runtime.cdi_record("/var/run/cdi/nvidia.json", "{not json")
    assert words in rm.spec_problem(record, gpus, driver)
