"""NVIDIA container toolkit security: the CVE table and runtime.toolkit-version, the role's
pin against that table, the toolkit's config.toml merge (the GPU-access keys) and the probe's
reading of that file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpuprov.lab import pkgrepo
from gpuprov.node.probe import runtime as probe_runtime
from gpuprov.node.probe.fs import Root
from gpuprov.nvidia import toolkit_advisories as adv
from gpuprov.stages import _toolkit_config
from gpuprov.verify import checks  # noqa: F401 (registers the checks)
from gpuprov.verify.checks import runtime as runtime_checks
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.inventory import Node

REPO = Path(__file__).resolve().parents[2]
PROBES = REPO / "tests" / "fixtures" / "verify" / "probe"
ROLE_DEFAULTS = REPO / "roles" / "nvidia_container_toolkit" / "defaults" / "main.yml"
# NVIDIA's config.toml as the lab's package installs it (the real package's, abridged: the
# two keys commented out at their defaults, as `nvidia-ctk config default` writes them).
PACKAGED = (pkgrepo.TOOLKIT_DIR / "config.toml").read_text()


def toolkit_facts(version: str | None) -> NodeFacts:
    doc = json.loads((PROBES / "gpu-pascal.json").read_text())
    names = runtime_checks.TOOLKIT_PACKAGES
    doc["packages"]["driver"] = [p for p in doc["packages"]["driver"] if p["name"] not in names]
    if version:
        doc["packages"]["driver"] += [{"name": n, "version": version, "state": "installed",
                                       "held": True} for n in names]
    return NodeFacts(Node("gpu-pascal", None, True), doc)


# -- the advisories ------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "cves"), [
    ("1.17.7-1", {"CVE-2025-23266", "CVE-2025-23267", "CVE-2026-24260"}),
    ("1.17.8-1", {"CVE-2026-24260"}),
    ("1.19.0-1", {"CVE-2026-24260"}),
    ("1.19.1-1", set()),
    ("0:1.20.0-1", set()),
    ("1.19.1~rc.1-1", {"CVE-2026-24260"}),  # a release candidate predates its release's fixes
])
def test_vulnerabilities_by_version(version, cves):
    assert {a.cve for a in adv.vulnerabilities(version)} == cves


def test_every_advisory_names_nvidias_bulletin():
    for a in adv.ADVISORIES:
        assert a.cve.startswith("CVE-") and adv.upstream(a.fixed_in)
        assert a.url == f"https://nvidia.custhelp.com/app/answers/detail/a_id/{a.bulletin}"
    assert adv.minimum_safe() == "1.19.1"


def test_the_roles_pin_and_the_labs_repository_have_no_known_cve():
    pin = yaml.safe_load(ROLE_DEFAULTS.read_text())["nvidia_container_toolkit_version"]
    assert adv.vulnerabilities(pin) == []
    assert pin == pkgrepo.TOOLKIT_VERSION  # the lab serves what the role installs
    old = [v for v in pkgrepo.TOOLKIT_VERSIONS if v != pin]
    assert old and all(adv.vulnerabilities(v) for v in old)  # and an old one, for the tests


def test_not_a_version_is_refused():
    with pytest.raises(ValueError, match="not a toolkit version"):
        adv.vulnerabilities("latest")


# -- runtime.toolkit-version ---------------------------------------------------------------------

def test_vulnerable_toolkit_fails_with_the_cve_ids_and_the_version_to_install():
    verdict = runtime_checks.toolkit_version(toolkit_facts("1.17.7-1"))
    assert verdict.status == "problem"
    assert verdict.message == ("nvidia-container-toolkit 1.17.7-1 has known vulnerabilities: "
                               "CVE-2025-23266, CVE-2025-23267, CVE-2026-24260; install "
                               "1.19.1 or later")
    assert {c["advisory"] for c in verdict.details["cves"]} == {
        "https://nvidia.custhelp.com/app/answers/detail/a_id/5659",
        "https://nvidia.custhelp.com/app/answers/detail/a_id/5850"}


def test_the_lowest_installed_package_counts():
    facts = toolkit_facts("1.20.0-1")
    for p in facts.report["packages"]["driver"]:
        if p["name"] == "libnvidia-container1":
            p["version"] = "1.16.1-1"
    verdict = runtime_checks.toolkit_version(facts)
    assert verdict.status == "problem" and verdict.message.startswith("libnvidia-container1")
    assert "CVE-2024-0132" in verdict.message


def test_current_toolkit_passes_and_a_missing_one_fails():
    assert runtime_checks.toolkit_version(toolkit_facts("1.20.0-1")).status == "pass"
    missing = runtime_checks.toolkit_version(toolkit_facts(None))
    assert missing.status == "problem" and "not installed" in missing.message


# -- the toolkit's config.toml -------------------------------------------------------------------

def test_merge_sets_the_keys_and_keeps_the_packages_file():
    result = _toolkit_config.merge(PACKAGED, _toolkit_config.SECURE)
    assert result["changed"]
    text = result["text"]
    assert text.startswith(PACKAGED.split("\n[", 1)[0])  # comments and keys before the tables
    for line in PACKAGED.splitlines():
        assert line in text.splitlines()
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in text
    assert "accept-nvidia-visible-devices-as-volume-mounts = true" in text
    # Set before the first table: top-level keys, as the toolkit reads them.
    assert text.index("accept-nvidia-visible-devices-as-volume-mounts") < text.index("[")
    again = _toolkit_config.merge(text, _toolkit_config.SECURE)
    assert again == {"text": text, "changed": False}


def test_merge_flips_an_admins_explicit_setting_and_keeps_the_rest():
    admin = ('# ours\naccept-nvidia-visible-devices-envvar-when-unprivileged = true\n'
             'disable-require = true\n\n[nvidia-container-runtime]\nmode = "legacy"\n')
    text = _toolkit_config.merge(admin, _toolkit_config.SECURE)["text"]
    assert "accept-nvidia-visible-devices-envvar-when-unprivileged = false" in text
    assert "# ours" in text and "disable-require = true" in text and 'mode = "legacy"' in text


def test_merge_of_a_missing_file_and_refusals():
    assert _toolkit_config.merge(None, _toolkit_config.SECURE)["text"] == (
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"
        "accept-nvidia-visible-devices-as-volume-mounts = true\n")
    with pytest.raises(_toolkit_config.ToolkitConfigError, match="is not valid TOML"):
        _toolkit_config.merge("disable-require = \n", _toolkit_config.SECURE)
    with pytest.raises(_toolkit_config.ToolkitConfigError, match="not a toolkit setting"):
        _toolkit_config.merge(PACKAGED, {"disable-require": True})


def test_probe_reads_the_keys_with_nvidias_defaults(tmp_path):
    assert probe_runtime.collect_toolkit_config(Root(str(tmp_path)))["present"] is False
    path = tmp_path / "etc/nvidia-container-runtime/config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(PACKAGED)
    packaged = probe_runtime.collect_toolkit_config(Root(str(tmp_path)))
    assert packaged["settings"] == {
        "accept-nvidia-visible-devices-envvar-when-unprivileged": True,
        "accept-nvidia-visible-devices-as-volume-mounts": False}
    path.write_text(_toolkit_config.merge(PACKAGED, _toolkit_config.SECURE)["text"])
    merged = probe_runtime.collect_toolkit_config(Root(str(tmp_path)))
    assert merged["settings"] == _toolkit_config.SECURE and merged["mode"] == "auto"


# -- the device plugin's strategy against the toolkit's settings --------------------------------

def test_role_defaults_are_the_secure_settings():
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    assert {
        _toolkit_config.ENVVAR_UNPRIVILEGED:
            defaults["nvidia_container_toolkit_accept_envvar_unprivileged"],
        _toolkit_config.AS_VOLUME_MOUNTS: defaults["nvidia_container_toolkit_accept_volume_mounts"],
    } == _toolkit_config.SECURE


def test_strategy_problems_name_the_nodes_and_the_setting():
    nodes = {"a": _toolkit_config.SECURE, "b": {_toolkit_config.AS_VOLUME_MOUNTS: False}}
    assert _toolkit_config.strategy_problems("volume-mounts", {"a": _toolkit_config.SECURE}) == []
    (line,) = _toolkit_config.strategy_problems("volume-mounts", nodes)
    assert "which b would not have" in line and "nvidia_container_toolkit_accept_volume_mounts" \
        in line
    (line,) = _toolkit_config.strategy_problems("envvar", nodes)
    assert "which a would ignore" in line and "volume-mounts (recommended)" in line
    # NVIDIA's defaults (absent keys) take the variable and refuse mounts.
    assert _toolkit_config.strategy_problems("envvar", {"old": {}}) == []
    assert _toolkit_config.strategy_problems("envvar,volume-mounts", {"old": {}})


def test_filter_reads_each_gpu_hosts_settings_from_the_inventory(ansible_plugin):
    toolkit = ansible_plugin("filter/nvidia_container_toolkit.py")
    plugin = ansible_plugin("filter/nvidia_device_plugin.py")
    hostvars = {
        "gpu-a": {"gpu_preflight_has_gpu": True},  # the role's defaults
        "gpu-b": {"gpu_preflight_has_gpu": True,
                  "nvidia_container_toolkit_accept_volume_mounts": "false"},
        "cpu": {"gpu_preflight_has_gpu": False,
                "nvidia_container_toolkit_accept_volume_mounts": False},
    }
    (line,) = plugin.gpuprov_device_list_problems("volume-mounts", list(hostvars), hostvars)
    assert "which gpu-b would not have" in line
    merged = toolkit.gpuprov_toolkit_config(PACKAGED, _toolkit_config.SECURE)
    assert merged["changed"]


def test_each_gpu_node_gets_the_plugin_config_of_its_runtime_mode(ansible_plugin):
    """gpuprov_runtime_modes: the toolkit stage's mode where it ran in this play, else the
    same decision from the inventory and the runtime the preflight's probe found; CPU hosts
    get none; a CDI node's toolkit settings do not gate the legacy strategy."""
    plugin = ansible_plugin("filter/nvidia_device_plugin.py")

    def probe(containerd_version: str) -> dict:
        return {"packages": {"runtime": [{"name": "containerd", "version": containerd_version,
                                          "state": "installed"}]}}

    hostvars = {
        "applied": {"gpu_preflight_has_gpu": True, "nvidia_container_toolkit_mode_applied": "cdi"},
        "old": {"gpu_preflight_has_gpu": True, "gpu_preflight_probe": probe("1.6.20~ds1-1")},
        "new": {"gpu_preflight_has_gpu": True, "gpu_preflight_probe": probe("2.1.9~ds1-1"),
                "gpu_node_labels_node_name": "new.k8s"},
        "pinned": {"gpu_preflight_has_gpu": True, "gpu_preflight_probe": probe("2.1.9~ds1-1"),
                   "nvidia_container_toolkit_mode": "legacy"},
        "cpu": {"gpu_preflight_has_gpu": False},
    }
    assert plugin.gpuprov_runtime_modes(list(hostvars), hostvars) == {
        "applied": "cdi", "old": "legacy", "new.k8s": "cdi", "pinned": "legacy"}
    # volume-mounts needs the toolkit to accept mounts, on legacy nodes only.
    refusing = {"nvidia_container_toolkit_accept_volume_mounts": False}
    for host in hostvars:
        hostvars[host] = {**hostvars[host], **refusing}
    lines = plugin.gpuprov_device_list_problems("volume-mounts", list(hostvars), hostvars)
    assert len(lines) == 1 and "old" in lines[0] and "pinned" in lines[0]
    assert "applied" not in lines[0] and "new" not in lines[0]
