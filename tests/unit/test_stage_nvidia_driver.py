"""The nvidia_driver role's decisions (gpuprov/stages/nvidia_driver.py), as the role calls them
through plugins/filter/nvidia_driver.py, with the role's own per-OS data
(roles/nvidia_driver/vars)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from gpuprov.nvidia import driver_advisories
from gpuprov.stages import nvidia_driver

VARS = Path(__file__).resolve().parents[2] / "roles" / "nvidia_driver" / "vars"
MAIN = yaml.safe_load((VARS / "main.yml").read_text())


def _os_data(name: str) -> dict:
    """vars/<OS>.yml with main.yml's data put in where it names it (as Ansible templates it)."""
    data = yaml.safe_load((VARS / f"{name}.yml").read_text())
    for key, value in data.items():
        if isinstance(value, str) and value.startswith("{{ __nvidia_driver_"):
            data[key] = MAIN[value.strip("{} ")]
    return data


def _settings(os_file: str = "Debian_12", **overrides) -> dict:
    data = _os_data(os_file)
    os_name, os_version = os_file.split("_")
    settings = {
        "host": "gpu-a", "os_name": os_name, "os_version": os_version, "branch": "535",
        "package_manager": data["__nvidia_driver_package_manager"],
        "packages": data["__nvidia_driver_packages"],
        "extra_packages": data["__nvidia_driver_extra_packages"],
        "prebuilt": data.get("__nvidia_driver_prebuilt_modules"),
        "apt_sources_template": data.get("__nvidia_driver_apt_sources_template"),
        "dnf_modules": data.get("__nvidia_driver_dnf_modules", True),
    }
    return {**settings, **overrides}


@pytest.fixture(scope="module")
def driver(ansible_plugin):
    return ansible_plugin("filter/nvidia_driver.py")


def test_debian_535_proprietary_by_default_pinned_with_apt_syntax(driver):
    # Debian 12's archive has no R535 with NVIDIA's later fixes: the pin is accepted.
    plan = driver.gpuprov_driver_plan(_settings(version="535.261.03-1", allow_vulnerable=True))
    assert plan["flavour"] == "proprietary" and plan["problem"] is None
    assert plan["driver_packages"][0] == "nvidia-kernel-dkms"
    assert plan["install_names"] == [f"{n}=535.261.03-1" for n in plan["driver_packages"]] + [
        "nvidia-persistenced"]
    assert plan["held_packages"] == plan["driver_packages"] + ["nvidia-persistenced"]
    assert plan["written_files"] == ["/etc/apt/sources.list.d/gpuprov-nvidia-debian.sources",
                                     "/etc/modprobe.d/blacklist-nouveau.conf"]


def test_auto_takes_open_modules_where_the_gpus_need_them(driver):
    plan = driver.gpuprov_driver_plan(_settings(open_required=True, open_supported=True))
    assert plan["flavour"] == "open" and plan["driver_packages"][0] == "nvidia-open-kernel-dkms"


@pytest.mark.parametrize("overrides, expected", [
    ({"package_manager": None, "packages": {}}, "Debian 12 has no data in the nvidia_driver role"),
    ({"branch": "550"}, "driver branch 550 has no packages in roles/nvidia_driver/vars for "
                        "Debian 12 (it has: 470, 535)"),
    ({"branch": "470", "kernel_modules": "open", "open_supported": False},
     "nvidia_driver_kernel_modules=open cannot be used with driver branch 470"),
    ({"kernel_modules": "proprietary", "open_required": True, "open_supported": True},
     "nvidia_driver_kernel_modules=proprietary cannot be used with driver branch 535"),
    ({"version": "470.256.02-1"}, "nvidia_driver_version 470.256.02-1 is not a version of "
                                  "driver branch 535"),
])
def test_the_first_setting_problem_says_what_is_wrong(driver, overrides, expected):
    assert expected in driver.gpuprov_driver_plan(_settings(**overrides))["problem"]


def test_ubuntu_prebuilt_modules_replace_dkms_and_follow_the_kernel(driver):
    plan = driver.gpuprov_driver_plan(_settings("Ubuntu_24", branch="580",
                                                version="580.95.05-0ubuntu1",
                                        open_required=True, open_supported=True,
                                        prebuilt_modules=True, kernel_flavour="generic"))
    assert not any(n.startswith("nvidia-dkms-") for n in plan["driver_packages"])
    assert plan["extra_packages"] == ["linux-modules-nvidia-580-server-open-generic"]
    # The prebuilt package's version follows the kernel's: never pinned to the driver's.
    assert "linux-modules-nvidia-580-server-open-generic" in plan["install_names"]
    assert "nvidia-utils-580-server=580.95.05-0ubuntu1" in plan["install_names"]
    dkms = driver.gpuprov_driver_plan(_settings("Ubuntu_24", branch="580"))
    assert dkms["driver_packages"][0] == "nvidia-dkms-580-server" and dkms["extra_packages"] == []


def test_prebuilt_modules_mean_nothing_where_the_os_has_none(driver):
    plain = driver.gpuprov_driver_plan(_settings())
    assert driver.gpuprov_driver_plan(_settings(prebuilt_modules=True)) == plain


def test_rhel_uses_the_module_stream_and_dnf_version_syntax(driver):
    plan = driver.gpuprov_driver_plan(_settings("RedHat_9", branch="580", version="580.95.05",
                                        open_required=True, open_supported=True))
    assert plan["dnf_module_stream"] == "nvidia-driver:580-open"
    assert plan["install_names"][0] == "kmod-nvidia-open-dkms-580.95.05"
    assert plan["written_files"] == ["/etc/modprobe.d/blacklist-nouveau.conf"]


def _state(**packages) -> dict:
    return {"packages": {name: {"version": v, "state": "installed", "held": h}
                         for name, (v, h) in packages.items()},
            "interrupted": [], "files": []}


def test_a_converged_node_leaves_no_work(driver):
    plan = driver.gpuprov_driver_plan(_settings())
    state = _state(**{n: ("535.261.03-1", True) for n in plan["held_packages"]},
                   **{"linux-headers-6.1.0-41-amd64": ("6.1.158-1", False)})
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a",
                                      headers=["linux-headers-6.1.0-41-amd64"],
                                      package_manager="apt", apt_sources=None)
    security = work.pop("security_warning")
    assert work == {"installed_version": "535.261.03", "apt_sources_current": True,
                    "repo_pending": False, "apt_work": [], "install_names": plan["install_names"],
                    "removed_packages": [], "stale_files": [],
                    "unselected": [], "apt_converged": True,
                    "installed_problem": None, "reboot_required": False, "next_kernel": None}
    # Debian 12's own 535.261.03 lacks the fixes of bulletins 5703, 5747 and 5821: said on
    # every run (changing nothing).
    assert security.startswith("driver 535.261.03 is below R535's fixed version 535.309.01 "
                               "(bulletin 5703 (2025-10-09, high 7.0: CVE-2025-23280")
    assert "the driver source offers no fixed version" in security


def test_the_newest_fixed_driver_needs_no_security_warning(driver):
    plan = driver.gpuprov_driver_plan(_cuda_settings())
    state = _state(**{n: ("580.178.04-1", False) for n in plan["driver_packages"]})
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", package_manager="apt")
    assert work["installed_version"] == "580.178.04" and work["security_warning"] is None


@pytest.mark.parametrize("version", ["580.105.08-1", "580.105.08", "580.159.03-1"])
def test_a_pin_below_the_security_floor_is_refused_before_any_change(driver, version):
    plan = driver.gpuprov_driver_plan(_cuda_settings(version=version))
    assert plan["problem"].startswith(f"gpu-a: nvidia_driver_version {version} is below "
                                      "R580's fixed version 580.178.04 (bulletin ")
    # The bulletins and CVEs as the advisories table names them (its own test checks it).
    assert driver_advisories.assess(version).below_text() in plan["problem"]
    assert "CVE-2026-47489" in plan["problem"]  # 5861's first, by id
    assert plan["problem"].endswith("Set nvidia_driver_version to 580.178.04 or newer (or unset "
                                    "it: the branch's newest), or set "
                                    "nvidia_driver_allow_vulnerable: true to accept the risk.")
    assert plan["warning"] is None


def test_a_pin_below_the_floor_accepted_warns_on_every_run(driver):
    plan = driver.gpuprov_driver_plan(_cuda_settings(version="580.105.08-1",
                                                     allow_vulnerable="true"))
    assert plan["problem"] is None
    assert plan["warning"].startswith("gpu-a: nvidia_driver_version 580.105.08-1 is below")
    assert plan["warning"].endswith("Accepted: nvidia_driver_allow_vulnerable.")


@pytest.mark.parametrize("version", [None, "580.178.04-1", "580.178.*", "595.91.07"])
def test_no_pin_a_fixed_pin_or_a_glob_is_not_refused(driver, version):
    branch = (version or "580").split(".")[0]
    plan = driver.gpuprov_driver_plan(_cuda_settings(version=version, branch=branch))
    assert (plan["problem"], plan["warning"]) == (None, None)


def test_check_mode_with_the_repository_not_added_yet_leaves_the_packages_pending(driver):
    """In check mode the sources file is not written, so apt cannot resolve its packages: the
    role's package, hold and next-kernel steps report instead of running (repo_pending)."""
    plan = driver.gpuprov_driver_plan(_settings())
    state = _state()
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", package_manager="apt",
                                      check_mode=True, apt_sources="Types: deb\n")
    assert not work["apt_sources_current"] and work["repo_pending"]
    assert not driver.gpuprov_driver_work(state, plan, host="gpu-a", package_manager="apt",
                                          apt_sources="Types: deb\n")["repo_pending"]
    # Nothing to add (no sources file of the role's on this OS): nothing pending.
    assert not driver.gpuprov_driver_work(state, plan, host="gpu-a", package_manager="apt",
                                          check_mode=True, apt_sources=None)["repo_pending"]


def test_work_left_missing_headers_holds_interrupted_dpkg_and_other_version(driver):
    plan = driver.gpuprov_driver_plan(_settings(version="535.261.03-1"))
    state = _state(**{n: ("1:535.247.01-1", False) for n in plan["held_packages"]})
    state["interrupted"] = ["dpkg --audit lists packages"]
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a",
                              headers=["linux-headers-6.1.0-41-amd64"], package_manager="apt")
    assert work["installed_version"] == "535.247.01"
    assert work["apt_work"] == (["dpkg --audit lists packages"] + plan["driver_packages"]
                                + ["linux-headers-6.1.0-41-amd64"])
    assert work["unselected"] == plan["held_packages"] and not work["apt_converged"]
    assert driver.gpuprov_driver_work(state, plan, host="gpu-a", hold=False)["unselected"] == []


def test_the_sources_file_counts_only_as_the_role_writes_it(driver):
    plan = driver.gpuprov_driver_plan(_settings())
    state = _state(**{n: ("535.261.03-1", True) for n in plan["held_packages"]})
    text = "Types: deb\n"
    state["files"] = [{"path": plan["written_files"][0], "mode": "0644", "uid": 0, "gid": 0,
                       "checksum": "4e0f7e2e3a0c4b7e3f1d2c8d8e3d9c1b2a3f4e5d"}]
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", apt_sources=text,
                                      package_manager="apt")
    assert not work["apt_sources_current"] and not work["apt_converged"]
    state["files"][0]["checksum"] = hashlib.sha1(text.encode()).hexdigest()  # as sha1sum reads
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", apt_sources=text,
                                      package_manager="apt")
    assert work["apt_sources_current"] and work["apt_converged"]


def test_installed_problems_forbidden_packages_first_then_the_branch(driver):
    plan = driver.gpuprov_driver_plan(_settings())
    state = _state(**{"nvidia-kernel-dkms": ("470.256.02-1", True),
                      "xserver-xorg-core": ("2:21.1.7-3", False)})
    forbidden = ("^cuda-toolkit", "^xserver-xorg-core$")
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", forbidden=forbidden)
    assert work["installed_problem"].startswith("gpu-a has xserver-xorg-core installed")
    del state["packages"]["xserver-xorg-core"]
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", forbidden=forbidden)
    assert work["installed_problem"].startswith(
        "gpu-a: nvidia-kernel-dkms is 470.256.02, not a version of branch 535")
    # --check installs nothing, so the branch is not asserted then.
    assert driver.gpuprov_driver_work(state, plan, host="gpu-a", check_mode=True)[
        "installed_problem"] is None


def test_bad_input_is_one_clear_error(driver):
    with pytest.raises(AnsibleFilterError, match="unknown settings colour"):
        driver.gpuprov_driver_plan(_settings(colour="green"))
    with pytest.raises(AnsibleFilterError, match="expects the role's settings"):
        driver.gpuprov_driver_plan("535")
    with pytest.raises(AnsibleFilterError, match="expects the node's read and the plan"):
        driver.gpuprov_driver_work(None, {})


@pytest.mark.parametrize("state, installed, expected", [
    ({"nouveau_loaded": True, "module_version": None}, None, True),
    ({"nouveau_loaded": False, "module_version": "535.247.01"}, "535.261.03", True),
    ({"nouveau_loaded": False, "module_version": "535.261.03"}, "535.261.03", False),
    # No module loaded yet: the role loads it, no reboot.
    ({"nouveau_loaded": False, "module_version": None}, "535.261.03", False),
    # Nothing installed (check mode on a bare node): a loaded module is no reason.
    ({"nouveau_loaded": False, "module_version": "535.261.03"}, None, False),
])
def test_a_reboot_is_required_for_nouveau_or_a_module_of_another_version(state, installed,
                                                                          expected):
    assert nvidia_driver.reboot_required(state, installed) is expected


# nvidia_driver_source: nvidia on Debian: NVIDIA's CUDA repository, names and layout as its
# installation guide gives them (gpuprov.nvidia.driver_branches [cuda-debian]).
def _cuda_settings(os_file: str = "Debian_13", **overrides) -> dict:
    data = _os_data(os_file)
    return _settings(os_file, **{
        "branch": "580", "source": "nvidia",
        "cuda_distro": data.get("__nvidia_driver_cuda_distro"),
        "cuda_repo_key": data.get("__nvidia_driver_cuda_repo_key"),
        "cuda_packages": data.get("__nvidia_driver_cuda_packages",
                                  MAIN["__nvidia_driver_cuda_packages"]),
        "cuda_pin_package": MAIN["__nvidia_driver_cuda_pin_package"],
        "cuda_sources_template": MAIN["__nvidia_driver_cuda_sources_template"],
        "arch": "x86_64", **overrides})


def test_nvidias_repository_on_debian_13_locks_the_branch_instead_of_holding(driver):
    plan = driver.gpuprov_driver_plan(_cuda_settings())
    assert plan["problem"] is None and plan["source"] == "nvidia"
    assert plan["cuda_repo_url"] == \
        "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64"
    assert plan["cuda_repo_key_url"] == plan["cuda_repo_url"] + "/8793F200.pub"
    assert plan["pin_package"] == "nvidia-driver-pinning-580"
    assert plan["install_names"] == ["nvidia-driver-cuda=580.*", "nvidia-kernel-dkms=580.*",
                                     "nvidia-persistenced=580.*"]
    assert plan["hold"] is False and plan["allow_downgrade"] is True
    assert plan["written_files"][0] == "/etc/apt/sources.list.d/gpuprov-nvidia-cuda.sources"


def test_nvidias_repository_with_a_version_and_open_modules_on_arm(driver):
    plan = driver.gpuprov_driver_plan(_cuda_settings(
        "Debian_12", version="580.178.04-1", kernel_modules="open", open_supported=True,
        arch="aarch64", cuda_repo_url="http://mirror.example/cuda/{distro}/{arch}",
        cuda_repo_key_url="http://mirror.example/keys/{distro}-{key}"))
    assert plan["problem"] is None
    assert plan["cuda_repo_url"] == "http://mirror.example/cuda/debian12/sbsa"
    assert plan["cuda_repo_key_url"] == "http://mirror.example/keys/debian12-3bf863cc.pub"
    assert plan["pin_package"] == "nvidia-driver-pinning-580.178.04"
    assert plan["install_names"][1] == "nvidia-kernel-open-dkms=580.178.04-1"


def test_the_lock_package_and_the_branch_are_work_holds_are_released(driver):
    plan = driver.gpuprov_driver_plan(_cuda_settings())
    installed = {n: ("580.105.08-1", False) for n in plan["driver_packages"]}
    converged = _state(**installed, **{"nvidia-driver-pinning-580": ("580-5", False)})
    work = driver.gpuprov_driver_work(converged, plan, host="gpu-a", package_manager="apt")
    assert (work["apt_work"], work["unselected"], work["installed_version"]) == \
        ([], [], "580.105.08")
    # A node switched from Debian's archive: its driver held at 535 (packages of Debian's that
    # NVIDIA's depend on, and one NVIDIA's set does not name), no lock package yet.
    debian = ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "libnvidia-cfg1"]
    switched = _state(**{n: ("535.261.03-1", True) for n in debian})
    work = driver.gpuprov_driver_work(switched, plan, host="gpu-a", package_manager="apt")
    assert work["apt_work"] == ["nvidia-driver-pinning-580", "nvidia-driver-cuda",
                                "nvidia-kernel-dkms", "nvidia-persistenced"]
    assert sorted(work["unselected"]) == sorted(debian)  # their holds are released first


def test_nvidia_source_on_an_os_without_nvidias_apt_repository_is_refused(driver):
    plan = driver.gpuprov_driver_plan(_cuda_settings("Ubuntu_24", cuda_distro=None))
    assert "no apt repository of NVIDIA's for Ubuntu 24" in plan["problem"]


# Ubuntu from NVIDIA's repository ([cuda-ubuntu]): 580's names carry the branch, 590's do not;
# both kept by the version-lock package.
@pytest.mark.parametrize(("os_file", "branch", "flavour", "names", "url", "key"), [
    ("Ubuntu_24", "580", "open",
     ["nvidia-dkms-580-open", "nvidia-headless-no-dkms-580-open", "nvidia-utils-580",
      "libnvidia-compute-580"], "ubuntu2404", "3bf863cc.pub"),
    ("Ubuntu_22", "595", "proprietary",
     ["nvidia-dkms", "nvidia-headless-no-dkms", "nvidia-utils", "libnvidia-compute"],
     "ubuntu2204", "3bf863cc.pub"),
    ("Ubuntu_26", "620", "open",
     ["nvidia-dkms-open", "nvidia-headless-no-dkms-open", "nvidia-utils", "libnvidia-compute"],
     "ubuntu2604", "60DF8A40.pub"),
])
def test_ubuntu_from_nvidias_repository(driver, os_file, branch, flavour, names, url, key):
    modules = "open" if flavour == "open" else "auto"
    plan = driver.gpuprov_driver_plan(_cuda_settings(os_file, branch=branch, kernel_modules=modules,
                                             open_supported=True))
    assert plan["problem"] is None and plan["flavour"] == flavour
    assert plan["driver_packages"] == names
    assert plan["install_names"] == [f"{n}={branch}.*" for n in names]
    assert plan["pin_package"] == f"nvidia-driver-pinning-{branch}"
    assert plan["cuda_repo_key_url"] == \
        f"https://developer.download.nvidia.com/compute/cuda/repos/{url}/x86_64/{key}"
    # The Ubuntu archive's -server packages are known too: their holds are released on a switch.
    assert f"nvidia-utils-{branch}-server" in plan["held_packages"]


def test_rhel_10_has_no_module_stream_and_asks_dnf_for_the_branch(driver):
    plan = driver.gpuprov_driver_plan(_settings("RedHat_10", branch="580", open_required=True,
                                        open_supported=True))
    assert plan["problem"] is None and plan["dnf_module_stream"] is None
    assert plan["install_names"] == ["kmod-nvidia-open-dkms-580.*", "nvidia-driver-cuda-580.*",
                                     "nvidia-driver-cuda-libs-580.*", "nvidia-persistenced-580.*"]
    assert plan["held_packages"] == ["kmod-nvidia-open-dkms", "nvidia-driver-cuda",
                                     "nvidia-driver-cuda-libs", "nvidia-persistenced"]
    pinned = driver.gpuprov_driver_plan(_settings("RedHat_10", branch="580", version="580.105.08"))
    assert pinned["install_names"][0] == "kmod-nvidia-latest-dkms-580.105.08"


def test_back_to_debians_archive_removes_nvidias_lock_and_repository_and_moves_the_branch(
        driver):
    plan = driver.gpuprov_driver_plan(_settings())
    assert plan["install_names"][0] == "nvidia-kernel-dkms" and plan["allow_downgrade"] is True
    state = _state(**{n: ("580.105.08-1", False) for n in plan["held_packages"]},
                   **{"nvidia-driver-pinning-580": ("580-5", False)})
    state["files"] = [{"path": "/etc/apt/sources.list.d/gpuprov-nvidia-cuda.sources"},
                      {"path": "/etc/apt/keyrings/gpuprov-nvidia-cuda.asc"}]
    work = driver.gpuprov_driver_work(state, plan, host="gpu-a", package_manager="apt")
    assert work["removed_packages"] == ["nvidia-driver-pinning-580"]
    assert work["stale_files"] == ["/etc/apt/sources.list.d/gpuprov-nvidia-cuda.sources",
                                   "/etc/apt/keyrings/gpuprov-nvidia-cuda.asc"]
    assert set(plan["driver_packages"]) <= set(work["apt_work"])  # 580 is not 535.*
    assert not work["apt_converged"]
    # Installed but of another branch: apt is asked for any 535 of Debian's, as apt spells it.
    assert work["install_names"][:2] == ["nvidia-kernel-dkms=535.*", "nvidia-smi=535.*"]


# Kernel headers for DKMS: the running kernel's and the meta-package of its flavour, with
# kernel releases as the distributions name them.
@pytest.mark.parametrize(("os_file", "kernel", "meta"), [
    ("Debian_12", "6.1.0-27-amd64", "linux-headers-amd64"),
    ("Debian_12", "6.1.0-27-cloud-amd64", "linux-headers-cloud-amd64"),
    ("Debian_13", "6.12.38+deb13-amd64", "linux-headers-amd64"),
    ("Debian_13", "6.12.38+deb13-rt-arm64", "linux-headers-rt-arm64"),
    ("Ubuntu_24", "6.8.0-45-generic", "linux-headers-generic"),
    ("Ubuntu_22", "5.15.0-1050-aws", "linux-headers-aws"),
    ("RedHat_9", "5.14.0-427.13.1.el9_4.x86_64", "kernel-devel-matched"),
    ("RedHat_8", "4.18.0-553.el8_10.x86_64", "kernel-devel"),
])
def test_kernel_headers_are_the_running_kernels_and_the_flavours_meta_package(
        driver, os_file, kernel, meta):
    data = _os_data(os_file)
    patterns = data["__nvidia_driver_kernel_headers_packages"]
    running = [n.format(kernel=kernel) for n in patterns]
    assert all(kernel in n for n in running), patterns
    settings = _settings(os_file, branch="580", kernel=kernel, kernel_headers=patterns,
                         kernel_headers_meta=data["__nvidia_driver_kernel_headers_meta"])
    assert driver.gpuprov_driver_plan(settings)["kernel_headers"] == [*running, meta]
    no_meta = driver.gpuprov_driver_plan({**settings, "install_kernel_headers_meta": False})
    assert no_meta["kernel_headers"] == running
    neither = driver.gpuprov_driver_plan({**settings, "install_kernel_headers_meta": False,
                                  "install_kernel_headers": False})
    assert neither["kernel_headers"] == []


def test_headers_missing_on_a_converged_node_are_apt_work(driver):
    plan = driver.gpuprov_driver_plan(_settings(
        version="535.261.03-1", kernel="6.1.0-27-amd64",
        kernel_headers=["linux-headers-6.1.0-27-amd64"],
        kernel_headers_meta="linux-headers-{flavour}"))
    installed = {n: ("535.261.03-1", True) for n in plan["driver_packages"]}
    installed.update({"nvidia-persistenced": ("535.171.04-1", True),
                      "linux-headers-6.1.0-27-amd64": ("6.1.115-1", False)})
    work = driver.gpuprov_driver_work(_state(**installed), plan, host="gpu-a",
                                      package_manager="apt",
                              headers=plan["kernel_headers"])
    assert work["apt_work"] == ["linux-headers-amd64"] and not work["apt_converged"]


# The kernel the node boots next (gpuprov/node/probe/boot.py's read), as the role rebuilds it.
NEXT = "6.1.0-50-amd64"


def _boot(module: dict | None, next_kernel: str | None = NEXT) -> dict:
    return {"kernels": ["6.1.0-27-amd64", NEXT] if next_kernel else [],
            "running_kernel": "6.1.0-27-amd64", "next_kernel": next_kernel,
            "modules": {NEXT: module} if next_kernel else {}}


def _module(version: str | None) -> dict:
    return {"path": f"/lib/modules/{NEXT}/updates/dkms/nvidia-current.ko", "kind": "dkms",
            "version": version, "signer": None, "sig_key": None, "signed": False,
            "error": None}


def _next_kernel_work(driver, boot: dict, os_file: str = "Debian_12",
                      installed: str = "535.261.03-1", **overrides):
    data = _os_data(os_file)
    plan = driver.gpuprov_driver_plan(_settings(
        os_file, kernel="6.1.0-27-amd64",
        kernel_headers=data["__nvidia_driver_kernel_headers_packages"], **overrides))
    state = _state(**{n: (installed, True) for n in plan["held_packages"]})
    return driver.gpuprov_driver_work({**state, "boot": boot}, plan, host="gpu-a",
                              package_manager=data["__nvidia_driver_package_manager"],
                              )["next_kernel"]


@pytest.mark.parametrize(("os_file", "installed", "headers"), [
    ("Debian_12", "535.261.03-1", [f"linux-headers-{NEXT}"]),
    ("Ubuntu_24", "580.95.05-0ubuntu1", [f"linux-headers-{NEXT}"]),
    ("RedHat_9", "580.95.05-1.el9", [f"kernel-devel-{NEXT}", f"kernel-headers-{NEXT}"]),
])
def test_a_next_kernel_without_a_module_gets_its_headers_and_a_build(driver, os_file,
                                                                       installed, headers):
    branch = installed.split(".")[0]
    work = _next_kernel_work(driver, _boot(None), os_file, installed, branch=branch)
    assert work == {"kernel": NEXT, "headers": headers,
                    "reason": f"kernel {NEXT}, the one the node boots next, has no nvidia module"}


@pytest.mark.parametrize(("boot", "expected"), [
    (_boot(_module("530.30.02")), f"kernel {NEXT}, the one the node boots next, has nvidia "
                                  f"530.30.02 ({_module(None)['path']}) but the installed "
                                  "driver is 535.261.03"),
    (_boot(_module(None)), f"kernel {NEXT}, the one the node boots next, has nvidia "
                           f"(version unreadable) ({_module(None)['path']}) but the installed "
                           "driver is 535.261.03"),
    (_boot(_module("535.261.03")), None),
    (_boot(None, next_kernel=None), None),  # no image in /boot: a container
    ({}, None),  # the read had no boot section
])
def test_a_module_of_another_version_is_rebuilt_and_the_right_one_is_left(driver, boot,
                                                                          expected):
    work = _next_kernel_work(driver, boot)
    assert (work and work["reason"]) == expected


def test_nothing_is_built_when_switched_off_or_for_ubuntus_prebuilt_modules(driver):
    assert _next_kernel_work(driver, _boot(None), build_next_kernel=False) is None
    plan = driver.gpuprov_driver_plan(_settings("Ubuntu_24", branch="580", prebuilt_modules=True,
                                        kernel_headers=["linux-headers-{kernel}"]))
    assert plan["next_kernel_build"] is False
    dkms = driver.gpuprov_driver_plan(_settings("Ubuntu_24", branch="580"))
    assert dkms["next_kernel_build"] is True


def test_nothing_is_built_before_a_driver_is_installed(driver):
    plan = driver.gpuprov_driver_plan(_settings(kernel_headers=["linux-headers-{kernel}"]))
    work = driver.gpuprov_driver_work({**_state(), "boot": _boot(None)}, plan, host="gpu-a",
                              package_manager="apt")
    assert work["next_kernel"] is None


# nvidia_driver_debian_backports, given for every node (-e): a suite of Debian's archive, so
# it applies only where the driver comes from there (issue 31: on gpu-hopper, Debian 13 with
# NVIDIA's repository, it made apt fail midway with "The value 'trixie-backports' is invalid
# for APT::Default-Release").
def test_backports_is_the_target_release_where_the_driver_comes_from_debians_archive(driver):
    plan = driver.gpuprov_driver_plan(_settings(debian_backports=True, release="bookworm"))
    assert plan["target_release"] == "bookworm-backports" and plan["notes"] == []
    assert driver.gpuprov_driver_plan(_settings(release="bookworm"))["target_release"] is None


@pytest.mark.parametrize(("settings", "why"), [
    (_cuda_settings(debian_backports=True, release="trixie"),
     "its driver comes from NVIDIA's repository"),
    (_settings("Ubuntu_24", debian_backports="yes", release="noble"), "Ubuntu 24, not Debian"),
    (_settings("RedHat_9", debian_backports=True), "RedHat 9, not Debian"),
])
def test_backports_is_ignored_with_a_note_where_it_cannot_apply(driver, settings, why):
    plan = driver.gpuprov_driver_plan(settings)
    assert plan["problem"] is None and plan["target_release"] is None
    (note,) = plan["notes"]
    assert note.startswith("gpu-a: nvidia_driver_debian_backports is ignored: ") and why in note
