"""The gpu_preflight role, the gpuprov filter plugin and the gpuprov_probe_script lookup.

Filters and the lookup are called directly; the role runs through the real
`ansible-playbook` (repo's ansible.cfg, JSON callback) against localhost, one inventory host
per recorded sysfs tree in tests/fixtures/sysfs/ (the probe's --root), with the OS facts
supplied by tests/fixtures/ansible/library/gpuprov_test_facts.py so the results do not
depend on the machine running the tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from ansible.errors import AnsibleFilterError, AnsibleLookupError

from gpuprov import payload
from gpuprov.nvidia import hardware

REPO = Path(__file__).resolve().parents[2]
SYSFS = REPO / "tests" / "fixtures" / "sysfs"
CASES = sorted(p.name for p in SYSFS.iterdir() if p.is_dir())
ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
# The probe must run with a node's plain python3; fall back only where there is none.
NODE_PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable

P100, K80, H100 = "10de:15f8", "10de:102d", "10de:2330"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


filters = _load("gpuprov_filter_plugin", REPO / "plugins" / "filter" / "gpu_preflight.py")
lookup = _load(
    "gpuprov_probe_script_lookup", REPO / "plugins" / "lookup" / "gpuprov_probe_script.py"
)


def probe_pci(case: str) -> list[dict]:
    """The probe report's pci section for a recorded tree, collected in-process."""
    return payload.run_probe_local(root=str(SYSFS / case))["pci"]


# -- filter plugin ------------------------------------------------------------------------


def test_filters_are_registered():
    assert set(filters.FilterModule().filters()) == {
        "gpuprov_classify",
        "gpuprov_choose_branch",
        "gpuprov_probe_gpus",
        "gpuprov_node_python",
        "gpuprov_probe_outcome",
        "gpuprov_gpu_summary",
        "gpuprov_choice_text",
        "gpuprov_os_problem",
        "gpuprov_allocation_problem",
        "gpuprov_dra_asked",
        "gpuprov_cluster_versions",
    }
    # The gpu_verify role's, in its own file.
    verify = _load("gpuprov_verify_filter_plugin", REPO / "plugins" / "filter" / "gpu_verify.py")
    assert set(verify.FilterModule().filters()) == {"gpuprov_verify_host_vars"}


def test_classify_ids_and_devices():
    by_id, by_device = filters.gpuprov_classify(
        [P100, {"pci_id": K80, "subsystem_id": "10de:106c", "address": "0000:05:00.0"}]
    )
    assert (by_id["name"], by_id["architecture"], by_id["compute_capability"]) == (
        "Tesla P100-PCIE-16GB",
        "pascal",
        "6.0",
    )
    assert (by_device["name"], by_device["architecture"], by_device["max_branch"]) == (
        "Tesla K80",
        "kepler",
        470,
    )
    assert by_id["message"]


def test_classify_unknown_id_is_data_not_error():
    (gpu,) = filters.gpuprov_classify(["10de:ffff"])
    assert gpu["status"] == "unknown" and gpu["name"] is None


@pytest.mark.parametrize("bad", ["10de:15f8", None, {"pci_id": P100}])
def test_classify_needs_a_list(bad):
    with pytest.raises(AnsibleFilterError, match="expects a list"):
        filters.gpuprov_classify(bad)


def test_classify_bad_pci_id_is_one_line():
    with pytest.raises(AnsibleFilterError, match="^gpuprov_classify: .*not a PCI ID") as info:
        filters.gpuprov_classify(["nvidia"])
    assert "\n" not in str(info.value)


def test_choose_branch_kepler_and_pin_fallback():
    auto = filters.gpuprov_choose_branch([K80, K80], "debian", "12")
    assert (auto["ok"], auto["branch"]) == (True, 470)
    pinned = filters.gpuprov_choose_branch([K80], "debian", "12", 535)
    assert (pinned["ok"], pinned["branch"]) == (True, 470)
    assert any("535" in note for note in pinned["notes"])


def test_choose_branch_honours_a_pin_given_as_inventory_string():
    choice = filters.gpuprov_choose_branch([P100], "ubuntu", "24.04", "580")
    assert (choice["ok"], choice["branch"]) == (True, 580)


def test_choose_branch_mixed_generations_is_not_ok():
    choice = filters.gpuprov_choose_branch([K80, H100], "debian", "12")
    assert choice["ok"] is False and choice["branch"] is None
    assert choice["reason"]


def test_choose_branch_takes_the_driver_source_and_refuses_an_unknown_one():
    choice = filters.gpuprov_choose_branch([H100], "debian", "13", "580", "nvidia")
    assert (choice["ok"], choice["branch"], choice["os"]) == (True, 580, "debian 13 (nvidia)")
    with pytest.raises(AnsibleFilterError, match="gpuprov_choose_branch: driver source 'cuda' "
                                                 "is not one of distro, nvidia"):
        filters.gpuprov_choose_branch([H100], "debian", "13", None, "cuda")


def test_choose_branch_bad_pin_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="gpuprov_choose_branch: .*535"):
        filters.gpuprov_choose_branch([P100], "debian", "12", "latest")


def test_missing_gpuprov_says_how_to_install(monkeypatch):
    import gpuprov.nvidia

    # What an ansible whose Python lacks gpuprov sees: the import fails (the stage's, and the
    # hardware table's it imports).
    monkeypatch.delattr(gpuprov.nvidia, "hardware", raising=False)
    monkeypatch.setitem(sys.modules, "gpuprov.nvidia.hardware", None)
    monkeypatch.setitem(sys.modules, "gpuprov.stages.gpu_preflight", None)
    with pytest.raises(AnsibleFilterError, match=r"pip install -e \.$"):
        filters.gpuprov_classify([P100])


def test_probe_gpus_flattens_the_probe_classification():
    gpus = filters.gpuprov_probe_gpus(probe_pci("h100x8"))
    assert [g["pci_id"] for g in gpus] == [H100] * 8  # the 4 NVSwitches (class 0x0680) left out
    gpu = gpus[0]
    assert {k: gpu[k] for k in ("address", "pci_id", "class", "subsystem_id", "numa_node")} == {
        "address": "0000:18:00.0",
        "pci_id": H100,
        "class": "0x030200",
        "subsystem_id": "10de:16c1",
        "numa_node": 0,
    }
    assert (gpu["name"], gpu["architecture"], gpu["compute_capability"]) == (
        "NVIDIA H100 80GB HBM3",
        "hopper",
        "9.0",
    )
    assert "classification" not in gpu and "device_id" not in gpu


def test_probe_gpus_names_a_gpu_the_table_failed_on():
    (device,) = probe_pci("k80x2")[:1]
    broken = {**device, "classification": None, "classification_error": "KeyError: 'x'"}
    (gpu,) = filters.gpuprov_probe_gpus([broken])
    assert (gpu["pci_id"], gpu["status"], gpu["name"]) == (K80, "unknown", None)
    assert gpu["classification_error"] == "KeyError: 'x'"


@pytest.mark.parametrize("bad", [None, {"pci": []}, ["10de:15f8"]])
def test_probe_gpus_needs_the_pci_list(bad):
    with pytest.raises(AnsibleFilterError, match="^gpuprov_probe_gpus expects a list of devices"):
        filters.gpuprov_probe_gpus(bad)


# -- gpuprov_probe_script lookup ----------------------------------------------------------


def test_lookup_returns_the_probe_script():
    assert lookup.LookupModule().run([]) == [payload.probe_script().decode("ascii")]


@pytest.mark.parametrize("terms", [["x"], ["probe", "mig-apply"]])
def test_lookup_takes_at_most_the_entry(terms):
    with pytest.raises(AnsibleLookupError, match="at most one term, probe or mig-apply"):
        lookup.LookupModule().run(terms)


def test_lookup_gives_the_mig_applier_as_its_own_script():
    (probe,) = lookup.LookupModule().run([])
    (applier,) = lookup.LookupModule().run(["mig-apply"])
    assert "from gpuprov.node.mig_apply import main" in applier
    assert "from gpuprov.node.probe.__main__ import main" in probe and applier != probe


def test_lookup_without_gpuprov_says_how_to_install(monkeypatch):
    # What an ansible whose Python lacks gpuprov sees: the import fails.
    monkeypatch.setitem(sys.modules, "gpuprov.payload", None)
    with pytest.raises(AnsibleLookupError, match=r"pip install -e \.$") as info:
        lookup.LookupModule().run([])
    assert "\n" not in str(info.value)


# -- the role, through ansible-playbook ---------------------------------------------------


def run_preflight(tmp_path: Path, os_name: str, hosts: dict[str, dict], *args: str) -> tuple:
    """Run the preflight stage against localhost aliases (only it: the later stages would
    change this machine); returns (exit code, JSON callback document)."""
    if not ANSIBLE_PLAYBOOK.exists():
        pytest.skip(f"no ansible-playbook next to {sys.executable}")
    inventory = {
        "all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": NODE_PYTHON},
            "children": {
                "k8s_cluster": {
                    "children": {
                        group: {
                            "hosts": {
                                name: {
                                    "gpu_preflight_probe_root": str(SYSFS / spec["sysfs"]),
                                    **spec.get("vars", {}),
                                }
                                for name, spec in hosts.items()
                                if spec["group"] == group
                            }
                        }
                        for group in ("gpu_nodes", "cpu_nodes")
                    }
                }
            },
        }
    }
    inventory_file = tmp_path / "hosts.yml"
    inventory_file.write_text(yaml.safe_dump(inventory))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        # The test seam, then the roles' own modules (the variable replaces ansible.cfg's).
        "ANSIBLE_LIBRARY": f"{REPO / 'tests' / 'fixtures' / 'ansible' / 'library'}:"
                           f"{REPO / 'plugins' / 'modules'}",
        "ANSIBLE_FACTS_MODULES": "gpuprov_test_facts",
        "GPUPROV_TEST_OS": os_name,
    }
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory_file), "playbooks/preflight.yml", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"ansible-playbook rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}")


def task_results(doc: dict, name: str) -> dict[str, dict]:
    """host -> result of the task with this name (the role prefix stripped)."""
    for play in doc["plays"]:
        for task in play["tasks"]:
            if task["task"]["name"].split(" : ")[-1] == name:
                return task["hosts"]
    raise AssertionError(f"no task named {name!r} ran")


def facts(doc: dict, host: str) -> dict:
    """Every fact the role set for the host."""
    merged: dict = {}
    for play in doc["plays"]:
        for task in play["tasks"]:
            merged.update(task["hosts"].get(host, {}).get("ansible_facts", {}))
    return merged


def failed_task(doc: dict, host: str) -> tuple[str, str]:
    for play in doc["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(host, {})
            if result.get("failed"):
                return task["task"]["name"].split(" : ")[-1], result["msg"]
    raise AssertionError(f"{host} did not fail")


# Debian 12's own R535 (535.261.03) lacks NVIDIA's later fixes: the nodes that get it accept
# the risk, as the lab's Debian 12 nodes do (gpuprov/lab/lab.py); gpu-unaccepted does not.
ACCEPTED = {"nvidia_driver_allow_vulnerable": True}
DEBIAN_LAB = {
    "gpu-pascal": {"group": "gpu_nodes", "sysfs": "p100x4", "vars": ACCEPTED},
    "gpu-kepler": {"group": "gpu_nodes", "sysfs": "k80x2", "vars": {"nvidia_driver_branch": 535}},
    "gpu-hopper": {"group": "gpu_nodes", "sysfs": "h100x8", "vars": ACCEPTED},
    "gpu-unaccepted": {"group": "gpu_nodes", "sysfs": "h100x8"},
    "gpu-mixed": {"group": "gpu_nodes", "sysfs": "k80_h100"},
    "gpu-empty": {"group": "gpu_nodes", "sysfs": "no_gpu"},
    "cpu-only": {"group": "cpu_nodes", "sysfs": "no_gpu"},
}


OLD_PYTHON_LINE = "gpuprov probe needs python3 >= 3.9, this node has 3.6.8"


def old_python(directory: Path) -> Path:
    """A node's python3 that runs Ansible's modules but is too old for the probe.

    Ansible runs modules as `python3` (script on stdin, pipelining) or `python3 FILE`; only the
    probe passes -I. The payload's own version check is tested in test_probe_payload.py; this
    stands in for its answer on a python 3.6 node.
    """
    wrapper = directory / "python3.6"
    wrapper.write_text(
        "#!/bin/sh\n"
        # Reads the script first, as python3 does before it runs any of it.
        f'if [ "$1" = "-I" ]; then cat >/dev/null; echo "{OLD_PYTHON_LINE}" >&2; exit 2; fi\n'
        f'exec {NODE_PYTHON} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def debian_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("debian")
    hosts = {
        **DEBIAN_LAB,
        "gpu-oldpython": {
            "group": "gpu_nodes",
            "sysfs": "p100x4",
            "vars": {"ansible_python_interpreter": str(old_python(tmp_path))},
        },
    }
    return run_preflight(tmp_path, "Debian 12", hosts)


def test_bad_nodes_fail_alone(debian_run):
    rc, doc = debian_run
    failures = {host: stats["failures"] for host, stats in doc["stats"].items()}
    assert failures == {
        "gpu-pascal": 0,
        "gpu-kepler": 0,
        "gpu-hopper": 0,
        "gpu-unaccepted": 1,
        "gpu-mixed": 1,
        "gpu-empty": 1,
        "gpu-oldpython": 1,
        "cpu-only": 0,
    }
    assert rc == 2  # ansible-playbook: some hosts failed
    assert all(stats["changed"] == 0 for stats in doc["stats"].values())


def test_report_line_per_gpu_node(debian_run):
    _, doc = debian_run
    report = task_results(doc, "Report the node's GPUs and driver branch")
    assert report["gpu-pascal"]["msg"].startswith(
        "gpu-pascal: 4x Tesla P100-PCIE-16GB (pascal, cc 6.0) -> driver branch 535 ("
    )
    assert report["gpu-hopper"]["msg"].startswith(
        "gpu-hopper: 8x NVIDIA H100 80GB HBM3 (hopper, cc 9.0) -> driver branch 535 ("
    )
    kepler = report["gpu-kepler"]["msg"]
    assert kepler.startswith("gpu-kepler: 2x Tesla K80 (kepler, cc 3.7) -> driver branch 470 (")
    assert "pinned branch 535" in kepler  # says why the pin was not used
    assert report["cpu-only"]["msg"] == (
        "cpu-only: no NVIDIA GPU on PCI -> no driver; the GPU roles skip this node"
    )


def test_facts_for_later_roles(debian_run):
    _, doc = debian_run
    pascal = facts(doc, "gpu-pascal")
    assert pascal["gpu_preflight_has_gpu"] is True
    assert pascal["gpu_preflight_gpu_count"] == 4
    assert pascal["gpu_preflight_driver_branch"] == 535
    assert pascal["gpu_preflight_open_kernel_modules_supported"] is False
    assert [g["address"] for g in pascal["gpu_preflight_gpus"]] == [
        "0000:04:00.0",
        "0000:06:00.0",
        "0000:84:00.0",
        "0000:86:00.0",
    ]
    gpu = pascal["gpu_preflight_gpus"][0]
    assert (gpu["pci_id"], gpu["architecture"], gpu["numa_node"]) == (P100, "pascal", 0)
    # The whole probe report, for the later roles.
    probe = pascal["gpu_preflight_probe"]
    assert probe["schema_version"] == 1
    assert probe["probe"]["root"] == str(SYSFS / "p100x4")
    assert probe["summary"]["pci_gpu_count"] == 4
    hopper = facts(doc, "gpu-hopper")
    assert hopper["gpu_preflight_gpu_count"] == 8
    assert hopper["gpu_preflight_open_kernel_modules_supported"] is True
    cpu = facts(doc, "cpu-only")
    assert cpu["gpu_preflight_has_gpu"] is False
    assert cpu["gpu_preflight_gpu_count"] == 0
    assert cpu["gpu_preflight_gpus"] == []
    assert cpu["gpu_preflight_driver_branch"] is None


def test_unsatisfiable_node_fails_with_its_gpus_and_reason(debian_run):
    _, doc = debian_run
    task, msg = failed_task(doc, "gpu-mixed")
    assert task == "Assert that a driver branch installable on this OS supports all GPUs"
    expected = filters.gpuprov_choose_branch([K80, K80, H100], "debian", "12")["reason"]
    assert msg == (
        "gpu-mixed: 2x Tesla K80 (kepler, cc 3.7), 1x NVIDIA H100 80GB HBM3 (hopper, cc 9.0) "
        f"on Debian 12: {expected}"
    )


def test_a_branch_below_nvidias_fixes_fails_unless_accepted(debian_run):
    _, doc = debian_run
    task, msg = failed_task(doc, "gpu-unaccepted")
    assert task == "Assert that a driver branch installable on this OS supports all GPUs"
    expected = filters.gpuprov_choose_branch([H100], "debian", "12", None, None, {},
                                             False)["reason"]
    assert f"on Debian 12: {expected}" in msg
    assert expected.startswith("debian 12's R535 is 535.261.03, below its fixed version "
                               "535.309.01 (bulletin 5703")
    # NVIDIA's repository for Debian 12 has R620, NVIDIA's newest supported branch, which no
    # bulletin lists yet (so no fixed version to name).
    assert expected.endswith("set nvidia_driver_source: nvidia (it offers R620), or set "
                             "nvidia_driver_allow_vulnerable: true to accept the risk")
    accepted = filters.gpuprov_choose_branch([H100], "debian", "12", None, None, {}, "yes")
    assert accepted["ok"] and accepted["branch"] == 535
    assert any(n.endswith("(accepted: nvidia_driver_allow_vulnerable)")
               for n in accepted["notes"])
    with pytest.raises(AnsibleFilterError, match="nvidia_driver_allow_vulnerable must be true "
                                                 "or false"):
        filters.gpuprov_choose_branch([H100], "debian", "12", None, None, {}, "maybe")


def test_gpu_node_without_gpus_fails(debian_run):
    _, doc = debian_run
    task, msg = failed_task(doc, "gpu-empty")
    assert task == "Assert that an expected GPU node has GPUs"
    assert "move the host to cpu_nodes" in msg


def test_failed_probe_fails_the_host_with_its_message(debian_run):
    _, doc = debian_run
    task, msg = failed_task(doc, "gpu-oldpython")
    assert task == "Assert that the probe produced a report"
    assert msg.startswith("gpu-oldpython: the gpuprov probe failed (")
    assert msg.endswith(f" exited 2): {OLD_PYTHON_LINE}")
    assert "\n" not in msg


def test_check_mode_on_another_os(tmp_path):
    """--check --diff runs every step; the role hands the node's own OS to the chooser."""
    rc, doc = run_preflight(
        tmp_path,
        "Ubuntu 24",
        {
            "gpu-pascal": {"group": "gpu_nodes", "sysfs": "p100x4"},
            "gpu-kepler": {"group": "gpu_nodes", "sysfs": "k80x2"},
        },
        "--check",
        "--diff",
    )
    assert rc == 2
    assert {h: s["changed"] for h, s in doc["stats"].items()} == {"gpu-pascal": 0, "gpu-kepler": 0}
    expected = filters.gpuprov_choose_branch([P100] * 4, "ubuntu", "24.04")
    assert facts(doc, "gpu-pascal")["gpu_preflight_driver_branch"] == expected["branch"]
    task, msg = failed_task(doc, "gpu-kepler")
    assert task == "Assert that a driver branch installable on this OS supports all GPUs"
    assert msg.startswith("gpu-kepler: 2x Tesla K80 (kepler, cc 3.7) on Ubuntu 24: ")


def test_unsupported_os_says_what_to_do(tmp_path):
    rc, doc = run_preflight(
        tmp_path, "Fedora 40", {"gpu-pascal": {"group": "gpu_nodes", "sysfs": "p100x4"}}
    )
    assert rc == 2
    task, msg = failed_task(doc, "gpu-pascal")
    assert task == "Assert that the operating system is supported and the role has data for it"
    assert msg.startswith("Fedora 40 is not a supported OS for GPU nodes (supported: Debian 12,")
    assert "Install a supported OS on gpu-pascal" in msg


def test_preflight_classifies_a_gpu_the_table_lacks_by_the_nodes_pci_ids(tmp_path):
    """An HGX node whose GPUs include an H100 variant gpuprov's table lacks (10de:2336): the
    probe reads its name in the node's pci.ids (the real file of Debian's package), and the
    preflight drives it as Hopper, with a warning in its report, instead of stopping."""
    root = tmp_path / "variant"
    shutil.copytree(SYSFS / "h100x8", root, symlinks=True)
    first = sorted(p for p in (root / "sys/bus/pci/devices").iterdir()
                   if (p / "device").read_text().strip() == "0x2330")[0]
    (first / "device").write_text("0x2336\n")
    system = next(Path(p) for p in hardware.PCI_IDS_PATHS if Path(p).exists())
    (root / "usr/share/misc").mkdir(parents=True)
    shutil.copy(system, root / "usr/share/misc/pci.ids")
    hosts = {"gpu-variant": {"group": "gpu_nodes", "sysfs": str(root),
                             "vars": {"nvidia_driver_source": "nvidia"}}}
    rc, doc = run_preflight(tmp_path, "Debian 13", hosts)
    assert rc == 0, failed_task(doc, "gpu-variant")
    expected = filters.gpuprov_choose_branch(["10de:2336"] + [H100] * 7, "debian", "13",
                                             None, "nvidia", {"10de:2336": "GH100 [H100]"})
    assert facts(doc, "gpu-variant")["gpu_preflight_driver_branch"] == expected["branch"]
    report = task_results(doc, "Report the node's GPUs and driver branch")["gpu-variant"]["msg"]
    assert "1x H100 (hopper, cc 9.0)" in report
    assert "warning: 10de:2336 (GH100 [H100]): not in gpuprov's hardware table; hopper" in report


@pytest.mark.parametrize(("os_name", "os_id", "version"), [
    ("Rocky 10", "rocky", "10"), ("Ubuntu 26", "ubuntu", "26.04")])
def test_preflight_on_the_new_releases(tmp_path, os_name, os_id, version):
    """RHEL/Rocky 10 and Ubuntu 26.04: the role loads their data and the chooser answers for
    them (NVIDIA's repository on Rocky, Ubuntu's archive on Ubuntu)."""
    rc, doc = run_preflight(tmp_path, os_name,
                            {"gpu-hopper": {"group": "gpu_nodes", "sysfs": "h100x8"}},
                            "--check")
    assert rc == 0, failed_task(doc, "gpu-hopper")
    expected = filters.gpuprov_choose_branch([H100] * 8, os_id, version)
    assert expected["ok"] and expected["branch"] is not None
    assert facts(doc, "gpu-hopper")["gpu_preflight_driver_branch"] == expected["branch"]
