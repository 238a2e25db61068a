"""The containerd merge (gpuprov.stages._runtime_config) judged by containerd itself.

Debian's containerd 1.6 (bookworm), 1.7 (trixie) and 2.x (unstable), fetched but not
installed by scripts/fetch-containerd.sh (`make containerd-bins`), read the merged files with
`containerd --config FILE config dump`, which needs no daemon. The inputs are configs nobody
here wrote: tests/fixtures/runtime/containerd/ (each names its source), each binary's own
`config default` and Debian's packaged config.toml. The Python model of containerd
(gpuprov.node.probe.runtime, which the merge checks itself with) must predict what they load.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomlkit
import tomllib

from gpuprov.lab.cache import CONTAINERD
from gpuprov.node.probe import runtime as probe_runtime
from gpuprov.stages import _runtime_config as rc

ROOT = Path(__file__).resolve().parents[2]
CACHE = CONTAINERD  # scripts/fetch-containerd.sh
FIXTURES = ROOT / "tests" / "fixtures" / "runtime" / "containerd"
SUITES = {"bookworm": 1, "trixie": 1, "unstable": 2}  # Debian suite -> containerd major
BINARY = "/usr/bin/nvidia-container-runtime"
RUNC_V2 = "io.containerd.runc.v2"
# Where a binary keeps the CRI runtimes after loading (1.x migrates version 1 files, 2.x
# version 1 and 2 files, to these).
CRI_LOADED = {1: "io.containerd.grpc.v1.cri", 2: "io.containerd.cri.v1.runtime"}
ZERO = ("", 0, False, [], {}, None)


@dataclass(frozen=True)
class Containerd:
    suite: str
    path: Path
    major: int
    version: str

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.path), *args], capture_output=True, text=True,
                              timeout=60, check=False)

    def dump(self, config: Path) -> dict | None:
        """What this containerd loads from `config`; None when it refuses the file."""
        out = self.run("--config", str(config), "config", "dump")
        return tomllib.loads(out.stdout) if out.returncode == 0 else None

    def default(self) -> str:
        out = self.run("config", "default")
        assert out.returncode == 0, out.stderr
        return out.stdout


def _binary(suite: str) -> Containerd:
    path = CACHE / suite / "usr" / "bin" / "containerd"
    if not path.exists():
        message = f"{path} missing: run `make containerd-bins` (scripts/fetch-containerd.sh)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True,
                             check=True).stdout.split()[2]
    return Containerd(suite, path, SUITES[suite], version)


@pytest.fixture(params=list(SUITES), scope="module")
def containerd(request) -> Containerd:
    return _binary(request.param)


def _nonzero(value: object) -> object:
    """Without zero values: `config dump` prints every field, a file names only some."""
    if isinstance(value, dict):
        out = {k: _nonzero(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ZERO}
    return value


def _leaves(value: object, prefix: tuple = ()) -> dict:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict = {}
    for key, item in value.items():
        out.update(_leaves(item, (*prefix, key)))
    return out


def _version(text: str) -> int:
    version = tomllib.loads(text).get("version")
    return version if version in (2, 3) else 1


def _cri(dump: dict, major: int) -> dict:
    return dump["plugins"][CRI_LOADED[major]]["containerd"]


def _merge_on_disk(tmp_path: Path, text: str | None, major: int, **kwargs) -> dict:
    """The merge for a config.toml at tmp_path (imports name the temporary paths), written."""
    main, drop_in = tmp_path / "config.toml", tmp_path / "conf.d" / "99-nvidia.toml"
    result = rc.containerd_nvidia(text, {}, main_path=str(main), drop_in_path=str(drop_in),
                                  containerd_major=major, **kwargs)
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    main.write_text(result["main"])
    drop_in.write_text(result["drop_in"])
    return result


def _original(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "before" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def outcome(containerd: Containerd, text: str, tmp_path: Path) -> str:
    """One config on one binary, as the table in the report names it; asserts on the way."""
    before = containerd.dump(_original(tmp_path, text))
    if before is None:
        # containerd 1.7 refuses version 3; nothing else here may be refused.
        assert containerd.major == 1 and _version(text) == 3
        return "rejected by containerd itself"
    main = tmp_path / "config.toml"
    try:
        result = _merge_on_disk(tmp_path, text, containerd.major)
    except rc.RuntimeConfigError as exc:
        # Version 1 on 2.x, version 3 on 1.6 (which loads it and ignores its CRI plugin ids).
        assert (containerd.major, _version(text)) in ((2, 1), (1, 3))
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{main} is a version ")
        assert not main.exists()
        return "refused with message"
    after = containerd.dump(tmp_path / "config.toml")
    assert after is not None, containerd.run("--config", str(tmp_path / "config.toml"),
                                             "config", "dump").stderr
    runtimes = _cri(after, containerd.major)["runtimes"]
    assert runtimes["runc"]["runtime_type"] == RUNC_V2
    assert runtimes["nvidia"]["runtime_type"] == RUNC_V2
    assert runtimes["nvidia"]["options"]["BinaryName"] == BINARY
    # The admin's settings survive: what containerd loads is what it loaded before, plus the
    # nvidia runtime (and the drop-in's import).
    del runtimes["nvidia"]
    for dump in (before, after):
        dump.pop("imports", None)
    assert _nonzero(after) == _nonzero(before)
    _model_predicts(result, containerd, _cri(containerd.dump(tmp_path / "config.toml"),
                                             containerd.major))
    return "merged, runc and nvidia present"


def _model_predicts(result: dict, containerd: Containerd, loaded: dict) -> None:
    """The merge's own model (result["effective"]) names the runtimes containerd loads, with
    the settings it loads them with."""
    model = result["effective"]["plugins"][result["plugin"]]["containerd"]
    assert model["default_runtime_name"] == loaded["default_runtime_name"]
    assert set(model["runtimes"]) == set(loaded["runtimes"])
    for name, entry in model["runtimes"].items():
        entry = dict(_nonzero(entry))
        if containerd.major >= 2 and result["version"] < 3 and "sandbox_mode" in entry:
            entry["sandboxer"] = entry.pop("sandbox_mode")  # 2.x's migration renames it
        real = _leaves(loaded["runtimes"][name])
        for path, value in _leaves(entry).items():
            if containerd.major == 1 and containerd.version.startswith("1.6") and path == (
                "sandbox_mode",
            ):
                continue  # 1.7's key, which 1.6 ignores
            assert real.get(path) == value, (name, path)


# -- third-party configs --------------------------------------------------------------------

THIRD_PARTY = sorted(p.name for p in FIXTURES.glob("*.toml"))


def test_every_fixture_names_its_source():
    assert len(THIRD_PARTY) >= 8
    for name in THIRD_PARTY:
        head = (FIXTURES / name).read_text().splitlines()[:4]
        assert head[0].startswith("# Source: https://github.com/"), name
        assert head[2].startswith("# Commit: ") and head[3].startswith("# Retrieved: "), name


@pytest.mark.parametrize("name", THIRD_PARTY)
def test_third_party_configs_on_real_containerd(containerd, name, tmp_path):
    text = (FIXTURES / name).read_text()
    expected = {
        (1, 3): "rejected by containerd itself" if containerd.suite != "bookworm"
        else "refused with message",
        (2, 1): "refused with message",
    }.get((containerd.major, _version(text)), "merged, runc and nvidia present")
    assert outcome(containerd, text, tmp_path) == expected


@pytest.mark.parametrize("source", list(SUITES))
def test_containerd_default_configs_on_real_containerd(containerd, source, tmp_path):
    """Each binary's `config default` (1.x: version 2, 2.x: version 3) on every binary."""
    text = _binary(source).default()
    expected = "merged, runc and nvidia present"
    if containerd.major == 1 and _version(text) == 3:
        expected = ("refused with message" if containerd.suite == "bookworm"
                    else "rejected by containerd itself")
    assert outcome(containerd, text, tmp_path) == expected


def test_debian_packaged_config_keeps_runc(containerd, tmp_path):
    """(a) Debian's own config.toml names no runtime: containerd's built-in runc is the only
    one. The drop-in's runtimes table would have dropped it on 1.6/1.7; it names runc too."""
    text = (CACHE / containerd.suite / "etc" / "containerd" / "config.toml").read_text()
    assert "runtimes" not in text
    assert outcome(containerd, text, tmp_path) == "merged, runc and nvidia present"
    drop_in = tomllib.loads((tmp_path / "conf.d" / "99-nvidia.toml").read_text())
    cri = drop_in["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert cri["default_runtime_name"] == "runc"
    assert cri["runtimes"]["runc"]["runtime_type"] == RUNC_V2


def test_a_drop_in_without_runc_loses_it_on_1x(containerd, tmp_path):
    """Why the drop-in names runc: the same drop-in minus runc, on the real binaries."""
    text = (CACHE / containerd.suite / "etc" / "containerd" / "config.toml").read_text()
    _merge_on_disk(tmp_path, text, containerd.major)
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    doc = tomlkit.parse(drop_in.read_text())
    del doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]
    drop_in.write_text(tomlkit.dumps(doc))
    runtimes = _cri(containerd.dump(tmp_path / "config.toml"), containerd.major)["runtimes"]
    assert ("runc" in runtimes) is (containerd.major >= 2)
    # The model says the same.
    config, _, _, _ = rc._effective(
        str(tmp_path / "config.toml"),
        {str(p): p.read_text() for p in tmp_path.rglob("*.toml") if "before" not in p.parts},
        containerd.major,
    )
    model = config["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]
    assert ("runc" in model) is (containerd.major >= 2)


@pytest.mark.parametrize("set_default", [True, False])
def test_no_config_file_and_set_default(containerd, tmp_path, set_default):
    result = _merge_on_disk(tmp_path, None, containerd.major, set_default=set_default)
    loaded = _cri(containerd.dump(tmp_path / "config.toml"), containerd.major)
    assert {"runc", "nvidia"} <= set(loaded["runtimes"])
    assert loaded["default_runtime_name"] == ("nvidia" if set_default else "runc")
    _model_predicts(result, containerd, loaded)


# -- (b) version 1 on containerd 2.x ----------------------------------------------------------

def test_version_1_on_2x_is_refused_because_2x_ignores_it(containerd, tmp_path):
    text = (FIXTURES / "kubernetes-the-hard-way-5c46222.toml").read_text()
    assert _version(text) == 1
    # What the merge wrote before it knew (the 1.x drop-in) on this binary:
    _merge_on_disk(tmp_path, text, 1)
    loaded = containerd.dump(tmp_path / "config.toml")
    runtimes = (loaded["plugins"].get(CRI_LOADED[containerd.major], {}).get("containerd", {})
                .get("runtimes", {}))
    assert ("nvidia" in runtimes) is (containerd.major == 1)
    if containerd.major == 1:
        return
    main = tmp_path / "refused.toml"
    main.write_text(text)
    with pytest.raises(rc.RuntimeConfigError) as refused:
        rc.containerd_nvidia(text, {}, main_path=str(main), containerd_major=containerd.major)
    message = str(refused.value)
    assert "\n" not in message and "version 1" in message
    assert "containerd config migrate > new.toml" in message
    assert main.read_text() == text
    # The migration the message describes works on this binary: rename, migrate, merge.
    renamed = "version = 2\n" + text.replace("plugins.cri", 'plugins."io.containerd.grpc.v1.cri"')
    main.write_text(renamed)
    migrated = containerd.run("--config", str(main), "config", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert tomllib.loads(migrated.stdout)["version"] == 3
    assert outcome(containerd, migrated.stdout, tmp_path / "migrated") == (
        "merged, runc and nvidia present"
    )


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_version_3_on_1x_never_takes_effect(suite, tmp_path):
    """Why the merge refuses version 3 on 1.x: 1.7 refuses the file, 1.6.20 loads it and
    ignores its CRI plugin ids (LAB-NOTES has both refusing; `config dump` says otherwise)."""
    containerd = _binary(suite)
    text = (FIXTURES / "eks-nodeadm-v3-410dbb3.toml").read_text()
    loaded = containerd.dump(_original(tmp_path, text))
    if containerd.version.startswith("1.6"):
        runtimes = _cri(loaded, 1)["runtimes"]
        assert runtimes["runc"].get("options", {}).get("BinaryName") != "/usr/sbin/runc"
        assert "io.containerd.cri.v1.runtime" not in loaded["plugins"]
    else:
        assert loaded is None
    with pytest.raises(rc.RuntimeConfigError, match="version 3 config"):
        rc.containerd_nvidia(text, {}, containerd_major=1)


def test_version_2_on_2x_lands_in_the_version_3_plugin(tmp_path):
    """The current rule for version 2 on 2.x: a version 2 drop-in, which 2.x migrates like the
    main file, so the runtimes end up under io.containerd.cri.v1.runtime."""
    containerd = _binary("unstable")
    text = (FIXTURES / "eks-nodeadm-21d670a.toml").read_text()
    result = _merge_on_disk(tmp_path, text, containerd.major)
    assert result["version"] == 2 and result["plugin"] == "io.containerd.grpc.v1.cri"
    loaded = containerd.dump(tmp_path / "config.toml")
    assert {"runc", "nvidia"} <= set(_cri(loaded, 2)["runtimes"])


# -- the model's built-ins are containerd's ----------------------------------------------------

def _tables(doc: dict) -> dict:
    return {k: _tables(v) for k, v in doc.items() if isinstance(v, dict)}


@pytest.mark.parametrize(("suite", "version"), [
    (suite, version) for suite, major in SUITES.items() for version in (2, 3)
    if version == 2 or major >= 2  # 1.x reads no version 3 config
])
def test_the_models_built_ins_are_containerds(suite, version, tmp_path):
    """containerd's built-in CRI defaults that a config's own tables drop (every table of
    `config default` present, no keys) are exactly the ones the model adds, and the model's
    built-in runc is containerd's."""
    containerd = _binary(suite)
    default = tomllib.loads(containerd.default())
    plugin_id = rc.CRI_PLUGIN_IDS[version]
    builtin = probe_runtime.CONTAINERD_CRI_BUILTIN[plugin_id]

    def dump(doc: dict) -> dict:
        path = tmp_path / "config.toml"
        path.write_text(tomlkit.dumps(doc))
        loaded = containerd.dump(path)
        assert loaded is not None
        return loaded

    plain = dump({"version": version})
    tables = _tables(default["plugins"]) if default["version"] == version else {
        plugin_id: {"containerd": {"runtimes": {"runc": {"options": {}}}}}
    }
    skeleton = dump({"version": version, "plugins": tables})
    kept = _leaves(skeleton)
    lost = {p: v for p, v in _leaves(plain).items() if kept.get(p) != v and v not in ZERO}
    cri = ("plugins", CRI_LOADED[containerd.major], "containerd")
    model = {(*cri, *path): value for path, value in _leaves(_nonzero(builtin)).items()}
    if containerd.major >= 2 and version < 3:
        model = {p[:-1] + ("sandboxer",) if p[-1] == "sandbox_mode" else p: v
                 for p, v in model.items()}
    assert lost.items() <= model.items()
    # 1.x is the generation that drops them; the merge's rule for it says so.
    assert bool(lost) is (containerd.major == 1)
    assert probe_runtime.containerd_merge_mode(version, containerd.major) == (
        probe_runtime.MERGE_REPLACE if containerd.major == 1 else probe_runtime.MERGE_DEEP
    )
    # A config that names the model's built-ins loads what containerd has built in.
    named = _cri(dump({"version": version, "plugins": {plugin_id: {"containerd": builtin}}}),
                 containerd.major)
    assert _nonzero(named) == _nonzero(_cri(plain, containerd.major))


# -- CDI mode (gpuprov/runtime_mode.py): containerd >= 1.7 -----------------------------------

@pytest.mark.parametrize("admin_dirs", [None, ["/etc/cdi"]])
def test_cdi_mode_enables_cdi_and_keeps_runc_the_default(containerd, admin_dirs, tmp_path):
    """On the real 1.7 and 2.x binaries: CDI on in the CRI plugin containerd loads, runc stays
    the default runtime (nvidia only by RuntimeClass), /var/run/cdi among the spec dirs (an
    admin's own list kept, gaining it)."""
    if containerd.version.startswith("1.6"):
        pytest.skip("containerd 1.6 has no CDI: runtime_mode never picks cdi for it")
    text = (CACHE / containerd.suite / "etc" / "containerd" / "config.toml").read_text()
    if admin_dirs is not None:
        doc = tomlkit.parse(text)
        table = "io.containerd.cri.v1.runtime" if _version(text) == 3 else \
            "io.containerd.grpc.v1.cri"
        doc.setdefault("plugins", {}).setdefault(table, {})["cdi_spec_dirs"] = admin_dirs
        text = tomlkit.dumps(doc)
    before = containerd.dump(_original(tmp_path, text))
    assert before is not None
    _merge_on_disk(tmp_path, text, containerd.major, cdi=True)
    plugin = containerd.dump(tmp_path / "config.toml")["plugins"][CRI_LOADED[containerd.major]]
    assert plugin["enable_cdi"] is True
    assert plugin["containerd"]["default_runtime_name"] == "runc"
    assert "nvidia" in plugin["containerd"]["runtimes"]
    assert plugin["cdi_spec_dirs"] == (["/etc/cdi", "/var/run/cdi"])
    # Without cdi, the merge leaves CDI as the config had it (1.7 off, 2.x on by default).
    _merge_on_disk(tmp_path, text, containerd.major)
    plugin = containerd.dump(tmp_path / "config.toml")["plugins"][CRI_LOADED[containerd.major]]
    assert plugin["enable_cdi"] is (containerd.major >= 2)
