"""NVIDIA's runtime merged into a node's container runtime configuration, never overwritten.

The nvidia_container_toolkit role calls these functions on the controller (through
plugins/filter/nvidia_container_toolkit.py) with the files it read from the node, and writes back
what they return. Reading applies containerd's own import rules, which live once, in the
probe (gpuprov.node.probe.runtime): the probe, `gpuprov verify` and the lab's emulated device
plugin judge the result with the same code.

containerd: a drop-in file, imported by the main config.toml. containerd 1.x (Debian 12
ships 1.6) replaces each plugins."<id>" table of an imported file WHOLE, so a drop-in that
only named the nvidia runtime would silently drop every other CRI setting of the files
before it (sandbox_image, registry mirrors, cni dirs). The drop-in therefore carries the
effective CRI plugin table (all files but the drop-in, merged as containerd merges them)
plus the nvidia runtime, like nvidia-ctk >= 1.18 does. That is right under 2.x's key by
key merge too. The main file only gains an `imports` entry (comments and layout kept).
Consequence: later edits to the CRI table in config.toml take effect once the role has
run again (it rebuilds the drop-in from them); the drop-in's header says so.

The effective table includes the CRI plugin's built-ins (runc, default_runtime_name):
containerd 1.x keeps only the runtimes a config names once it names any, so a config that
relies on the built-in runc would lose it to the drop-in's runtimes table
(probe_runtime.containerd_cri_builtins says where containerd keeps them).

A version 1 config (no `version` key) is refused on containerd 2.x: 2.x moves its CRI keys
to the old plugin name and ignores them, so no NVIDIA runtime written there takes effect
(version 2 is fine: 2.x migrates each file to its own version as it loads it). Likewise a
version 3 or 4 config on containerd 1.x: 1.7 refuses it, 1.6.20 loads it and ignores its CRI
plugin ids.

Version 4 is containerd 2.3's (containerd/containerd v2.3.1, version/version.go ConfigVersion =
4; RELEASES.md "Daemon Configuration": version 4 needs containerd >= 2.3.0). Its migration from
3 (cmd/containerd/server/config/config.go, `migrations`: "Version 3 has server properties moved
to plugins for version 4", serviceMigrate) moves only the top-level grpc, ttrpc, debug and
metrics tables into plugins."io.containerd.server.v1.*" and
plugins."io.containerd.metrics.v1.grpc-prometheus"; the CRI plugins keep version 3's ids
(io.containerd.cri.v1.runtime). So a version 4 file is read and merged as a version 3 one, the
drop-in is written as version 4 (2.3 refuses a drop-in of a higher version than its root:
LoadConfig, "drop-in config version %d higher than root config version %d"), and the server
tables, which the drop-in never names, are left where the admin put them. A version gpuprov
does not know is refused, never read as another one: containerd itself refuses a version above
its own (ValidateVersion), and a newer one may move the CRI tables again.

Docker: daemon.json is one JSON object; runtimes.<name> (and default-runtime), features.cdi
and the node's GPUs in node-generic-resources (Swarm) are set, every other key is kept.

TOML is read with tomllib (the standard library: the same parser the probe uses on Python
3.11+) and written with tomlkit, which keeps the main file's comments and formatting when
it adds `imports` (tomllib cannot write; a dict dumper would reformat the admin's file).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import posixpath

try:
    import tomllib
except ImportError:  # Python < 3.11 on the controller
    import tomli as tomllib  # type: ignore[no-redef]

import tomlkit

from gpuprov import runtime_mode
from gpuprov.node.probe import runtime as probe_runtime

CONTAINERD_CONFIG = probe_runtime.CONTAINERD_CONFIG
NVIDIA_DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
RUNC_V2 = "io.containerd.runc.v2"

# Where the CRI plugin keeps its runtimes, by config version (containerd 2.0-2.2: 3; 2.3: 4,
# whose migration from 3 leaves the CRI plugin ids alone).
CRI_PLUGIN_IDS = {4: "io.containerd.cri.v1.runtime", 3: "io.containerd.cri.v1.runtime",
                  2: "io.containerd.grpc.v1.cri", 1: "cri"}


class RuntimeConfigError(ValueError):
    """The node's configuration cannot be merged safely; the message says what to change."""


def _loads_toml(text: str, path: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RuntimeConfigError(f"{path} is not valid TOML ({exc}); fix it first") from None


def config_version(doc: dict, path: str) -> int:
    """A containerd config's version as containerd reads it (the probe's rule); a version
    gpuprov does not read is refused in one line (RuntimeConfigError), never read as another."""
    version, problem = probe_runtime.containerd_config_version(doc)
    if problem is not None:
        raise RuntimeConfigError(f"{path}: {problem}; write it in one of those versions (or "
                                 "update gpuprov), then run the role again")
    return version


def _glob_match(pattern: str, path: str) -> bool:
    """Go's filepath.Match: '*' never crosses a '/'."""
    parts, names = pattern.split("/"), path.split("/")
    return len(parts) == len(names) and all(
        fnmatch.fnmatchcase(n, p) for p, n in zip(parts, names, strict=True)
    )


def containerd_import_dirs(main_text: str | None, main_path: str = CONTAINERD_CONFIG) -> list:
    """Directories and file patterns the main config imports from, for the role to read
    (`find` per entry): [{"path": dir, "pattern": basename glob}]. One level: files that
    import further files are named by the merge, which then asks for them."""
    doc = _loads_toml(main_text, main_path) if main_text else {}
    out = []
    for path in probe_runtime.containerd_imports(main_path, doc.get("imports"), lambda p: [p]):
        entry = {"path": posixpath.dirname(path), "pattern": posixpath.basename(path)}
        if entry not in out:
            out.append(entry)
    return out


def _effective(
    main_path: str, texts: dict[str, str], containerd_major: int | None, left_out: str = ""
) -> tuple:
    """containerd's effective config of these files, `left_out` not loaded even where it is
    imported: (config, records, mode, missing imports)."""
    missing: list[str] = []

    def load(path: str) -> tuple[dict | None, dict]:
        if path == left_out:
            return None, {"path": path, "error": "left out"}
        if path not in texts:
            missing.append(path)
            return None, {"path": path, "error": "missing"}
        return _loads_toml(texts[path], path), {"path": path, "error": None}

    def glob(pattern: str) -> list[str]:
        return sorted(p for p in texts if _glob_match(pattern, p))

    config, records, mode = probe_runtime.containerd_load(main_path, load, glob, containerd_major)
    return probe_runtime.containerd_cri_builtins(config, mode), records, mode, missing


def _covers(main_doc: dict, main_path: str, path: str) -> bool:
    return any(
        _glob_match(p, path) if "*" in p else p == path
        for p in probe_runtime.containerd_imports(main_path, main_doc.get("imports"), lambda p: [p])
    )


def _nvidia_runtime(
    runtimes: dict, default_name: str | None, runtime_name: str, binary: str
) -> dict:
    """The nvidia runtime entry: an existing one keeps its settings; a new one copies the
    default runc runtime's (SystemdCgroup above all: kubelet's cgroup driver must match)."""
    if isinstance(runtimes.get(runtime_name), dict):
        entry = copy.deepcopy(runtimes[runtime_name])
    else:
        entry = {}
        for name in (default_name, "runc"):
            base = runtimes.get(name) if name else None
            if isinstance(base, dict) and base.get("runtime_type", RUNC_V2) == RUNC_V2:
                entry = copy.deepcopy(base)
                break
    entry["runtime_type"] = RUNC_V2
    options = entry.get("options") if isinstance(entry.get("options"), dict) else {}
    entry["options"] = {**options, "BinaryName": binary}
    return entry


def containerd_nvidia(
    main_text: str | None,
    files: dict[str, str] | None = None,
    *,
    main_path: str = CONTAINERD_CONFIG,
    drop_in_path: str = NVIDIA_DROP_IN,
    runtime_name: str = "nvidia",
    binary: str = "/usr/bin/nvidia-container-runtime",
    set_default: bool = False,
    containerd_major: int | None = None,
    cdi: bool = False,
) -> dict:
    """The drop-in and the main config that give containerd the NVIDIA runtime.

    cdi: native CDI mode (gpuprov/runtime_mode.py): CDI enabled in the CRI plugin, with the
    spec directory the toolkit's nvidia-cdi-refresh writes to among its cdi_spec_dirs (an
    admin's own list is kept and only gains it); set_default should then be false.

    main_text: config.toml as the node has it (None: no file, containerd's defaults).
    files: every other file the node has under the imported directories, {path: text}
    (the drop-in itself is ignored: it is rebuilt from the others).
    Returns {"main": text, "main_changed": bool, "drop_in": text, "plugin": CRI plugin id,
    "version": config version, "merge": containerd's merge rule, "effective": the config
    containerd will load, as a dict}.
    """
    others = {p: t for p, t in (files or {}).items() if p not in (main_path, drop_in_path)}
    if containerd_major is None and main_text is None:
        containerd_major = 1
    main_doc = _loads_toml(main_text, main_path) if main_text is not None else {}
    if main_text is None:
        version = 3 if (containerd_major or 1) >= 2 else 2
    else:
        version = config_version(main_doc, main_path)
    if version == 1 and (containerd_major or 1) >= 2:
        # containerd 2.x's own `config migrate` drops a version 1 file's CRI keys as well,
        # hence the rename first (checked with 2.1.9).
        raise RuntimeConfigError(
            f"{main_path} is a version 1 config (no version key, or version = 1), whose CRI "
            f"settings containerd {containerd_major}.x ignores, so the NVIDIA runtime would not "
            "take effect: migrate it first (set version = 2 and rename plugins.cri to "
            'plugins."io.containerd.grpc.v1.cri", run `containerd config migrate > new.toml`, '
            f"review new.toml, replace {main_path} with it), then run the role again"
        )
    if version >= 3 and containerd_major == 1:
        raise RuntimeConfigError(
            f"{main_path} is a version {version} config, which containerd 1.x does not read "
            "(1.7 refuses to start, 1.6 ignores its CRI settings), so the NVIDIA runtime would "
            "not take effect: write it as version 2 or upgrade containerd to 2.x, then run the "
            "role again"
        )
    plugin_id = CRI_PLUGIN_IDS[version]

    # No file: containerd runs on its defaults, in the schema of the version it writes.
    texts = {**others, main_path: main_text if main_text is not None else f"version = {version}\n"}
    before, _, mode, missing = _effective(main_path, texts, containerd_major, drop_in_path)
    if missing:
        raise RuntimeConfigError(
            f"{main_path} imports {', '.join(missing)}, which the node does not have "
            "(containerd refuses to start so): remove the import or create the file"
        )

    cri = copy.deepcopy((before.get("plugins") or {}).get(plugin_id) or {})
    containerd = cri.setdefault("containerd", {})
    runtimes = containerd.setdefault("runtimes", {})
    runtimes[runtime_name] = _nvidia_runtime(
        runtimes, containerd.get("default_runtime_name"), runtime_name, binary
    )
    if set_default:
        containerd["default_runtime_name"] = runtime_name
    if cdi:
        cri["enable_cdi"] = True
        dirs = cri.get("cdi_spec_dirs")
        if isinstance(dirs, list) and runtime_mode.CDI_SPEC_DIR not in dirs:
            cri["cdi_spec_dirs"] = [*dirs, runtime_mode.CDI_SPEC_DIR]

    drop_in_doc = tomlkit.document()
    drop_in_doc.add(tomlkit.comment(
        "Managed by gpuprov (roles/nvidia_container_toolkit); local changes are overwritten."
    ))
    drop_in_doc.add(tomlkit.comment(
        f"The {plugin_id} plugin table of the other containerd config files, plus the"
    ))
    drop_in_doc.add(tomlkit.comment(
        f"{runtime_name} runtime: containerd 1.x replaces a plugin table of an imported file"
    ))
    drop_in_doc.add(tomlkit.comment(
        "whole, and keeps only the runtimes it names (so runc is named too). Change CRI"
    ))
    drop_in_doc.add(tomlkit.comment("settings in those files, then run the role again."))
    if "version" in main_doc or main_text is None:
        drop_in_doc.add("version", version)
    drop_in_doc.add("plugins", {plugin_id: cri})
    drop_in = tomlkit.dumps(drop_in_doc)

    if main_text is None:
        main_new = tomlkit.document()
        main_new.add(tomlkit.comment("Written by gpuprov: containerd's defaults, plus imports."))
        main_new.add("version", version)
        main_new.add("imports", [drop_in_path])
        new_main_text = tomlkit.dumps(main_new)
    elif _covers(main_doc, main_path, drop_in_path):
        new_main_text = main_text
    else:
        doc = tomlkit.parse(main_text)
        if isinstance(doc.get("imports"), list):
            doc["imports"].append(drop_in_path)
        else:
            # tomlkit puts a new top-level key before the first table, as TOML needs.
            doc.add("imports", [drop_in_path])
        new_main_text = tomlkit.dumps(doc)

    after, _, _, _ = _effective(
        main_path, {**texts, main_path: new_main_text, drop_in_path: drop_in}, containerd_major
    )
    _check(before, after, plugin_id, cri, drop_in_path)
    return {
        "main": new_main_text,
        "main_changed": new_main_text != main_text,
        "drop_in": drop_in,
        "plugin": plugin_id,
        "version": version,
        "merge": mode,
        "effective": after,
    }


def _check(before: dict, after: dict, plugin_id: str, cri: dict, drop_in_path: str) -> None:
    """containerd will load what was meant: the CRI table as computed, the rest unchanged."""
    got = (after.get("plugins") or {}).get(plugin_id)
    if got != cri:
        raise RuntimeConfigError(
            f"a file containerd loads after {drop_in_path} replaces its {plugin_id} plugin "
            "table, so the NVIDIA runtime would not take effect: move that file's settings "
            f"before {posixpath.basename(drop_in_path)} (e.g. a lower-numbered drop-in) or into "
            "config.toml"
        )
    def rest(config: dict) -> dict:
        out = {k: v for k, v in config.items() if k not in ("imports", "version", "plugins")}
        plugins = {k: v for k, v in (config.get("plugins") or {}).items() if k != plugin_id}
        return {**out, "plugins": plugins}

    if rest(before) != rest(after):
        raise RuntimeConfigError("the merge would change containerd settings outside the "
                                 f"{plugin_id} plugin table; refusing (a gpuprov bug)")


# Swarm: a node advertises its GPUs as named generic resources of one kind in daemon.json
# (node-generic-resources: "KIND=VALUE" entries, parsed by swarmkit's api/genericresource/parse.go
# `Parse`: split at "=", a kind whose values are all non-numbers is a set of named resources).
# Swarm hands a task the ones it assigned as one environment variable, "DOCKER_RESOURCE_" and the
# kind, upper-cased, the values joined by "," (swarmkit api/genericresource/string.go `EnvFormat`,
# called with the prefix "DOCKER_RESOURCE" by moby's executor,
# daemon/cluster/executor/container/container.go). NVIDIA's hook and runtime take the GPUs from
# the variable the toolkit's `swarm-resource` names (api/config/v1/config.go `SwarmResource`,
# internal/config/image/cuda_image.go `visibleEnvVars`), whose commented default is
# DOCKER_RESOURCE_GPU (api/config/v1/toml.go): right only for the kind "gpu"/"GPU", wrong for
# the "NVIDIA-GPU" of Docker's own daemon.json reference, the classic mismatch. gpuprov derives
# one name from the other.
SWARM_ENV_PREFIX = "DOCKER_RESOURCE"
SWARM_GPU_KIND = "NVIDIA-GPU"


def swarm_resource_env(kind: str) -> str:
    """The variable Swarm sets for a task's resources of this kind (swarmkit's EnvFormat)."""
    return (SWARM_ENV_PREFIX + "_" + kind).upper()


def swarm_kind_problem(kind: object) -> str | None:
    """Why `kind` cannot be a generic resource kind whose values reach NVIDIA's hook."""
    if not isinstance(kind, str) or not kind.strip() or kind != kind.strip():
        return f"the Swarm GPU resource kind must be a word (is {kind!r})"
    # "=" splits swarmkit's term; "," splits the variable's values, which NVIDIA reads as a list.
    if any(c in kind for c in "=,\n"):
        return f"the Swarm GPU resource kind {kind!r} may contain no '=', ',' or newline"
    return None


def docker_nvidia(
    text: str | None,
    *,
    runtime_name: str = "nvidia",
    binary: str = "/usr/bin/nvidia-container-runtime",
    set_default: bool = False,
    cdi: bool = False,
    generic_resources: list[str] | None = None,
    resource_kind: str = SWARM_GPU_KIND,
    path: str = "/etc/docker/daemon.json",
) -> dict:
    """daemon.json with runtimes.<runtime_name>; every other key kept.

    set_default false also takes back a default-runtime that names this runtime (Docker's
    default, runc, applies again). cdi: features.cdi on (Docker 25-27 need it; the admin's other
    features are kept). generic_resources (GPU UUIDs; None: not a Swarm GPU node): the
    node-generic-resources entries of resource_kind become exactly these, entries of other
    kinds are kept. Returns {"text": ..., "changed": bool}; an unchanged config is returned
    byte for byte."""
    try:
        config = json.loads(text) if text and text.strip() else {}
    except ValueError as exc:
        raise RuntimeConfigError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise RuntimeConfigError(f"{path} is not a JSON object")
    new = copy.deepcopy(config)
    runtimes = new.get("runtimes")
    if runtimes is None:
        runtimes = new["runtimes"] = {}
    if not isinstance(runtimes, dict):
        raise RuntimeConfigError(f"{path}: runtimes is not an object")
    entry = runtimes.get(runtime_name) if isinstance(runtimes.get(runtime_name), dict) else {}
    runtimes[runtime_name] = {**entry, "path": binary, "args": entry.get("args", [])}
    if set_default:
        new["default-runtime"] = runtime_name
    elif new.get("default-runtime") == runtime_name:
        del new["default-runtime"]
    if cdi:
        features = new.setdefault("features", {})
        if not isinstance(features, dict):
            raise RuntimeConfigError(f"{path}: features is not an object")
        features["cdi"] = True
    if generic_resources is not None:
        problem = swarm_kind_problem(resource_kind)
        if problem:
            raise RuntimeConfigError(problem)
        have = new.get("node-generic-resources", [])
        if not isinstance(have, list) or not all(isinstance(e, str) for e in have):
            raise RuntimeConfigError(f"{path}: node-generic-resources is not a list of "
                                     "\"KIND=VALUE\" strings")
        others = [e for e in have if e.partition("=")[0].strip() != resource_kind]
        new["node-generic-resources"] = others + [f"{resource_kind}={uuid}"
                                                  for uuid in generic_resources]
        if not new["node-generic-resources"]:
            del new["node-generic-resources"]
    if new == config and text is not None:
        return {"text": text, "changed": False, "config": new}
    return {"text": json.dumps(new, indent=2) + "\n", "changed": True, "config": new}
