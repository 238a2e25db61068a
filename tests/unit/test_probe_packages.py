"""Driver and CUDA packages from recorded dpkg-query / rpm output and versionlock files."""

from __future__ import annotations

from pathlib import Path

from gpuprov.node.probe import packages
from gpuprov.node.probe.fs import Root

FIXTURES = Path(__file__).parent.parent / "fixtures" / "probe"
RECORDED = FIXTURES / "packages"


def _names(items):
    return [p["name"] for p in items]


def test_dpkg_driver_packages_versions_and_holds():
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, (RECORDED / "dpkg-query.txt").read_text(), ""

    root = Root(str(FIXTURES / "roots" / "gpu-node"))
    doc = packages.collect(root, run)
    assert doc["manager"] == "dpkg" and doc["error"] is None
    # The fixture tree's dpkg database, not the machine's.
    assert calls[0][1] == f"--admindir={root.path('/var/lib/dpkg')}"
    assert _names(doc["driver"]) == [
        "firmware-nvidia-gsp",
        "libcuda1",
        "libnvidia-ml1",
        "libnvidia-ptxjitcompiler1",
        "nvidia-cuda-toolkit",
        "nvidia-kernel-dkms",
        "nvidia-persistenced",
        "nvidia-smi",
    ]
    by_name = {p["name"]: p for p in doc["driver"]}
    assert by_name["libnvidia-ml1"] == {
        "name": "libnvidia-ml1",
        "version": "535.161.08-1~deb12u1",
        "state": "installed",
        "held": True,
    }
    assert by_name["nvidia-persistenced"]["held"] is False
    assert _names(doc["cuda_toolkit"]) == ["nvidia-cuda-toolkit"]


def test_the_container_runtime_package_is_listed():
    """Its version decides whether the runtime can inject CDI devices (runtime_mode)."""
    lines = ("containerd\t2.1.9~ds1-1\tinstall ok installed\n"
             "containerd-shim-runc-v2\t1.0\tinstall ok installed\n"
             "cri-o-runc\t1.1\tinstall ok installed\n"
             "nvidia-container-toolkit\t1.20.0-1\thold ok installed\n")
    doc = packages.collect(Root(str(FIXTURES / "roots" / "gpu-node")), lambda argv: (0, lines, ""))
    assert doc["runtime"] == [{"name": "containerd", "version": "2.1.9~ds1-1",
                               "state": "installed", "held": False}]


def test_dpkg_query_failure_is_data():
    root = Root(str(FIXTURES / "roots" / "gpu-node"))
    doc = packages.collect(root, lambda argv: (2, "", "dpkg-query: error: database locked\n"))
    assert doc["error"] == "dpkg-query exited 2: dpkg-query: error: database locked"
    assert doc["driver"] == [] and doc["cuda_toolkit"] == []


def test_no_package_manager():
    doc = packages.collect(Root(str(FIXTURES / "roots" / "cpu-only")), lambda argv: 1 / 0)
    assert doc == {"manager": None, "error": None, "driver": [], "cuda_toolkit": [],
                   "runtime": []}


def test_rpm_packages_with_dnf_versionlock(tmp_path):
    (tmp_path / "var/lib/rpm").mkdir(parents=True)
    (tmp_path / "etc/dnf/plugins").mkdir(parents=True)
    (tmp_path / "etc/dnf/plugins/versionlock.list").write_text(
        (RECORDED / "versionlock.list").read_text()
    )
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, (RECORDED / "rpm-qa.txt").read_text(), ""

    doc = packages.collect(Root(str(tmp_path)), run)
    assert doc["manager"] == "rpm"
    assert calls[0][:4] == ["rpm", "--root", str(tmp_path), "-qa"]
    held = {p["name"]: p["held"] for p in doc["driver"]}
    # The "!" line excludes nvidia-driver-cuda; nvidia-driver's lock must not leak onto
    # nvidia-driver-libs.
    assert held == {
        "cuda-drivers": False,
        "cuda-nvcc-12-4": False,
        "cuda-toolkit-12-4": False,
        "kmod-nvidia-latest-dkms": True,
        "nvidia-container-toolkit": False,
        "nvidia-driver": True,
        "nvidia-driver-cuda": False,
        "nvidia-driver-libs": False,
    }
    assert {p["name"]: p["version"] for p in doc["driver"]}["nvidia-driver"] == "3:550.54.15-1.el9"
    assert {p["name"]: p["version"] for p in doc["driver"]}["cuda-drivers"] == "550.54.15-1"
    assert _names(doc["cuda_toolkit"]) == ["cuda-nvcc-12-4", "cuda-toolkit-12-4"]


def test_dnf5_versionlock_toml():
    locks = packages.parse_versionlock((RECORDED / "versionlock.toml").read_text())
    package = {"name": "nvidia-driver-cuda", "_evr": "3:550.54.15-1.el9", "arch": "x86_64"}
    other = {"name": "nvidia-driver-cuda-libs", "_evr": "3:550.54.15-1.el9", "arch": "x86_64"}
    assert packages.is_locked(package, locks) is True
    assert packages.is_locked(other, locks) is False


def test_toolkit_pattern():
    toolkit = [
        "cuda",
        "cuda-12-4",
        "cuda-toolkit",
        "cuda-toolkit-12-4",
        "nvidia-cuda-toolkit",
        "cuda-nvcc-12-4",
        "cuda-compiler-12-4",
        "cuda-libraries-dev-12-4",
    ]
    not_toolkit = [
        "cuda-drivers",
        "cuda-drivers-550",
        "cuda-compat-12-4",
        "cuda-keyring",
        "libcuda1",
        "nvidia-driver-cuda",
        "cuda-runtime-12-4",
    ]
    assert [n for n in toolkit if packages.CUDA_TOOLKIT_PACKAGE.match(n)] == toolkit
    assert [n for n in not_toolkit if packages.CUDA_TOOLKIT_PACKAGE.match(n)] == []
