"""Read the Ansible inventory the playbooks use, through Ansible's own Python API.

Host variables (group_vars, host_vars, Jinja2 such as ``{{ inventory_dir }}``) resolve
exactly as they do for ansible-playbook, so verify reaches a node the way the roles do:
ansible_host/port/user, the private key, the known_hosts file and host key policy from
ansible_ssh_common_args / ansible_ssh_extra_args, and ansible_connection=local.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import os
import re
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuprov import gpu_allocation
from gpuprov.errors import GpuprovError
from gpuprov.ssh import SshTarget

GPU_GROUP = "gpu_nodes"
CLUSTER_GROUP = "k8s_cluster"
# GPU hosts without Kubernetes: the node phase, then smoke containers through Docker's API;
# those also in DOCKER_SWARM_GROUP are Swarm GPU nodes (the swarm phase).
DOCKER_GROUP = "docker_hosts"
SWARM_GROUP = "docker_swarm"
# The variables verify reads besides the connection ones, and who defines them.
BRANCH_VAR = "nvidia_driver_branch"  # nvidia_driver role; gpu_preflight honours the pin
SOURCE_VAR = "nvidia_driver_source"  # nvidia_driver role: distro or nvidia (branch choice)
# nvidia_driver role: the admin accepts a driver below its branch's security floor
# (driver.security warns instead of failing).
ALLOW_VULNERABLE_VAR = "nvidia_driver_allow_vulnerable"
KUBECONFIG_VAR = "k8s_kubeconfig"  # the lab inventory and the roles that call the API
SERIES_KEY_VAR = "gpu_node_labels_series_key"  # gpu_node_labels role
NODE_NAME_VAR = "gpu_node_labels_node_name"  # gpu_node_labels role: the Kubernetes node name
SMOKE_IMAGE_VAR = "nvidia_device_plugin_smoke_image"  # nvidia_device_plugin role's smoke test
# nvidia_container_toolkit role: how containers get GPUs (gpuprov/runtime_mode.py), and in
# which runtime.
TOOLKIT_MODE_VAR = "nvidia_container_toolkit_mode"
TOOLKIT_RUNTIME_VAR = "nvidia_container_toolkit_runtime"
# nvidia_container_toolkit role: whether a Docker host is a Swarm GPU node (its default: in
# docker_swarm), and the generic resource kind of its GPUs.
SWARM_VAR = "nvidia_container_toolkit_docker_swarm"
SWARM_KIND_VAR = "nvidia_container_toolkit_swarm_resource_kind"
# MIG devices as resources (none, single, mixed): the labels role's setting, which defaults
# to the device plugin role's.
MIG_STRATEGY_VARS = ("gpu_node_labels_mig_strategy", "nvidia_device_plugin_mig_strategy")
# The MIG layout declared for the node (a name in mig-parted's format, gpuprov/nvidia/mig.py), and
# the layouts to look it up in (a mig-parted document; default: gpuprov's defaults).
MIG_CONFIG_VAR = "gpu_mig_config"
MIG_CONFIGS_VAR = "gpu_mig_configs"
# Which of NVIDIA's allocators hands the node's GPUs to pods (gpuprov/gpu_allocation.py): verify
# runs the device plugin's checks or the DRA driver's on each node accordingly.
ALLOCATION_VAR = gpu_allocation.SETTING
DEFAULT_SERIES_KEY = "gputype"

# The settings among them (not how to connect): what --host-vars and -e may set.
SETTING_VARS = (
    BRANCH_VAR, SOURCE_VAR, ALLOW_VULNERABLE_VAR, KUBECONFIG_VAR, SERIES_KEY_VAR, NODE_NAME_VAR,
    SMOKE_IMAGE_VAR,
    TOOLKIT_MODE_VAR, TOOLKIT_RUNTIME_VAR, *MIG_STRATEGY_VARS, MIG_CONFIG_VAR, MIG_CONFIGS_VAR,
    SWARM_VAR, SWARM_KIND_VAR, ALLOCATION_VAR,
)

_VARS = (
    "ansible_host", "ansible_ssh_host", "ansible_port", "ansible_ssh_port", "ansible_user",
    "ansible_ssh_user", "ansible_ssh_private_key_file", "ansible_private_key_file",
    "ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_connection",
    "ansible_host_key_checking", "ansible_ssh_host_key_checking", "ansible_become",
    "ansible_become_user", BRANCH_VAR, SOURCE_VAR, ALLOW_VULNERABLE_VAR, KUBECONFIG_VAR,
    SERIES_KEY_VAR,
    NODE_NAME_VAR, SMOKE_IMAGE_VAR, TOOLKIT_MODE_VAR, TOOLKIT_RUNTIME_VAR, *MIG_STRATEGY_VARS,
    MIG_CONFIG_VAR, MIG_CONFIGS_VAR, SWARM_VAR, SWARM_KIND_VAR, ALLOCATION_VAR,
)


@dataclasses.dataclass(frozen=True)
class Node:
    name: str  # inventory_hostname; also the Kubernetes node name
    target: SshTarget | None  # None: ansible_connection=local, the probe runs in-process
    gpu_expected: bool  # in gpu_nodes: a node without GPUs on PCI is a failure
    driver_branch_pin: str | None = None
    driver_source: str | None = None  # None: the OS's default (driver_branches.DEFAULT_SOURCE)
    driver_allow_vulnerable: bool = False
    become: bool = False
    kubeconfig: str | None = None
    series_key: str = DEFAULT_SERIES_KEY
    k8s_name: str | None = None  # the Kubernetes node name, where it is not the inventory name
    smoke_image: str | None = None  # the image the role's smoke test uses (verify's default)
    toolkit_mode: str | None = None  # None: auto
    container_runtime: str | None = None  # None: containerd (the toolkit role's default)
    mig_strategy: str = "none"  # the device plugin role's default
    mig_config: str | None = None  # None: no MIG layout declared
    mig_configs: Any = None  # None: gpuprov.nvidia.mig.default_configs()
    docker: bool = False  # in docker_hosts: no Kubernetes, smoke containers through Docker
    swarm: bool = False  # a Swarm GPU node (docker_swarm, or the toolkit role's setting)
    swarm_kind: str = "NVIDIA-GPU"  # the toolkit role's default
    gpu_allocation: str = gpu_allocation.DEFAULT  # device-plugin | dra

    @property
    def dra(self) -> bool:
        """NVIDIA's DRA driver allocates this node's GPUs, not the device plugin."""
        return self.gpu_allocation == gpu_allocation.DRA

    @property
    def node_name(self) -> str:
        """The Kubernetes node name: the inventory name unless the inventory says otherwise."""
        return self.k8s_name or self.name

    @property
    def local(self) -> bool:
        return self.target is None


def _ssh_options(args: str) -> dict[str, str]:
    """'-o UserKnownHostsFile=/x -oStrictHostKeyChecking=no' -> {lowercase key: value}."""
    options: dict[str, str] = {}
    words = shlex.split(args)
    for i, word in enumerate(words):
        if word == "-o" and i + 1 < len(words):
            option = words[i + 1]
        elif word.startswith("-o") and len(word) > 2:
            option = word[2:]
        else:
            continue
        key, sep, value = option.partition("=")
        if not sep:
            key, _, value = option.partition(" ")
        options.setdefault(key.strip().lower(), value.strip())
    return options


def _truth(value: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "yes", "true", "on", "y")


def _text(value: Any) -> str | None:
    return None if value is None or str(value) == "" else str(value)


def _allocation(name: str, value: Any) -> str:
    try:
        return gpu_allocation.mode(value)
    except gpu_allocation.SettingError as exc:
        raise GpuprovError(f"inventory host {name}: {exc}") from None


def node_from_vars(name: str, groups: set[str], hostvars: dict[str, Any],
                   host_key_checking_default: bool = True) -> Node:
    """One inventory host -> Node, from its resolved variables (Ansible's names)."""
    def first(*keys: str) -> Any:
        return next((hostvars[k] for k in keys if hostvars.get(k) is not None), None)

    common = {
        "gpu_expected": GPU_GROUP in groups,
        "driver_branch_pin": _text(hostvars.get(BRANCH_VAR)),
        "driver_source": _text(hostvars.get(SOURCE_VAR)),
        "driver_allow_vulnerable": bool(_truth(hostvars.get(ALLOW_VULNERABLE_VAR))),
        "become": bool(_truth(hostvars.get("ansible_become"))),
        "kubeconfig": _text(hostvars.get(KUBECONFIG_VAR)),
        "series_key": _text(hostvars.get(SERIES_KEY_VAR)) or DEFAULT_SERIES_KEY,
        "k8s_name": _text(hostvars.get(NODE_NAME_VAR)),
        "smoke_image": _text(hostvars.get(SMOKE_IMAGE_VAR)),
        "toolkit_mode": _text(hostvars.get(TOOLKIT_MODE_VAR)),
        "gpu_allocation": _allocation(name, hostvars.get(ALLOCATION_VAR)),
        "container_runtime": _text(hostvars.get(TOOLKIT_RUNTIME_VAR)),
        "mig_strategy": _text(first(*MIG_STRATEGY_VARS)) or "none",
        "mig_config": _text(hostvars.get(MIG_CONFIG_VAR)),
        "mig_configs": hostvars.get(MIG_CONFIGS_VAR),
        "docker": DOCKER_GROUP in groups,
        "swarm": DOCKER_GROUP in groups and (
            SWARM_GROUP in groups if _truth(hostvars.get(SWARM_VAR)) is None
            else bool(_truth(hostvars.get(SWARM_VAR)))),
        "swarm_kind": _text(hostvars.get(SWARM_KIND_VAR)) or "NVIDIA-GPU",
    }
    if str(hostvars.get("ansible_connection") or "") == "local":
        return Node(name=name, target=None, **common)

    args = " ".join(str(first(k) or "") for k in ("ansible_ssh_common_args",
                                                  "ansible_ssh_extra_args"))
    options = _ssh_options(args)
    checking = _truth(first("ansible_ssh_host_key_checking", "ansible_host_key_checking"))
    if checking is None:
        checking = host_key_checking_default
    strict = options.get("stricthostkeychecking")
    if strict is not None:
        # "no"/"off" accept any key; "accept-new" would add unknown keys, which gpuprov
        # never writes: it is treated as checking, like "yes".
        checking = strict.lower() not in ("no", "off", "false")
    known_hosts = options.get("userknownhostsfile")
    port = first("ansible_port", "ansible_ssh_port")
    try:
        port_number = int(port) if port is not None else 22
    except ValueError:
        raise GpuprovError(f"inventory host {name}: ansible_port {port!r} is not a number; "
                           "fix it in the inventory") from None
    host = str(first("ansible_host", "ansible_ssh_host") or name)
    # ssh's own default, as Ansible's when remote_user is unset.
    user = str(first("ansible_user", "ansible_ssh_user") or getpass.getuser())
    target = SshTarget(
        name=name,
        host=host,
        port=port_number,
        user=user,
        key_file=_text(first("ansible_ssh_private_key_file", "ansible_private_key_file")),
        known_hosts=(_expand_ssh_path(known_hosts.split()[0], host, port_number, user, name)
                     if known_hosts else None),
        check_host_keys=bool(checking),
    )
    return Node(name=name, target=target, **common)


_SSH_TOKEN = re.compile(r"%(.)")


def _expand_ssh_path(path: str, host: str, port: int, user: str, alias: str) -> str:
    """A UserKnownHostsFile as ssh reads it (ssh_config(5), TOKENS): the tilde, environment
    variables and the tokens that name the local user, the host, port and remote user. Ansible
    hands the option to ssh, which expands it; gpuprov reads the file itself."""
    local = {"%": "%", "d": os.path.expanduser("~"), "u": getpass.getuser(), "h": host,
             "p": str(port), "r": user, "n": alias}
    path = _SSH_TOKEN.sub(lambda m: local.get(m.group(1), m.group(0)), path)
    return os.path.expanduser(os.path.expandvars(path))


@contextlib.contextmanager
def _collect_parse_failures(failures: list[str]) -> Iterator[None]:
    """Ansible reports an unparsable source (and a --limit matching nothing) only as warnings
    on its display; gpuprov says it in one line, so that display is captured meanwhile."""
    from ansible.inventory import manager

    display = manager.display
    saved = display.error_as_warning, display.warning

    def as_warning(msg: str, exception: BaseException, **_: Any) -> None:
        cause = exception.__cause__ or exception
        text = getattr(cause, "message", None) or str(cause)
        failures.append(f"{msg.rstrip('.')}: {text.strip().splitlines()[0]}")

    display.error_as_warning = as_warning
    display.warning = lambda msg, *a, **k: None
    try:
        yield
    finally:
        display.error_as_warning, display.warning = saved


def load(path: str, limit: str | None = None,
         host_vars: Mapping[str, Mapping[str, Any]] | None = None,
         extra_vars: Mapping[str, Any] | None = None) -> list[Node]:
    """The hosts of gpu_nodes and k8s_cluster (after --limit), in inventory order.

    host_vars ({host: {var: value}}, values as Ansible resolved them: what the gpu_verify role
    passes, so that a playbook's -e reaches verify) and then extra_vars (-e, for every host)
    take the place of the inventory's values of SETTING_VARS, as extra vars win in Ansible.

    Raises GpuprovError (exit 2, one line) for a missing or unparsable inventory, one
    without those groups, and a --limit that matches none of their hosts.
    """
    from ansible import constants
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    source = Path(path)
    if not source.exists():
        raise GpuprovError(f"inventory {path} does not exist; pass the hosts.yml the "
                           "playbooks use (-i inventory/<site>/hosts.yml)")
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(source)], parse=False)
    failures: list[str] = []
    with _collect_parse_failures(failures):
        parsed = inventory.parse_source(str(source.resolve()))
    if not parsed:
        # The yaml plugin's complaint is the useful one for .yml files, ini's otherwise.
        preferred = "'yaml'" if source.suffix in (".yml", ".yaml") else "'ini'"
        reason = next((f for f in failures if preferred in f), failures[0] if failures
                      else "no inventory plugin accepted it")
        raise GpuprovError(f"cannot parse inventory {path}: {reason}")
    inventory.reconcile_inventory()
    variables = VariableManager(loader=loader, inventory=inventory)

    groups = inventory.groups
    if not {GPU_GROUP, CLUSTER_GROUP, DOCKER_GROUP} & set(groups):
        raise GpuprovError(f"inventory {path} has no group {GPU_GROUP}, {CLUSTER_GROUP} or "
                           f"{DOCKER_GROUP}; put the Kubernetes nodes or Docker hosts there, as "
                           "in inventory/sample/hosts.yml")
    pattern = ":".join(g for g in (GPU_GROUP, CLUSTER_GROUP, DOCKER_GROUP) if g in groups)
    all_hosts = inventory.get_hosts(pattern)
    if limit:
        inventory.subset(limit)
    with _collect_parse_failures([]):  # "Could not match ..." becomes the error below
        hosts = inventory.get_hosts(pattern)
    if not hosts:
        where = f"--limit {limit!r} matches none of" if limit else "no hosts in"
        raise GpuprovError(f"{where} the {len(all_hosts)} hosts of {GPU_GROUP}/"
                           f"{CLUSTER_GROUP} in {path}; check the pattern "
                           "(Ansible's syntax: host names, groups, wildcards, ':' lists)")
    nodes = []
    for host in hosts:
        hostvars = variables.get_vars(host=host, include_hostvars=False)
        templar = Templar(loader=loader, variables=hostvars)
        resolved = {}
        for key in _VARS:
            if hostvars.get(key) is None:
                continue
            try:
                resolved[key] = templar.template(hostvars[key])
            except Exception as exc:  # Ansible's templating errors have many types
                raise GpuprovError(f"inventory host {host.name}: cannot resolve {key}: "
                                   f"{str(exc).splitlines()[0]}") from exc
        for given in ((host_vars or {}).get(host.name) or {}, extra_vars or {}):
            resolved.update({k: v for k, v in given.items() if k in SETTING_VARS})
        group_names = {g.name for g in host.get_groups()}
        nodes.append(node_from_vars(host.name, group_names, resolved,
                                    bool(constants.HOST_KEY_CHECKING)))
    return nodes
