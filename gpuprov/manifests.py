"""The Kubernetes manifests, rendered from the repository's templates/ with Jinja2.

The templates are the one source of the objects: the nvidia_device_plugin role renders them
with Ansible's template lookup and applies them; this module renders the same files with the
same Jinja2 settings (Ansible's template defaults: trim_blocks, StrictUndefined) for
`gpuprov manifests` and `gpuprov verify`'s smoke pods. Default values come from the role's
defaults/main.yml, and values files are checked against its meta/argument_specs.yml, so
neither a default nor a type is written twice.

The templates live at the repository root, outside the package: gpuprov finds them next to
its own source tree (an editable install, `pip install -e .`, of a checkout).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpuprov.errors import ExitCode, GpuprovError

REPO_ROOT = Path(__file__).resolve().parent.parent
ROLE = "nvidia_device_plugin"
DRA_ROLE = "nvidia_dra_driver"
DEVICE_PLUGIN_TEMPLATE = "nvidia-device-plugin.yml.j2"
DRA_DRIVER_TEMPLATE = "nvidia-dra-driver.yml.j2"
SMOKE_POD_TEMPLATE = "smoke-pod.yml.j2"
SMOKE_JOB_TEMPLATE = "smoke-job.yml.j2"
SMOKE_COMMAND = ("nvidia-smi", "-L")


def repo_root() -> Path:
    return REPO_ROOT


def _paths(root: Path | None = None, role: str = ROLE) -> tuple[Path, Path, Path]:
    root = root or repo_root()
    return (root / "templates", root / "roles" / role / "defaults" / "main.yml",
            root / "roles" / role / "meta" / "argument_specs.yml")


def _require(path: Path) -> Path:
    if not path.exists():
        raise GpuprovError(
            f"{path} is missing: gpuprov renders its manifests from the repository's templates/ "
            "and roles/, so run it from an editable install of a checkout (pip install -e .)",
            ExitCode.USAGE)
    return path


def _load_yaml(path: Path, what: str) -> Any:
    try:
        return yaml.safe_load(_require(path).read_text())
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise GpuprovError(f"{what} {path} is not valid YAML{at}: "
                           f"{getattr(exc, 'problem', None) or exc}") from None
    except OSError as exc:
        raise GpuprovError(f"cannot read {what} {path}: {exc.strerror}") from None


def role_defaults(root: Path | None = None, role: str = ROLE) -> dict[str, Any]:
    _, defaults, _ = _paths(root, role)
    return dict(_load_yaml(defaults, "the role defaults") or {})


def role_options(root: Path | None = None, role: str = ROLE) -> dict[str, dict[str, Any]]:
    _, _, specs = _paths(root, role)
    doc = _load_yaml(specs, "the role's argument specs") or {}
    return dict(doc["argument_specs"]["main"]["options"])


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "path": (str,), "int": (int,), "bool": (bool,), "list": (list,),
    "dict": (dict,), "float": (int, float),
}


def _type_error(name: str, value: Any, spec: Mapping[str, Any]) -> str | None:
    """Why `value` does not fit the option's argument spec, or None."""
    kind = spec.get("type", "str")
    if value is None:
        return None if not spec.get("required") else f"{name} must be set"
    allowed = _TYPES.get(kind)
    if allowed is not None and (not isinstance(value, allowed)
                                or (kind != "bool" and isinstance(value, bool))):
        return f"{name} must be {kind}, got {type(value).__name__} {value!r}"
    if "choices" in spec and value not in spec["choices"]:
        return f"{name} must be one of {', '.join(map(str, spec['choices']))}, got {value!r}"
    elements = spec.get("elements")
    if kind == "list" and elements:
        for item in value:
            problem = _type_error(f"{name} item", item, {"type": elements})
            if problem:
                return problem
    if kind == "dict":
        for key, item in value.items():
            if not isinstance(key, str) or not isinstance(item, str):
                return (f"{name} must map strings to strings (quote values such as \"true\"), "
                        f"got {key!r}: {item!r}")
    return None


def load_values(values_file: Path | str | None = None,
                root: Path | None = None, role: str = ROLE) -> dict[str, Any]:
    """The role defaults overlaid with a values file (a YAML mapping of role variables),
    checked against the role's argument specs."""
    values = role_defaults(root, role)
    if values_file is None:
        return values
    path = Path(values_file)
    if not path.is_file():
        raise GpuprovError(f"values file {path} does not exist (or is not a file)")
    user = _load_yaml(path, "values file")
    if user is None:
        return values
    if not isinstance(user, dict):
        raise GpuprovError(f"values file {path} must be a YAML mapping of "
                           f"{role}_* variables, got {type(user).__name__}")
    options = role_options(root, role)
    for name, value in user.items():
        if name not in options:
            close = difflib.get_close_matches(str(name), list(options), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise GpuprovError(f"values file {path}: unknown key {name!r}{hint}; "
                               f"known: {', '.join(sorted(options))}")
        problem = _type_error(name, value, options[name])
        if problem:
            raise GpuprovError(f"values file {path}: {problem}")
    values.update(user)
    if role == ROLE and values["nvidia_device_plugin_time_slicing_replicas"] < 1:
        raise GpuprovError(f"values file {path}: nvidia_device_plugin_time_slicing_replicas "
                           "must be 1 (no sharing) or more")
    return values


def _environment(templates: Path) -> jinja2.Environment:
    # Ansible's template defaults, and the Ansible filters the templates use (`bool` is
    # Ansible's own: a value given as `-e name=false` arrives as the string "false").
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["to_json"] = lambda value: json.dumps(value)
    env.filters["hash"] = lambda value, algo="sha1": hashlib.new(
        algo, str(value).encode()).hexdigest()
    # Imported here: ansible's filter module takes a tenth of a second, which verify's pod
    # phase (a manifests reader) need not pay unless it renders.
    from ansible.plugins.filter.core import to_bool

    env.filters["bool"] = to_bool
    return env


def render(template: str, values: Mapping[str, Any], root: Path | None = None) -> list[dict]:
    """The objects one template gives with these values (empty documents dropped)."""
    templates, _, _ = _paths(root)
    _require(templates / template)
    try:
        text = _environment(templates).get_template(template).render(**values)
    except jinja2.TemplateError as exc:
        raise GpuprovError(f"templates/{template}: {exc}") from None
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise GpuprovError(f"templates/{template} rendered invalid YAML: {exc}") from None
    return [doc for doc in docs if doc]


def device_plugin(values_file: Path | str | None = None, root: Path | None = None) -> list[dict]:
    """Exactly the objects the nvidia_device_plugin role applies: RuntimeClass, ConfigMap
    (time-slicing only), DaemonSet."""
    return render(DEVICE_PLUGIN_TEMPLATE, load_values(values_file, root), root)


def dra_driver(values_file: Path | str | None = None, root: Path | None = None) -> list[dict]:
    """Exactly the objects of NVIDIA's DRA driver for the nodes with gpu_allocation dra:
    Namespace, the kubelet plugin's ServiceAccount, ClusterRole and binding, DaemonSet, the
    DeviceClasses gpu.nvidia.com and mig.nvidia.com, and (nvidia_dra_driver_slice_policy) the
    chart's ValidatingAdmissionPolicy and its binding."""
    return render(DRA_DRIVER_TEMPLATE, load_values(values_file, root, DRA_ROLE), root)


# The resources of NVIDIA's device plugin a smoke workload may request: whole GPUs, or one MIG
# profile's devices under the plugin's mixed strategy ("nvidia.com/mig-1g.10gb").
SMOKE_RESOURCE = re.compile(r"^nvidia\.com/(gpu|mig-[0-9]+g\.[0-9a-z.]+)$")


def _smoke_values(name: str, namespace: str, gpus: int, node: str | None,
                  values: Mapping[str, Any] | None, deadline_seconds: int,
                  ttl_seconds: int, command: tuple[str, ...] | list[str],
                  visible_devices: str | None = None,
                  resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    least = 0 if visible_devices is not None else 1
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < least:
        raise GpuprovError(f"a smoke workload requests at least {least} GPU(s), got {gpus!r}")
    if not SMOKE_RESOURCE.match(str(resource)):
        raise GpuprovError(f"a smoke workload requests nvidia.com/gpu or nvidia.com/mig-<profile>,"
                           f" not {resource!r}")
    base = values if values is not None else load_values()
    return {
        "gpuprov_smoke_name": name, "gpuprov_smoke_namespace": namespace,
        "gpuprov_smoke_gpus": gpus, "gpuprov_smoke_node": node,
        "gpuprov_smoke_resource": resource,
        "gpuprov_smoke_image": base["nvidia_device_plugin_smoke_image"],
        "gpuprov_smoke_runtime_class": base["nvidia_device_plugin_runtime_class_name"],
        "gpuprov_smoke_command": list(command),
        "gpuprov_smoke_deadline_seconds": deadline_seconds,
        "gpuprov_smoke_ttl_seconds": ttl_seconds,
        "gpuprov_smoke_visible_devices": visible_devices,
    }


def smoke_pod(name: str, namespace: str, gpus: int = 1, node: str | None = None,
              values: Mapping[str, Any] | None = None,
              command: tuple[str, ...] | list[str] = SMOKE_COMMAND,
              visible_devices: str | None = None, resource: str = "nvidia.com/gpu") -> dict:
    """A Pod that requests `gpus` of `resource` (nvidia.com/gpu, or a MIG profile's
    nvidia.com/mig-<profile>) on `node`, if given, and runs nvidia-smi -L.

    `visible_devices`: the pod also sets NVIDIA_VISIBLE_DEVICES to it, as a CUDA image does;
    with it, `gpus` may be 0 (the pod asks the runtime, not the scheduler)."""
    (pod,) = render(SMOKE_POD_TEMPLATE, _smoke_values(name, namespace, gpus, node, values, 0, 0,
                                                      command, visible_devices, resource))
    return pod


def smoke_job(name: str, namespace: str, gpus: int = 1, node: str | None = None,
              values: Mapping[str, Any] | None = None, deadline_seconds: int = 300,
              ttl_seconds: int = 600,
              command: tuple[str, ...] | list[str] = SMOKE_COMMAND,
              resource: str = "nvidia.com/gpu") -> dict:
    """A batch/v1 Job (no retries) whose pod requests `gpus` of `resource` and runs
    nvidia-smi -L."""
    (job,) = render(SMOKE_JOB_TEMPLATE, _smoke_values(name, namespace, gpus, node, values,
                                                      deadline_seconds, ttl_seconds, command,
                                                      resource=resource))
    return job


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the plugin's config file) as literal blocks, readable in review."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict]) -> str:
    """Multi-document YAML, one `---` per object, keys in template order."""
    return "".join("---\n" + yaml.dump(obj, Dumper=_Dumper, sort_keys=False,
                                        default_flow_style=False) for obj in objects)
