"""containerd 2.3's config version 4: read, merged and written as containerd 2.3 does
(gpuprov.stages._runtime_config, gpuprov.node.probe.runtime), and a version gpuprov does not
know refused in one line.

The inputs are containerd's own, tests/fixtures/runtime/containerd-v4/ (each names its
source and the commit it was read at, through the stored public index): the version 4 example
of docs/man/containerd-config.toml.5.md (the same as at v2.3.1) as the main config.toml, which
imports /etc/containerd/runtime_*.toml and ./debug.toml, and the full CRI config of
docs/cri/config.md (version 3: a drop-in of a lower version than its root is migrated by 2.3,
LoadConfig) as /etc/containerd/runtime_cri.toml. The index holds docs/cri/config.md only at a
commit older than v2.3.1, whose example lacks 2.1-2.3's keys (bin_dirs, cgroup_writable, ...):
nothing here reads those keys.

NOT run: a real containerd 2.3 reading the result. No Debian suite ships containerd 2.2 or
2.3 (unstable has 2.1.9, which refuses version 4: "expected containerd config version equal
to or less than `3`"), and nothing else can be installed here; tests/unit/
test_runtime_config_containerd.py judges versions 1-3 with real binaries. What containerd 2.3
does with these files is read from its code (cmd/containerd/server/config/config.go at v2.3.1:
the `migrations` table, serviceMigrate, LoadConfig's drop-in version rule).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from gpuprov.node.probe import runtime as probe_runtime
from gpuprov.node.probe import toml_subset
from gpuprov.node.probe.fs import Root
from gpuprov.stages import _runtime_config as rc
from gpuprov.verify.checks import runtime as runtime_checks
from gpuprov.verify.facts import NodeFacts
from gpuprov.verify.inventory import Node

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runtime" / "containerd-v4"
MAIN = (FIXTURES / "containerd-man-v4.toml").read_text()
CRI = (FIXTURES / "containerd-cri-v3.toml").read_text()
FILES = {"/etc/containerd/runtime_cri.toml": CRI, "/etc/containerd/debug.toml": ""}
PLUGIN = "io.containerd.cri.v1.runtime"
SERVER_PLUGINS = ("io.containerd.server.v1.grpc", "io.containerd.server.v1.ttrpc",
                  "io.containerd.server.v1.debug")


def test_the_fixtures_name_their_source_and_are_what_they_say():
    for path in FIXTURES.glob("*.toml"):
        head = path.read_text().splitlines()[:4]
        assert head[0] == "# Source: https://github.com/containerd/containerd", path
        assert re.fullmatch(r"# Commit: [0-9a-f]{40}, read through the stored public index",
                            head[2]), path
    assert tomllib.loads(MAIN)["version"] == 4 and tomllib.loads(CRI)["version"] == 3


def test_the_versions_gpuprov_reads_are_one_list():
    assert set(rc.CRI_PLUGIN_IDS) == set(probe_runtime.CONTAINERD_CONFIG_VERSIONS) == {1, 2, 3, 4}
    # Version 4 keeps version 3's CRI plugin ids (its migration moves server settings only).
    assert rc.CRI_PLUGIN_IDS[4] == rc.CRI_PLUGIN_IDS[3] == PLUGIN


def test_a_version_4_config_is_merged_as_containerd_2_3_reads_it():
    result = rc.containerd_nvidia(MAIN, FILES, containerd_major=2)
    assert (result["version"], result["plugin"], result["merge"]) == (4, PLUGIN,
                                                                       probe_runtime.MERGE_DEEP)
    drop_in = tomllib.loads(result["drop_in"])
    # As version 4, not higher than its root (2.3 refuses a drop-in of a higher version).
    assert drop_in["version"] == 4 and set(drop_in["plugins"]) == {PLUGIN}
    runtimes = drop_in["plugins"][PLUGIN]["containerd"]["runtimes"]
    admin_runc = tomllib.loads(CRI)["plugins"][PLUGIN]["containerd"]["runtimes"]["runc"]
    assert runtimes["runc"] == admin_runc  # the admin's runc, as containerd's docs set it
    assert runtimes["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    # The runc options (SystemdCgroup among them) are the nvidia runtime's too.
    assert {k: v for k, v in runtimes["nvidia"]["options"].items() if k != "BinaryName"} == \
        {k: v for k, v in admin_runc.get("options", {}).items() if k != "BinaryName"}
    # The main file gains only the drop-in in its imports; comments and layout kept.
    assert result["main_changed"]
    assert result["main"].replace(', "/etc/containerd/conf.d/99-nvidia.toml"', "") == MAIN
    main = tomllib.loads(result["main"])
    assert main["imports"] == ["/etc/containerd/runtime_*.toml", "./debug.toml",
                               rc.NVIDIA_DROP_IN]
    # Version 4's server plugins stay where the admin put them, untouched.
    effective = result["effective"]["plugins"]
    for plugin in SERVER_PLUGINS:
        assert effective[plugin] == tomllib.loads(MAIN)["plugins"][plugin]
    assert effective[PLUGIN]["containerd"]["runtimes"]["nvidia"] == runtimes["nvidia"]


def test_a_second_run_changes_nothing():
    first = rc.containerd_nvidia(MAIN, FILES, containerd_major=2)
    again = rc.containerd_nvidia(first["main"], {**FILES, rc.NVIDIA_DROP_IN: first["drop_in"]},
                                 containerd_major=2)
    assert not again["main_changed"] and again["drop_in"] == first["drop_in"]


def test_cdi_mode_on_version_4():
    result = rc.containerd_nvidia(MAIN, FILES, containerd_major=2, cdi=True)
    cri = tomllib.loads(result["drop_in"])["plugins"][PLUGIN]
    assert cri["enable_cdi"] is True
    assert "/var/run/cdi" in cri["cdi_spec_dirs"]


def test_version_4_on_containerd_1_is_refused():
    with pytest.raises(rc.RuntimeConfigError, match=r"is a version 4 config, which containerd "
                                                    r"1\.x does not read"):
        rc.containerd_nvidia(MAIN, FILES, containerd_major=1)


@pytest.mark.parametrize(("version", "words"), [
    ("5", "/etc/containerd/config.toml: config version 5 is not one gpuprov reads (it reads "
          "versions 1 and 2 (containerd 1.x), 2 and 3 (containerd 2.0-2.2), 2, 3 and 4 "
          "(containerd 2.3)); write it in one of those versions (or update gpuprov), then run "
          "the role again"),
    ("'4'", "version = '4' is not a containerd config version"),
    ("true", "version = True is not a containerd config version"),
])
def test_an_unknown_version_is_refused_in_one_line_never_read_as_another(version, words):
    text = MAIN.replace("version = 4", f"version = {version}", 1)
    with pytest.raises(rc.RuntimeConfigError) as caught:
        rc.containerd_nvidia(text, FILES, containerd_major=2)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_version_0_is_version_1_as_containerd_reads_it():
    # containerd's migrations table: "Version 0 is not defined, treated at version 1".
    with pytest.raises(rc.RuntimeConfigError, match="is a version 1 config"):
        rc.containerd_nvidia("version = 0\n", {}, containerd_major=2)


# -- the probe's reading of it -----------------------------------------------------------------

@pytest.fixture(params=["tomllib", "subset"])
def toml_parser(request, monkeypatch):
    """As the probe runs with tomllib and, before Python 3.11, with its own subset parser."""
    if request.param == "subset":
        monkeypatch.setattr(toml_subset, "tomllib", None)
    return request.param


def _node_root(tmp_path: Path, files: dict[str, str]) -> Root:
    for path, text in files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return Root(str(tmp_path))


def test_the_probe_reads_the_merged_version_4_config(tmp_path, toml_parser):
    result = rc.containerd_nvidia(MAIN, FILES, containerd_major=2)
    root = _node_root(tmp_path, {**FILES, rc.CONTAINERD_CONFIG: result["main"],
                                 rc.NVIDIA_DROP_IN: result["drop_in"]})
    doc = probe_runtime.collect_containerd(root)
    assert doc["version"] == 4 and doc["version_error"] is None
    assert doc["import_merge"] == probe_runtime.MERGE_DEEP
    assert doc["nvidia_runtime"] is True and {"runc", "nvidia"} <= set(doc["runtimes"])
    assert [f["path"] for f in doc["files"]] == [rc.CONTAINERD_CONFIG,
                                                 "/etc/containerd/runtime_cri.toml",
                                                 "/etc/containerd/debug.toml",
                                                 rc.NVIDIA_DROP_IN]


def test_the_probe_does_not_read_an_unknown_version_as_another(tmp_path, toml_parser):
    result = rc.containerd_nvidia(MAIN, FILES, containerd_major=2)
    main = result["main"].replace("version = 4", "version = 5", 1)
    root = _node_root(tmp_path, {**FILES, rc.CONTAINERD_CONFIG: main,
                                 rc.NVIDIA_DROP_IN: result["drop_in"]})
    doc = probe_runtime.collect_containerd(root)
    assert doc["version_error"] == ("/etc/containerd/config.toml: config version 5 is not one "
                                    "gpuprov reads (it reads versions 1 and 2 (containerd 1.x), "
                                    "2 and 3 (containerd 2.0-2.2), 2, 3 and 4 (containerd 2.3))")
    assert doc["runtimes"] == {} and doc["nvidia_runtime"] is False
    # verify says that line, not "no NVIDIA runtime".
    report = {"container_runtime": {"containerd": doc}, "packages": {}}
    node = Node(name="gpu-a", target=None, gpu_expected=True, toolkit_mode="legacy")
    verdict = runtime_checks.nvidia_runtime(NodeFacts(node, report))
    assert verdict.status == "problem" and verdict.message == doc["version_error"]
