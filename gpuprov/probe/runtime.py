"""Container runtime configuration for NVIDIA: containerd, Docker, CRI-O, CDI.

Each config file is parsed; a missing file is "present: false", a malformed one is
recorded under its "error" and never stops the probe.
"""

from __future__ import annotations

import json
import os
import posixpath
import re

from gpuprov.probe import toml_subset
from gpuprov.probe.fs import Root

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
# Where the CRI runtimes table lives, per containerd config version.
CONTAINERD_CRI_TABLES = (
    ("plugins", "io.containerd.cri.v1.runtime", "containerd"),  # version 3 (containerd 2.x)
    ("plugins", "io.containerd.grpc.v1.cri", "containerd"),  # version 2
    ("plugins", "cri", "containerd"),  # version 1 (no version key)
)
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


def collect_containerd(root: Root) -> dict:
    if not root.exists(CONTAINERD_CONFIG):
        return {"present": False, "files": [], **_summary({}, None, {"version": None})}
    merged, record = _load_toml(root, CONTAINERD_CONFIG)
    files = [record]
    imports = merged.get("imports", [])
    # containerd resolves relative imports against the main file's directory, expands
    # globs, and merges each imported file over what came before.
    for pattern in imports if isinstance(imports, list) else []:
        if not isinstance(pattern, str):
            continue
        if not pattern.startswith("/"):
            pattern = posixpath.join(posixpath.dirname(CONTAINERD_CONFIG), pattern)
        for path in root.glob(pattern):
            doc, record = _load_toml(root, path)
            files.append(record)
            _merge(merged, doc)
    runtimes: dict = {}
    default = None
    for keys in CONTAINERD_CRI_TABLES:
        table = _dig(merged, keys)
        if table is None:
            continue
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
        **_summary(runtimes, default, {"version": merged.get("version")}),
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


def collect_cdi(root: Root) -> list[dict]:
    specs = []
    for directory in CDI_DIRS:
        for path in root.glob(f"{directory}/*"):
            if not path.endswith((".yaml", ".yml", ".json")):
                continue
            text = root.read(path)
            kind, error = None, None
            if text is None:
                error = "unreadable"
            elif path.endswith(".json"):
                try:
                    kind = json.loads(text).get("kind")
                except (ValueError, AttributeError) as exc:
                    error = f"invalid JSON: {exc}"
            else:  # no YAML parser in the stdlib; the kind is a top-level scalar
                match = _CDI_KIND.search(text)
                kind = match.group(1) if match else None
            specs.append({"path": path, "kind": kind, "error": error})
    return specs


def collect(root: Root) -> dict:
    return {
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
