"""Container runtime configuration for NVIDIA: containerd, Docker, CRI-O, CDI.

Each config file is parsed; a missing file is "present: false", a malformed one is
recorded under its "error" and never stops the probe.
"""

from __future__ import annotations

import copy
import json
import os
import posixpath
import re
from collections.abc import Callable

from . import toml_subset
from .fs import Root

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
# Where the CRI runtimes table lives, per containerd config version.
CONTAINERD_CRI_TABLES = (
    # version 3 (containerd 2.0-2.2) and 4 (2.3: its migration from 3 moves only the server
    # settings, containerd/containerd v2.3.1 cmd/containerd/server/config/config.go)
    ("plugins", "io.containerd.cri.v1.runtime", "containerd"),
    ("plugins", "io.containerd.grpc.v1.cri", "containerd"),  # version 2
    ("plugins", "cri", "containerd"),  # version 1 (no version key)
)
# The config versions gpuprov reads -> their CRI table above; and which containerd reads
# which (containerd/containerd v2.3.1 RELEASES.md, "Daemon Configuration": 1 from v1.0.0, 2
# from v1.3.0, 3 from v2.0.0, 4 from v2.3.0; containerd 2.x no longer reads 1's CRI keys).
CONTAINERD_CONFIG_VERSIONS = {4: 0, 3: 0, 2: 1, 1: 2}
CONTAINERD_VERSIONS_READ = ("1 and 2 (containerd 1.x), 2 and 3 (containerd 2.0-2.2), 2, 3 and "
                            "4 (containerd 2.3)")
DOCKER_CONFIG = "/etc/docker/daemon.json"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_INS = "/etc/crio/crio.conf.d/*"
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
NVIDIA_BINARIES = (
    "nvidia-container-runtime",
    "nvidia-ctk",
    "nvidia-container-cli",
    "nvidia-container-runtime-hook",
)
RUNTIME_NAME = "nvidia"
# NVIDIA's container toolkit's own config: which GPU requests its runtime and hook honour.
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
# Its keys that decide who gets GPUs, with the value the toolkit takes when a key is absent
# (NVIDIA/nvidia-container-toolkit, internal/config/config.go GetDefault: the envvar is
# accepted from unprivileged containers, volume mounts are not).
TOOLKIT_KEYS = {
    "accept-nvidia-visible-devices-envvar-when-unprivileged": True,
    "accept-nvidia-visible-devices-as-volume-mounts": False,
}


def _is_nvidia_binary(path: object) -> bool:
    # nvidia-container-runtime, or its .cdi / .legacy variants nvidia-ctk can configure.
    return isinstance(path, str) and posixpath.basename(path).startswith("nvidia-container-runtime")


def _dig(doc: dict, keys: tuple) -> dict | None:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else None


def _merge(base: dict, over: dict) -> dict:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def _load_toml(root: Root, path: str) -> tuple[dict, dict]:
    """(parsed document or {}, file record for the report)."""
    text = root.read(path)
    if text is None:
        return {}, {"path": path, "error": "unreadable"}
    try:
        return toml_subset.loads(text), {"path": path, "error": None}
    except toml_subset.TomlError as exc:
        return {}, {"path": path, "error": str(exc)}


def _summary(runtimes: dict, default: object, extra: dict) -> dict:
    nvidia = runtimes.get(RUNTIME_NAME)
    return {
        **extra,
        "runtimes": runtimes,
        "default_runtime_name": default if isinstance(default, str) else None,
        "nvidia_runtime": bool(nvidia and _is_nvidia_binary(nvidia.get("binary"))),
        "default_is_nvidia": bool(
            isinstance(default, str)
            and default in runtimes
            and _is_nvidia_binary(runtimes[default].get("binary"))
        ),
    }


# How containerd applies `imports` (cmd/containerd/server/config/config.go, LoadConfig and
# mergeConfig, in 1.6, 1.7 and 2.x alike apart from the plugin tables):
# - the main file first, then the imported files breadth-first (an imported file's own
#   imports queue behind the ones already pending); a path is loaded once;
# - an import is a path or, when it contains "*", a glob expanded in lexical order; a
#   relative one is relative to the importing file's directory;
# - each file is merged over what came before: scalars override (mergo: an empty string,
#   0 or false in the later file does not), lists are appended, tables merged key by key,
#   except the tables below, whose entries are replaced whole;
# - containerd 1.x (Debian 12 ships 1.6) also replaces each `plugins."<id>"` table WHOLE:
#   a drop-in that sets one key of the CRI plugin drops every other CRI setting of the
#   files before it (containerd issue #5837). containerd 2.0 merges plugin tables key by
#   key (containerd PR #9982).
MERGE_REPLACE = "replace-plugin-tables"  # containerd 1.x
MERGE_DEEP = "deep"  # containerd 2.x
_REPLACED_PER_KEY = ("stream_processors", "proxy_plugins", "timeouts")


def containerd_config_version(doc: dict) -> tuple[int | None, str | None]:
    """(version, None) of a containerd config as containerd reads it (no key, or 0, which
    containerd's migrations table "treated at version 1", is 1), or (None, why) in one line
    for a version gpuprov does not read: never read as another version (a newer containerd
    may move the CRI tables again)."""
    version = doc.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        return None, (f"version = {version!r} is not a containerd config version; gpuprov "
                      f"reads versions {CONTAINERD_VERSIONS_READ}")
    version = version or 1
    if version not in CONTAINERD_CONFIG_VERSIONS:
        return None, (f"config version {version} is not one gpuprov reads (it reads versions "
                      f"{CONTAINERD_VERSIONS_READ})")
    return version, None


def containerd_merge_mode(version: object, containerd_major: int | None = None) -> str:
    """Merge rule of the containerd that reads this config.

    Without the binary's version: a version 3 config is only read by containerd 2.x; a
    version 1 or 2 one is taken as containerd 1.x, the stricter rule (what it finds in a
    drop-in is also there under 2.x's merge, not always the other way round).
    """
    if containerd_major is not None:
        return MERGE_DEEP if containerd_major >= 2 else MERGE_REPLACE
    return MERGE_DEEP if isinstance(version, int) and version >= 3 else MERGE_REPLACE


def _merge_struct(to: dict, frm: dict) -> None:
    for key, value in frm.items():
        current = to.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            _merge_struct(current, value)
        elif isinstance(value, list) and isinstance(current, list):
            to[key] = current + copy.deepcopy(value)
        elif key in to and (value == "" or value is False or value == 0):
            continue  # mergo.WithOverride leaves the value when the new one is empty
        else:
            to[key] = copy.deepcopy(value)


def containerd_merge(to: dict, frm: dict, mode: str) -> dict:
    """Merge one loaded file `frm` over the config loaded so far, as containerd does."""
    for key, value in frm.items():
        current = to.get(key)
        if key == "plugins" and isinstance(value, dict) and isinstance(current, dict):
            for plugin_id, section in value.items():
                if mode == MERGE_DEEP and isinstance(section, dict) and isinstance(
                    current.get(plugin_id), dict
                ):
                    _merge(current[plugin_id], copy.deepcopy(section))
                else:
                    current[plugin_id] = copy.deepcopy(section)
        elif key in _REPLACED_PER_KEY and isinstance(value, dict) and isinstance(current, dict):
            current.update(copy.deepcopy(value))
        elif key in ("imports", "version"):
            # containerd rewrites imports to the files it loaded, and keeps the root's
            # version (2.x refuses a drop-in of a higher version than its root).
            to.setdefault(key, copy.deepcopy(value))
        else:
            _merge_struct(to, {key: value})
    return to


def containerd_imports(parent: str, imports: object, glob: Callable[[str], list[str]]) -> list:
    """The paths an `imports` list names, in containerd's order (globs sorted)."""
    paths: list[str] = []
    for entry in imports if isinstance(imports, list) else []:
        if not isinstance(entry, str) or not entry:
            continue
        path = posixpath.normpath(entry)
        if not path.startswith("/"):
            path = posixpath.normpath(posixpath.join(posixpath.dirname(parent), path))
        paths.extend(sorted(glob(path)) if "*" in path else [path])
    return paths


def containerd_load(
    main_path: str,
    load: Callable[[str], tuple[dict | None, dict]],
    glob: Callable[[str], list[str]],
    containerd_major: int | None = None,
) -> tuple[dict, list[dict], str]:
    """(effective config, file records in load order, merge mode) of a containerd config.

    load(path) -> (parsed document or None when missing/unreadable/malformed, record).
    """
    effective: dict = {}
    records: list[dict] = []
    loaded: set[str] = set()
    pending = [main_path]
    mode = None
    while pending:
        path, pending = pending[0], pending[1:]
        if path in loaded:
            continue
        loaded.add(path)
        doc, record = load(path)
        records.append(record)
        if mode is None:
            mode = containerd_merge_mode((doc or {}).get("version"), containerd_major)
        if doc is None:
            continue
        containerd_merge(effective, doc, mode)
        pending.extend(containerd_imports(path, doc.get("imports"), glob))
    return effective, records, mode or MERGE_REPLACE


# The CRI plugin's built-in runtime settings (its `containerd` table), by plugin id, as
# `containerd config default` prints them (Debian's 1.6.20, 1.7.24, 2.1.9); its other
# defaults are plain fields, which a config's own tables leave alone. containerd 1.x
# decodes the merged config's `runtimes` table into a NEW map: a config that names any
# runtime (the nvidia drop-in does) has only the runtimes it names, and runc is gone unless
# it is named too. 2.x decodes that table into the built-in map, entry by entry.
# sandbox_mode is 1.7's (1.6 ignores it; 2.x migrates it to sandboxer).
_RUNC_V1 = {"runtime_type": "io.containerd.runc.v2", "sandbox_mode": "podsandbox"}
_RUNC_V3 = {"runtime_type": "io.containerd.runc.v2", "sandboxer": "podsandbox"}
# Pairs written out, not zip(..., strict=True): that is Python 3.10's, and the probe runs on
# 3.9 nodes (a TypeError here, at import, cost them the whole report).
CONTAINERD_CRI_BUILTIN = {
    keys[1]: {"default_runtime_name": "runc", "runtimes": {"runc": runc}}
    for keys, runc in ((CONTAINERD_CRI_TABLES[0], _RUNC_V3), (CONTAINERD_CRI_TABLES[1], _RUNC_V1),
                       (CONTAINERD_CRI_TABLES[2], _RUNC_V1))
}


def containerd_cri_builtins(config: dict, mode: str) -> dict:
    """A copy of `config` (containerd_load's) with the CRI plugin's built-in runtimes and
    default runtime name where containerd keeps them: what the CRI plugin runs with."""
    out = copy.deepcopy(config)
    version = config.get("version")
    plugin_id = CONTAINERD_CRI_TABLES[CONTAINERD_CONFIG_VERSIONS.get(version, 2)][1]
    plugins = out.setdefault("plugins", {})
    cri = plugins.setdefault(plugin_id, {}) if isinstance(plugins, dict) else None
    containerd = cri.setdefault("containerd", {}) if isinstance(cri, dict) else None
    if not isinstance(containerd, dict):
        return out
    builtin = copy.deepcopy(CONTAINERD_CRI_BUILTIN[plugin_id])
    containerd.setdefault("default_runtime_name", builtin["default_runtime_name"])
    runtimes = containerd.get("runtimes")
    if runtimes is None or (mode == MERGE_DEEP and isinstance(runtimes, dict)):
        containerd["runtimes"] = _merge(builtin["runtimes"], runtimes or {})
    return out


def collect_containerd(root: Root) -> dict:
    if not root.exists(CONTAINERD_CONFIG):
        return {
            "present": False,
            "files": [],
            "import_merge": None,
            **_summary({}, None, {"version": None, "enable_cdi": None, "cdi_spec_dirs": None}),
        }

    def load(path: str) -> tuple[dict | None, dict]:
        if not root.exists(path):
            return None, {"path": path, "error": "missing"}
        doc, record = _load_toml(root, path)
        return (None if record["error"] else doc), record

    merged, files, mode = containerd_load(CONTAINERD_CONFIG, load, root.glob)
    version, version_error = containerd_config_version(merged)
    runtimes: dict = {}
    default = None
    cdi: dict = {"enable_cdi": None, "cdi_spec_dirs": None}
    if version_error is not None:
        # Its CRI tables are not read as another version's: verify reports the one line.
        return {"present": True, "files": files, "import_merge": mode,
                "version_error": f"{CONTAINERD_CONFIG}: {version_error}",
                **_summary(runtimes, default, {"version": merged.get("version"), **cdi})}
    merged = containerd_cri_builtins(merged, mode)
    for keys in CONTAINERD_CRI_TABLES:
        table = _dig(merged, keys)
        if table is None:
            continue
        # CDI settings live in the CRI plugin's own table (keys[:2]), beside `containerd`.
        plugin = _dig(merged, keys[:2]) or {}
        if cdi["enable_cdi"] is None and isinstance(plugin.get("enable_cdi"), bool):
            cdi["enable_cdi"] = plugin["enable_cdi"]
        if cdi["cdi_spec_dirs"] is None and isinstance(plugin.get("cdi_spec_dirs"), list):
            cdi["cdi_spec_dirs"] = [d for d in plugin["cdi_spec_dirs"] if isinstance(d, str)]
        for name, spec in (table.get("runtimes") or {}).items():
            if isinstance(spec, dict):
                options = spec.get("options") if isinstance(spec.get("options"), dict) else {}
                runtimes[name] = {
                    "runtime_type": spec.get("runtime_type"),
                    "binary": options.get("BinaryName"),
                }
        default = default or table.get("default_runtime_name")
    return {
        "present": True,
        "files": files,
        "import_merge": mode,
        "version_error": None,
        **_summary(runtimes, default, {"version": merged.get("version"), **cdi}),
    }


def collect_docker(root: Root) -> dict:
    text = root.read(DOCKER_CONFIG)
    if text is None:
        return {"present": False, "error": None, **_summary({}, None, {})}
    try:
        config = json.loads(text) if text.strip() else {}
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return {"present": True, "error": f"{DOCKER_CONFIG}: {exc}", **_summary({}, None, {})}
    runtimes = {
        name: {"binary": spec.get("path")}
        for name, spec in (config.get("runtimes") or {}).items()
        if isinstance(spec, dict)
    }
    return {"present": True, "error": None, **_summary(runtimes, config.get("default-runtime"), {})}


def collect_crio(root: Root) -> dict:
    paths = ([CRIO_CONFIG] if root.exists(CRIO_CONFIG) else []) + root.glob(CRIO_DROP_INS)
    if not paths:
        return {"present": False, "files": [], **_summary({}, None, {})}
    merged: dict = {}
    files = []
    for path in paths:  # CRI-O applies drop-ins in lexical order, over the main file
        doc, record = _load_toml(root, path)
        files.append(record)
        _merge(merged, doc)
    table = _dig(merged, ("crio", "runtime")) or {}
    runtimes = {
        name: {"runtime_type": spec.get("runtime_type"), "binary": spec.get("runtime_path")}
        for name, spec in (table.get("runtimes") or {}).items()
        if isinstance(spec, dict)
    }
    return {"present": True, "files": files, **_summary(runtimes, table.get("default_runtime"), {})}


_CDI_KIND = re.compile(r'^kind:\s*["\']?([^"\'\s#]+)', re.MULTILINE)
# A device's name in a YAML spec: `- name: X` one level under the top-level `devices:` list
# (nvidia-ctk writes block YAML; other `name` keys of a spec, such as hooks', are
# `hookName`).
_CDI_DEVICE = re.compile(r'^[ ]*- name:\s*["\']?([^"\'\s#]+)["\']?\s*$', re.MULTILINE)
_CDI_TOP_KEY = re.compile(r"^[A-Za-z]\w*:", re.MULTILINE)
# The driver version in a mounted library's file name (libnvidia-ml.so.580.105.08).
_DRIVER_LIBRARY = re.compile(r"lib(?:nvidia-ml|cuda)\.so\.(\d+\.\d+(?:\.\d+)?)")


def _yaml_devices(text: str) -> list[str]:
    """Device names of a YAML spec: the `- name:` items of its top-level devices list."""
    start = re.search(r"^devices:\s*$", text, re.MULTILINE)
    if start is None:
        return []
    rest = text[start.end():]
    end = _CDI_TOP_KEY.search(rest)
    block = rest[:end.start()] if end else rest
    indents = [len(m.group(0)) - len(m.group(0).lstrip(" ")) for m in _CDI_DEVICE.finditer(block)]
    if not indents:
        return []
    level = min(indents)  # the list's own items, not names nested deeper
    return [m.group(1) for m in _CDI_DEVICE.finditer(block)
            if len(m.group(0)) - len(m.group(0).lstrip(" ")) == level]


def collect_cdi(root: Root) -> list[dict]:
    """Every CDI spec in the runtimes' default spec directories: its kind, device names and
    the driver versions of the libraries it mounts (a spec generated before a driver change
    names the old one). Read without a YAML library (the probe runs on the node with the
    standard library only): the fields gpuprov needs are plain scalars of nvidia-ctk's block
    YAML."""
    specs = []
    for directory in CDI_DIRS:
        for path in root.glob(f"{directory}/*"):
            if not path.endswith((".yaml", ".yml", ".json")):
                continue
            specs.append(cdi_record(path, root.read(path)))
    return specs


def cdi_record(path: str, text: str | None) -> dict:
    """{path, kind, error, devices, driver_versions} of one spec file's text (None:
    unreadable)."""
    kind, error, devices = None, None, []
    if text is None:
        error = "unreadable"
    elif path.endswith(".json"):
        try:
            doc = json.loads(text)
            kind = doc.get("kind")
            devices = [d.get("name") for d in doc.get("devices") or []
                       if isinstance(d, dict) and isinstance(d.get("name"), str)]
        except (ValueError, AttributeError) as exc:
            error = f"invalid JSON: {exc}"
    else:
        match = _CDI_KIND.search(text)
        kind = match.group(1) if match else None
        devices = _yaml_devices(text)
    versions = sorted(set(_DRIVER_LIBRARY.findall(text or "")))
    return {"path": path, "kind": kind, "error": error, "devices": devices,
            "driver_versions": versions}


def collect_toolkit_config(root: Root) -> dict:
    """The toolkit's config.toml: the keys that decide who gets GPUs (TOOLKIT_KEYS, absent
    ones at the toolkit's defaults) and the runtime's mode."""
    present = root.exists(TOOLKIT_CONFIG)
    doc, record = _load_toml(root, TOOLKIT_CONFIG) if present else ({}, {"error": None})
    settings = {key: doc[key] if isinstance(doc.get(key), bool) else default
                for key, default in TOOLKIT_KEYS.items()}
    runtime = doc.get("nvidia-container-runtime")
    mode = runtime.get("mode") if isinstance(runtime, dict) else None
    return {"path": TOOLKIT_CONFIG, "present": present,
            "error": record["error"],
            "settings": settings, "mode": mode if isinstance(mode, str) else "auto"}


def collect(root: Root) -> dict:
    return {
        "toolkit_config": collect_toolkit_config(root),
        "containerd": collect_containerd(root),
        "docker": collect_docker(root),
        "crio": collect_crio(root),
        "binaries": {name: root.which(name) for name in NVIDIA_BINARIES},
        "cdi_specs": collect_cdi(root),
        "sockets": {
            name: os.path.exists(root.path(path))
            for name, path in (
                ("containerd", "/run/containerd/containerd.sock"),
                ("docker", "/run/docker.sock"),
                ("crio", "/run/crio/crio.sock"),
            )
        },
    }
