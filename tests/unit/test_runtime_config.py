"""NVIDIA's runtime merged into containerd / Docker configs (gpuprov.stages._runtime_config), judged
by the probe's own reading of the result (gpuprov.node.probe.runtime: containerd's import rules)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import tomlkit
import tomllib
from ansible.errors import AnsibleFilterError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuprov.node.probe import runtime as probe_runtime
from gpuprov.node.probe import toml_subset
from gpuprov.node.probe.fs import Root
from gpuprov.stages import _runtime_config as rc

MAIN = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
CRI = "io.containerd.grpc.v1.cri"
BINARY = "/usr/bin/nvidia-container-runtime"

# Debian 12's containerd package installs this config.toml (1.6.20~ds1-1+deb12u3).
DEBIAN_STOCK = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""

# A kubeadm-style node: comments, a sandbox image, a mirror, runc with systemd cgroups.
ADMIN = """# The admin's containerd config; this comment must survive.
version = 2
oom_score = -999

[grpc]
  max_recv_message_size = 16777216

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.example.internal/pause:3.9"  # pinned
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      snapshotter = "overlayfs"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
      endpoint = ["https://mirror.example.internal"]
"""

REGISTRY_DROP_IN = """version = 2
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
"""


def effective(files: dict[str, str], major: int | None = None) -> dict:
    """What containerd loads from these files (the probe's reading of its rules)."""
    config, _, _, missing = rc._effective(MAIN, files, major)
    assert not missing
    return config


def node_root(tmp_path: Path, files: dict[str, str]) -> Root:
    for path, text in files.items():
        target = tmp_path / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    binary = tmp_path / BINARY.lstrip("/")
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    return Root(str(tmp_path))


def apply(result: dict, others: dict[str, str] | None = None) -> dict[str, str]:
    return {**(others or {}), MAIN: result["main"], DROP_IN: result["drop_in"]}


# -- containerd: fixtures ---------------------------------------------------------------------

def test_debian_stock_config_keeps_its_cni_dirs(tmp_path):
    """The gotcha, on Debian's own file: a drop-in naming only the nvidia runtime would drop
    the CRI plugin's cni table under containerd 1.6. The drop-in carries it."""
    result = rc.containerd_nvidia(DEBIAN_STOCK, {}, set_default=True, containerd_major=1)
    assert result["merge"] == probe_runtime.MERGE_REPLACE and result["plugin"] == CRI
    assert result["main_changed"] is True
    assert tomllib.loads(result["main"])["imports"] == [DROP_IN]
    drop_in = tomllib.loads(result["drop_in"])
    assert drop_in["version"] == 2
    assert drop_in["plugins"][CRI]["cni"] == {
        "bin_dir": "/usr/lib/cni", "conf_dir": "/etc/cni/net.d"
    }
    loaded = effective(apply(result))
    assert loaded["plugins"][CRI]["cni"]["bin_dir"] == "/usr/lib/cni"
    assert loaded["plugins"]["io.containerd.internal.v1.opt"] == {"path": "/var/lib/containerd/opt"}
    # What the probe (gpu_preflight, gpuprov verify, the lab's device plugin) reads on the node.
    doc = probe_runtime.collect_containerd(node_root(tmp_path, apply(result)))
    assert doc["nvidia_runtime"] is True and doc["default_is_nvidia"] is True
    assert [f["path"] for f in doc["files"]] == [MAIN, DROP_IN]


def test_a_config_relying_on_the_built_in_runc_keeps_it(tmp_path):
    """Debian's file names no runtime, so containerd runs its built-in runc. containerd 1.x
    keeps only the runtimes a config names once it names any (the drop-in names nvidia): the
    drop-in names runc too, as containerd has it built in (checked against the real binaries
    in test_runtime_config_containerd.py)."""
    assert effective({MAIN: DEBIAN_STOCK})["plugins"][CRI]["containerd"] == {
        "default_runtime_name": "runc",
        "runtimes": {"runc": {"runtime_type": "io.containerd.runc.v2",
                              "sandbox_mode": "podsandbox"}},
    }
    result = rc.containerd_nvidia(DEBIAN_STOCK, {}, containerd_major=1)
    containerd = tomllib.loads(result["drop_in"])["plugins"][CRI]["containerd"]
    assert containerd["default_runtime_name"] == "runc"
    assert containerd["runtimes"]["runc"] == {
        "runtime_type": "io.containerd.runc.v2", "sandbox_mode": "podsandbox"
    }
    assert set(effective(apply(result))["plugins"][CRI]["containerd"]["runtimes"]) == {
        "runc", "nvidia"
    }
    # The same drop-in without runc: the model says runc is gone under 1.x, kept under 2.x.
    doc = tomllib.loads(result["drop_in"])
    del doc["plugins"][CRI]["containerd"]["runtimes"]["runc"]
    files = {MAIN: result["main"], DROP_IN: tomlkit.dumps(doc)}
    assert set(effective(files, 1)["plugins"][CRI]["containerd"]["runtimes"]) == {"nvidia"}
    assert set(effective(files, 2)["plugins"][CRI]["containerd"]["runtimes"]) == {
        "runc", "nvidia"
    }
    doc = probe_runtime.collect_containerd(node_root(tmp_path, apply(result)))
    assert set(doc["runtimes"]) == {"runc", "nvidia"} and doc["default_runtime_name"] == "runc"


@pytest.mark.parametrize(("main", "major", "why"), [
    ('[plugins.cri.containerd]\nsnapshotter = "overlayfs"\n', 2, "version 1 config"),
    ('version = 1\n', 2, "version 1 config"),
    ('version = 3\n[plugins."io.containerd.cri.v1.images"]\nsnapshotter = "overlayfs"\n', 1,
     "version 3 config"),
])
def test_a_version_the_containerd_does_not_read_is_refused(main, major, why):
    """containerd 2.x moves a version 1 file's CRI keys to the old plugin name and ignores
    them; 1.7 refuses version 3 and 1.6 ignores its CRI plugin ids: an NVIDIA runtime written
    there would never take effect. One line, saying what to do."""
    with pytest.raises(rc.RuntimeConfigError) as refused:
        rc.containerd_nvidia(main, {}, containerd_major=major)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{MAIN} is a {why}")
    if major == 2:
        assert "containerd config migrate > new.toml" in message
    # Without the binary's version the merge assumes the containerd that reads that version.
    assert rc.containerd_nvidia(main, {})["main_changed"] is True


def test_a_naive_drop_in_would_lose_the_settings():
    """Why the drop-in copies the table: the rule the merge is written against."""
    naive = (f'version = 2\n[plugins."{CRI}".containerd.runtimes.nvidia.options]\n'
             f'BinaryName = "{BINARY}"\n')
    main = DEBIAN_STOCK.replace("version = 2\n", f'version = 2\nimports = ["{DROP_IN}"]\n')
    loaded = effective({MAIN: main, DROP_IN: naive})
    assert "cni" not in loaded["plugins"][CRI]
    assert "cni" in effective({MAIN: main, DROP_IN: naive}, major=2)["plugins"][CRI]


@pytest.mark.parametrize("set_default", [True, False])
def test_admin_config_survives_and_the_probe_sees_nvidia(tmp_path, set_default):
    result = rc.containerd_nvidia(ADMIN, {}, set_default=set_default)
    before = tomllib.loads(ADMIN)
    loaded = effective(apply(result))
    cri = loaded["plugins"][CRI]
    assert cri["sandbox_image"] == "registry.example.internal/pause:3.9"
    assert cri["registry"] == before["plugins"][CRI]["registry"]
    runc = before["plugins"][CRI]["containerd"]["runtimes"]["runc"]
    assert cri["containerd"]["runtimes"]["runc"] == runc
    assert cri["containerd"]["snapshotter"] == "overlayfs"
    assert loaded["oom_score"] == -999 and loaded["grpc"] == {"max_recv_message_size": 16777216}
    # The nvidia runtime inherits runc's options (kubelet's systemd cgroup driver).
    assert cri["containerd"]["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": BINARY},
    }
    assert cri["containerd"]["default_runtime_name"] == ("nvidia" if set_default else "runc")
    # config.toml: only the import added; the admin's comments and layout are kept.
    assert result["main"].startswith(
        "# The admin's containerd config; this comment must survive.\n"
    )
    assert 'sandbox_image = "registry.example.internal/pause:3.9"  # pinned' in result["main"]
    assert result["main"].replace(f'imports = ["{DROP_IN}"]\n', "") == ADMIN
    doc = probe_runtime.collect_containerd(node_root(tmp_path, apply(result)))
    assert doc["nvidia_runtime"] is True and doc["default_is_nvidia"] is set_default
    assert set(doc["runtimes"]) == {"runc", "nvidia"}


def test_second_run_changes_nothing():
    first = rc.containerd_nvidia(ADMIN, {}, set_default=True)
    second = rc.containerd_nvidia(first["main"], {DROP_IN: first["drop_in"]}, set_default=True)
    assert second["main_changed"] is False and second["main"] == first["main"]
    assert second["drop_in"] == first["drop_in"]


def test_switching_default_off_restores_the_admins_default():
    on = rc.containerd_nvidia(ADMIN, {}, set_default=True)
    off = rc.containerd_nvidia(on["main"], {DROP_IN: on["drop_in"]}, set_default=False)
    assert effective(apply(off))["plugins"][CRI]["containerd"]["default_runtime_name"] == "runc"


def test_existing_glob_import_and_a_registry_drop_in():
    """containerd 1.6 lets 10-registry.toml's CRI table replace config.toml's: the role keeps
    exactly what is in effect (config_path), adds no import (the glob covers the drop-in)."""
    main = ADMIN.replace("oom_score = -999\n", 'oom_score = -999\nimports = ["conf.d/*.toml"]\n')
    others = {"/etc/containerd/conf.d/10-registry.toml": REGISTRY_DROP_IN}
    before = effective({**others, MAIN: main})
    result = rc.containerd_nvidia(main, others)
    assert result["main_changed"] is False and result["main"] == main
    after = effective(apply(result, others))
    assert after["plugins"][CRI]["registry"] == before["plugins"][CRI]["registry"] == {
        "config_path": "/etc/containerd/certs.d"
    }
    assert "sandbox_image" not in after["plugins"][CRI]  # was not in effect before either
    assert "nvidia" in after["plugins"][CRI]["containerd"]["runtimes"]


def test_a_later_drop_in_that_would_replace_the_table_is_refused():
    main = ADMIN.replace("oom_score = -999\n", 'oom_score = -999\nimports = ["conf.d/*.toml"]\n')
    others = {"/etc/containerd/conf.d/zz-late.toml": REGISTRY_DROP_IN}
    with pytest.raises(rc.RuntimeConfigError, match="zz-late|loads after"):
        rc.containerd_nvidia(main, others)
    # containerd 2.x merges key by key: the same layout is fine there.
    result = rc.containerd_nvidia(main, others, containerd_major=2)
    assert result["merge"] == probe_runtime.MERGE_DEEP


def test_missing_explicit_import_is_refused():
    main = ADMIN.replace("oom_score = -999\n", 'imports = ["/etc/containerd/gone.toml"]\n')
    with pytest.raises(rc.RuntimeConfigError, match="gone.toml"):
        rc.containerd_nvidia(main, {})


def test_invalid_toml_is_refused():
    with pytest.raises(rc.RuntimeConfigError, match="not valid TOML"):
        rc.containerd_nvidia("version = \n", {})


def test_no_config_file_gets_a_minimal_one():
    result = rc.containerd_nvidia(None, {}, containerd_major=1)
    assert tomllib.loads(result["main"]) == {"version": 2, "imports": [DROP_IN]}
    v3 = rc.containerd_nvidia(None, {}, containerd_major=2)
    assert v3["plugin"] == "io.containerd.cri.v1.runtime" and v3["version"] == 3
    v3_cri = tomllib.loads(v3["drop_in"])["plugins"][v3["plugin"]]
    assert "nvidia" in v3_cri["containerd"]["runtimes"]


def test_version_1_config_uses_the_short_plugin_id():
    main = '[plugins.cri.containerd]\nsnapshotter = "overlayfs"\n'
    result = rc.containerd_nvidia(main, {})
    assert result["plugin"] == "cri" and "version" not in tomllib.loads(result["drop_in"])
    assert effective(apply(result))["plugins"]["cri"]["containerd"]["snapshotter"] == "overlayfs"


def test_version_3_config_merges_key_by_key(tmp_path):
    main = ('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n'
            'default_runtime_name = "runc"\n'
            '[plugins."io.containerd.cri.v1.images"]\nsnapshotter = "overlayfs"\n')
    result = rc.containerd_nvidia(main, {}, set_default=True)
    assert result["merge"] == probe_runtime.MERGE_DEEP
    doc = probe_runtime.collect_containerd(node_root(tmp_path, apply(result)))
    assert doc["version"] == 3 and doc["default_is_nvidia"] is True


def test_an_existing_nvidia_runtime_keeps_its_settings():
    main = ADMIN + (
        f'    [plugins."{CRI}".containerd.runtimes.nvidia]\n'
        '      privileged_without_host_devices = true\n'
        f'      [plugins."{CRI}".containerd.runtimes.nvidia.options]\n'
        '        BinaryName = "/opt/old/nvidia-container-runtime"\n'
    )
    loaded = effective(apply(rc.containerd_nvidia(main, {})))
    runtimes = loaded["plugins"][CRI]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["privileged_without_host_devices"] is True
    assert runtimes["nvidia"]["options"]["BinaryName"] == BINARY


def test_drop_in_is_readable_by_the_probes_fallback_parser():
    """Nodes on Python < 3.11 read the drop-in with gpuprov.node.probe.toml_subset."""
    result = rc.containerd_nvidia(ADMIN, {}, set_default=True)
    assert toml_subset._parse_subset(result["drop_in"]) == tomllib.loads(result["drop_in"])


def test_import_dirs_for_the_role_to_read():
    main = 'imports = ["conf.d/*.toml", "/opt/extra.toml"]\n'
    assert rc.containerd_import_dirs(main) == [
        {"path": "/etc/containerd/conf.d", "pattern": "*.toml"},
        {"path": "/opt", "pattern": "extra.toml"},
    ]
    assert rc.containerd_import_dirs(None) == []


# -- containerd: property -------------------------------------------------------------------

KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6).filter(
    lambda k: k not in ("imports", "version", "plugins", "containerd", "runtimes")
)
# Non-empty values: containerd (mergo) never lets an empty later value override.
SCALARS = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/.:-", min_size=1, max_size=12),
    st.integers(min_value=1, max_value=10**6),
    st.just(True),
    st.lists(st.text(alphabet="abcdef", min_size=1, max_size=4), min_size=1, max_size=3),
)
TABLES = st.recursive(
    st.dictionaries(KEYS, SCALARS, max_size=4),
    lambda children: st.dictionaries(KEYS, st.one_of(SCALARS, children), max_size=4),
    max_leaves=12,
)
RUNTIME = st.fixed_dictionaries(
    {"runtime_type": st.just("io.containerd.runc.v2")},
    optional={"options": st.dictionaries(KEYS, SCALARS, max_size=3)},
)
CRI_TABLE = st.builds(
    lambda extra, runtimes, default: {
        **extra,
        "containerd": {
            "runtimes": runtimes,
            **({"default_runtime_name": default} if default else {}),
        },
    },
    TABLES,
    st.dictionaries(st.sampled_from(["runc", "kata", "crun", "nvidia"]), RUNTIME, max_size=3),
    st.sampled_from([None, "runc", "crun"]),
)
CONFIGS = st.fixed_dictionaries(
    {
        "top": st.dictionaries(KEYS, SCALARS, max_size=3),
        "plugins": st.dictionaries(
            st.sampled_from(["io.containerd.internal.v1.opt", "io.containerd.gc.v1.scheduler"]),
            TABLES,
            max_size=2,
        ),
        "cri": st.one_of(st.none(), CRI_TABLE),
        # Drop-ins of the admin's under conf.d, with CRI tables of their own or none.
        "drop_ins": st.lists(
            st.fixed_dictionaries({"cri": st.one_of(st.none(), TABLES), "plugins": TABLES}),
            max_size=2,
        ),
        "glob_import": st.booleans(),
    }
)


def _leaves(config: dict, prefix: tuple = ()) -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


def _render(config: dict) -> str:
    main: dict = {"version": 2, **config["top"]}
    if config["glob_import"]:
        main["imports"] = ["/etc/containerd/conf.d/*.toml"]
    plugins = dict(config["plugins"])
    if config["cri"] is not None:
        plugins[CRI] = config["cri"]
    if plugins:
        main["plugins"] = plugins
    return tomlkit.dumps(main)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, set_default=st.booleans(), major=st.sampled_from([None, 1, 2]))
def test_every_setting_in_effect_survives(config, set_default, major):
    """For generated configs (main file, other plugins, admin drop-ins under a glob import):
    the effective config after the role = the one before, key for key, plus the nvidia
    runtime (and the default runtime name when asked), under containerd 1.x and 2.x rules."""
    files = {MAIN: _render(config)}
    if config["glob_import"]:
        for i, drop_in in enumerate(config["drop_ins"]):
            doc: dict = {
                "version": 2, "plugins": {"io.containerd.gc.v1.scheduler": drop_in["plugins"]}
            }
            if drop_in["cri"] is not None:
                doc["plugins"][CRI] = drop_in["cri"]
            files[f"/etc/containerd/conf.d/{10 + i}-admin.toml"] = tomlkit.dumps(doc)
    others = {p: t for p, t in files.items() if p != MAIN}
    before = effective(files, major)
    result = rc.containerd_nvidia(
        files[MAIN], others, set_default=set_default, containerd_major=major
    )
    after = effective(apply(result, others), major)

    changed_keys = {("plugins", CRI, "containerd", "runtimes", "nvidia")}
    if set_default:
        changed_keys.add(("plugins", CRI, "containerd", "default_runtime_name"))
    after_leaves = _leaves(after)
    for path, value in _leaves(before).items():
        if path[0] == "imports" or any(path[: len(k)] == k for k in changed_keys):
            continue
        if value == {}:  # an empty table stays a table (the nvidia runtime may fill it)
            node = after
            for key in path:
                node = node[key]
            assert isinstance(node, dict), path
            continue
        assert after_leaves.get(path) == value, path
    cri = after["plugins"][CRI]["containerd"]
    assert cri["runtimes"]["nvidia"]["options"]["BinaryName"] == BINARY
    assert cri["runtimes"]["nvidia"]["runtime_type"] == "io.containerd.runc.v2"
    if set_default:
        assert cri["default_runtime_name"] == "nvidia"
    else:
        containerd = before.get("plugins", {}).get(CRI, {}).get("containerd", {})
        default = containerd.get("default_runtime_name")
        assert cri.get("default_runtime_name") == default
    # Nothing in the main file but the import changed.
    main_after = tomllib.loads(result["main"])
    main_after.pop("imports", None)
    main_before = tomllib.loads(files[MAIN])
    main_before.pop("imports", None)
    assert main_after == main_before
    # Idempotent: the second run writes the same files.
    again = rc.containerd_nvidia(result["main"], {**others, DROP_IN: result["drop_in"]},
                                 set_default=set_default, containerd_major=major)
    assert again["drop_in"] == result["drop_in"] and again["main_changed"] is False


# -- Docker ---------------------------------------------------------------------------------

DAEMON = {
    "log-driver": "json-file",
    "log-opts": {"max-size": "10m"},
    "registry-mirrors": ["https://mirror.example.internal"],
    "runtimes": {"kata": {"path": "/usr/bin/kata-runtime"}},
}


def test_docker_keeps_every_key_and_the_probe_sees_nvidia(tmp_path):
    result = rc.docker_nvidia(json.dumps(DAEMON), set_default=True)
    config = json.loads(result["text"])
    assert {k: v for k, v in config.items() if k not in ("runtimes", "default-runtime")} == {
        k: v for k, v in DAEMON.items() if k != "runtimes"
    }
    assert config["runtimes"] == {
        "kata": {"path": "/usr/bin/kata-runtime"},
        "nvidia": {"path": BINARY, "args": []},
    }
    assert config["default-runtime"] == "nvidia"
    (tmp_path / "etc/docker").mkdir(parents=True)
    (tmp_path / "etc/docker/daemon.json").write_text(result["text"])
    doc = probe_runtime.collect_docker(Root(str(tmp_path)))
    assert doc["nvidia_runtime"] is True and doc["default_is_nvidia"] is True


def test_docker_unchanged_config_is_returned_byte_for_byte():
    text = json.dumps({**DAEMON, "runtimes": {"nvidia": {"path": BINARY, "args": []}}}, indent=8)
    result = rc.docker_nvidia(text)
    assert result == {"text": text, "changed": False, "config": json.loads(text)}


def test_docker_default_off_takes_back_our_default_only():
    on = json.loads(rc.docker_nvidia("{}", set_default=True)["text"])
    off = json.loads(rc.docker_nvidia(json.dumps(on), set_default=False)["text"])
    assert "default-runtime" not in off
    kata = {**DAEMON, "default-runtime": "kata"}
    assert json.loads(rc.docker_nvidia(json.dumps(kata))["text"])["default-runtime"] == "kata"


def test_docker_missing_or_empty_file():
    assert json.loads(rc.docker_nvidia(None)["text"]) == {
        "runtimes": {"nvidia": {"path": BINARY, "args": []}}
    }
    assert rc.docker_nvidia("")["changed"] is True


@pytest.mark.parametrize("text", ["{", "[]", '{"runtimes": 3}'])
def test_docker_invalid_configs_are_refused(text):
    with pytest.raises(rc.RuntimeConfigError):
        rc.docker_nvidia(text)


JSON_VALUES = st.recursive(
    st.one_of(st.text(max_size=8), st.integers(), st.booleans(), st.none()),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=6), children, max_size=3)),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(config=st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=6),
       runtimes=st.dictionaries(st.text(min_size=1, max_size=6),
                                st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=2),
                                max_size=3),
       set_default=st.booleans())
def test_docker_property_every_key_survives(config, runtimes, set_default):
    original = {**config, "runtimes": runtimes}
    original.pop("default-runtime", None)
    result = json.loads(rc.docker_nvidia(json.dumps(original), set_default=set_default)["text"])
    for key, value in original.items():
        if key != "runtimes":
            assert result[key] == value
    for name, spec in runtimes.items():
        if name != "nvidia":
            assert result["runtimes"][name] == spec
        else:
            assert {k: v for k, v in spec.items() if k not in ("path", "args")}.items() <= result[
                "runtimes"
            ]["nvidia"].items()
    assert result["runtimes"]["nvidia"]["path"] == BINARY
    assert (result.get("default-runtime") == "nvidia") is set_default
    assert copy.deepcopy(result) == json.loads(rc.docker_nvidia(json.dumps(result),
                                                                set_default=set_default)["text"])


# -- the filter plugin ----------------------------------------------------------------------

def _filters():
    path = Path(__file__).resolve().parents[2] / "plugins/filter/nvidia_container_toolkit.py"
    spec = importlib.util.spec_from_file_location("gpuprov_toolkit_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("version", "major"), [
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", 1),
    ("containerd containerd.io v2.0.4 1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20", 2),
    ("1.7.27", 1),
    ("", None),
    (None, None),
])
def test_filter_reads_the_containerd_major_version(version, major):
    assert _filters()._major(version) == major


def test_filter_turns_refusals_into_filter_errors():
    module = _filters()
    with pytest.raises(AnsibleFilterError, match="not valid TOML"):
        module.gpuprov_containerd_nvidia("version = \n", {})
    with pytest.raises(AnsibleFilterError, match="not valid JSON"):
        module.gpuprov_docker_nvidia("{")
    out = module.gpuprov_containerd_nvidia(DEBIAN_STOCK, {}, set_default=True,
                                           containerd_version="1.6.20~ds1")
    assert out["merge"] == probe_runtime.MERGE_REPLACE
    assert module.FilterModule().filters()["gpuprov_containerd_import_dirs"](out["main"]) == [
        {"path": "/etc/containerd/conf.d", "pattern": "99-nvidia.toml"}
    ]
