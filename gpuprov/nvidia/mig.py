"""MIG layouts: which GPU instance profiles each MIG-capable GPU has, whether a declared layout
fits a GPU, and the layout a mig-parted configuration gives each GPU of a node.

The decision core the MIG stage (issue 20) and verify's gpu.mig build on. Standard library only.

Sources (read 2026-11-26):

[mig-guide] NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles": the GPU instance
    profiles of A100-40GB, A100-80GB, A30-24GB, H100-80GB and H200-141GB, their instance
    counts, and their placements (`nvidia-smi mig -lgipp`: a profile occupies `size` of the
    GPU's memory slices from one of its allowed start slices; 8 slices and 7 compute slices,
    A30: 4 and 4). "+me" profiles carry the GPU's media engines, of which there is one set.
[mig-parted] NVIDIA/mig-parted deployments/systemd/config-default.yaml: the configuration
    format (`version: v1`, `mig-configs: {name: [{device-filter, devices, mig-enabled,
    mig-devices}]}`, device filters as "0x<device><vendor>" like "0x233010DE") and its default
    layouts per model (all-disabled, all-enabled, all-<profile> at the profile's count,
    all-balanced). The layouts below are gpuprov's own table of the same facts.
[nvml.h] NVML's NVML_GPU_INSTANCE_PROFILE_* constants (nvidia-ml-py 13.615.71's pynvml.py):
    the profile index NVML is asked about (1_SLICE 0, 2_SLICE 1, 3_SLICE 2, 4_SLICE 3,
    7_SLICE 4, 1_SLICE_REV1 7 for +me, 2_SLICE_REV1 8, 1_SLICE_REV2 9 for the 1g profile with
    two memory slices).
[lgip] `nvidia-smi mig -lgip` as the MIG user guide's examples print it: each profile's ID
    (19 for 1g.5gb/1g.10gb, 20 for +me, 15, 14, 9, 5, 0; A30: 14, 21, 5, 6, 0) and the SMs of
    each compute size (A100: 14 per slice, 98 for 7g; H100/H200: 16, 32, 60, 64, 132; A30:
    14, 28, 56). The lab's simulated NVML answers with them.
[h200] A real H200 (driver 580.159.04, 2026-11-26): `nvidia-smi mig -lgip` and `-lgipp` and
    NVML's nvmlDeviceGetGpuInstanceProfileInfo, in tests/fixtures/real/h200-580.159.04/. Its
    profiles, IDs, counts and placements are the table's; its 1g.35gb (one compute slice, two
    memory slices) has 26 SMs, not a 1g's 16.
[h100-lgip] `nvidia-smi mig -lgip` of an H100 80GB as published in jbarrow.ai/field_notes/
    nvidia-mig (read 2026-11-26): 1g.20gb has 26 SMs, as the H200's 1g.35gb.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Profile:
    name: str  # "1g.10gb", "1g.10gb+me"
    compute: int  # compute slices (the "Ng")
    size: int  # memory slices it occupies
    starts: tuple[int, ...]  # allowed first memory slice
    count: int  # at most this many on one GPU
    nvml_index: int  # NVML_GPU_INSTANCE_PROFILE_* [nvml.h]
    nvml_id: int  # the profile's ID [lgip]


@dataclasses.dataclass(frozen=True)
class MigModel:
    name: str
    pci_device_ids: tuple[int, ...]
    compute_slices: int
    memory_slices: int
    profiles: tuple[Profile, ...]
    balanced: Mapping[str, int]  # mig-parted's all-balanced for the model
    multiprocessors: Mapping[int, int]  # compute slices -> SMs of an instance [lgip]
    # Profiles whose SMs are not their compute slices' (Hopper's 1g with two memory slices)
    multiprocessors_by_profile: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def profile(self, name: str) -> Profile | None:
        return next((p for p in self.profiles if p.name == name), None)

    def profile_multiprocessors(self, profile: Profile) -> int:
        """The SMs of one instance of the profile, as nvidia-smi mig -lgip lists them."""
        return self.multiprocessors_by_profile.get(profile.name,
                                                   self.multiprocessors[profile.compute])


def _eight_slice(mem1: int, mem1x2: int, mem2: int, mem3: int, mem7: int) -> tuple[Profile, ...]:
    """The A100/H100/H200 profile set [mig-guide], named by their memory in GB."""
    return (
        Profile(f"1g.{mem1}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, 0, 19),
        Profile(f"1g.{mem1}gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, 7, 20),
        Profile(f"1g.{mem1x2}gb", 1, 2, (0, 2, 4, 6), 4, 9, 15),
        Profile(f"2g.{mem2}gb", 2, 2, (0, 2, 4), 3, 1, 14),
        Profile(f"3g.{mem3}gb", 3, 4, (0, 4), 2, 2, 9),
        Profile(f"4g.{mem3}gb", 4, 4, (0,), 1, 3, 5),
        Profile(f"7g.{mem7}gb", 7, 8, (0,), 1, 4, 0),
    )


_AMPERE_SMS = {1: 14, 2: 28, 3: 42, 4: 56, 7: 98}
_HOPPER_SMS = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}

MODELS: tuple[MigModel, ...] = (
    MigModel("A100-40GB", (0x20B0, 0x20B1, 0x20F1, 0x20F6), 7, 8,
             _eight_slice(5, 10, 10, 20, 40), {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
             _AMPERE_SMS),
    # A100-80GB/A800-80GB and H100-80GB/H800-80GB share one profile set, not their SMs.
    MigModel("A100-80GB", (0x20B2, 0x20B5, 0x20F3, 0x20F5), 7, 8,
             _eight_slice(10, 20, 20, 40, 80), {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
             _AMPERE_SMS),
    MigModel("H100-80GB", (0x2330, 0x2331, 0x2322, 0x2324), 7, 8,
             _eight_slice(10, 20, 20, 40, 80), {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
             _HOPPER_SMS, {"1g.20gb": 26}),  # [h100-lgip]
    MigModel("H200-141GB", (0x2335, 0x233B), 7, 8, _eight_slice(18, 35, 35, 71, 141),
             {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}, _HOPPER_SMS, {"1g.35gb": 26}),  # [h200]
    MigModel("A30-24GB", (0x20B7,), 4, 4, (
        Profile("1g.6gb", 1, 1, (0, 1, 2, 3), 4, 0, 14),
        Profile("1g.6gb+me", 1, 1, (0, 1, 2, 3), 1, 7, 21),
        Profile("2g.12gb", 2, 2, (0, 2), 2, 1, 5),
        Profile("2g.12gb+me", 2, 2, (0, 2), 1, 8, 6),
        Profile("4g.24gb", 4, 4, (0,), 1, 3, 0),
    ), {"1g.6gb": 2, "2g.12gb": 1}, {1: 14, 2: 28, 4: 56}),
)
_BY_DEVICE = {device: model for model in MODELS for device in model.pci_device_ids}


def model_of(pci_device_id: int) -> MigModel | None:
    """The MIG model of an NVIDIA device ID; None: not MIG-capable (or not in this table)."""
    return _BY_DEVICE.get(pci_device_id)


def placements(model: MigModel, layout: Mapping[str, int]) -> list[tuple[Profile, int]] | str:
    """Where each instance of layout goes on one GPU of the model: (profile, start memory
    slice) in creation order, largest first; or why it cannot be placed (unknown profile,
    over a profile's count, too many compute slices or +me instances, overlapping placements).

    The MIG stage creates the instances at these starts (nvmlDeviceCreateGpuInstanceWithPlacement):
    the driver's own choice without a start is the highest free one, which can leave no room for
    a later, larger instance (1g then 4g fails on H100 that way; 4g then 1g does not)."""
    instances: list[Profile] = []
    for name, count in layout.items():
        profile = model.profile(name)
        if profile is None:
            return (f"{model.name} has no MIG profile {name!r} (it has "
                    f"{', '.join(p.name for p in model.profiles)})")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return f"{name}: the count must be a whole number >= 0, not {count!r}"
        if count > profile.count:
            return f"{model.name} takes at most {profile.count} {name}, not {count}"
        instances += [profile] * count
    if sum(p.compute for p in instances) > model.compute_slices:
        return (f"{model.name} has {model.compute_slices} compute slices, the layout needs "
                f"{sum(p.compute for p in instances)}")
    if sum(1 for p in instances if p.name.endswith("+me")) > 1:
        return f"{model.name} has one set of media engines: at most one +me instance"
    # Largest first, then backtracking over each profile's allowed start slices.
    instances.sort(key=lambda p: (-p.size, -p.compute, p.name))
    used = [False] * model.memory_slices
    chosen: list[tuple[Profile, int]] = []

    def place(i: int) -> bool:
        if i == len(instances):
            return True
        profile = instances[i]
        for start in profile.starts:
            span = range(start, start + profile.size)
            if span.stop <= len(used) and not any(used[s] for s in span):
                for s in span:
                    used[s] = True
                chosen.append((profile, start))
                if place(i + 1):
                    return True
                chosen.pop()
                for s in span:
                    used[s] = False
        return False

    if not place(0):
        return f"{model.name} cannot place {dict(layout)}: its placements overlap"
    return chosen


def fits(model: MigModel, layout: Mapping[str, int]) -> str | None:
    """None when the instances of layout can all be placed on one GPU of the model, else why
    not."""
    found = placements(model, layout)
    return found if isinstance(found, str) else None


def default_configs() -> dict[str, list[dict[str, Any]]]:
    """mig-parted's default layouts [mig-parted], in its format, from the table above: each
    model's entries carry a device filter, so one name serves every model."""
    configs: dict[str, list[dict[str, Any]]] = {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-enabled": [{"devices": "all", "mig-enabled": True, "mig-devices": {}}],
    }
    for model in MODELS:
        device_filter = [f"0x{d:04X}10DE" for d in model.pci_device_ids]
        layouts = {f"all-{p.name.replace('+', '.')}": {p.name: p.count} for p in model.profiles}
        layouts["all-balanced"] = dict(model.balanced)
        for name, layout in layouts.items():
            configs.setdefault(name, []).append({
                "device-filter": device_filter, "devices": "all", "mig-enabled": True,
                "mig-devices": layout})
    return configs


class ConfigError(ValueError):
    """A mig-parted configuration or a layout name gpuprov cannot use; the message says what
    is wrong and what to do."""


def _entry_problem(name: str, i: int, entry: Any) -> str | None:
    where = f"mig-configs.{name}[{i}]"
    if not isinstance(entry, Mapping):
        return f"{where} must be a mapping with devices and mig-enabled"
    unknown = set(entry) - {"devices", "device-filter", "mig-enabled", "mig-devices"}
    if unknown:
        return f"{where} has unknown keys {', '.join(sorted(unknown))}"
    devices = entry.get("devices")
    if devices != "all" and not (isinstance(devices, list) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)):
        return f"{where}.devices must be all or a list of GPU indices, not {devices!r}"
    if not isinstance(entry.get("mig-enabled"), bool):
        return f"{where}.mig-enabled must be true or false"
    if not isinstance(entry.get("mig-devices", {}), Mapping):
        return f"{where}.mig-devices must map profiles to counts"
    if entry.get("mig-devices") and not entry["mig-enabled"]:
        return f"{where} lists mig-devices with mig-enabled false"
    return None


def validate(config: Any) -> dict[str, list[dict[str, Any]]]:
    """The mig-configs of a mig-parted configuration document; ConfigError when it is not
    one."""
    if not isinstance(config, Mapping) or config.get("version") != "v1":
        raise ConfigError("the MIG configuration must be mig-parted's format: version: v1 and "
                          "mig-configs (see NVIDIA/mig-parted examples/config.yaml)")
    configs = config.get("mig-configs")
    if not isinstance(configs, Mapping) or not configs:
        raise ConfigError("mig-configs must map layout names to lists of entries")
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"mig-configs.{name} must be a non-empty list of entries")
        for i, entry in enumerate(entries):
            problem = _entry_problem(str(name), i, entry)
            if problem:
                raise ConfigError(problem)
    return {str(k): list(v) for k, v in configs.items()}


def _filter_matches(entry: Mapping[str, Any], pci_device_id: int) -> bool:
    wanted = entry.get("device-filter")
    if wanted is None:
        return True
    wanted = [wanted] if isinstance(wanted, str) else list(wanted)
    return f"0x{pci_device_id:04X}10DE" in {str(w).upper().replace("0X", "0x") for w in wanted}


@dataclasses.dataclass(frozen=True)
class GpuLayout:
    index: int
    model: str | None  # MIG model name; None: the GPU is not MIG-capable
    mig_enabled: bool | None  # None: no entry of the layout applies to this GPU
    devices: Mapping[str, int]
    problem: str | None = None


def plan(configs: Mapping[str, list[Mapping[str, Any]]], name: str,
         gpus: Iterable[tuple[int, int]]) -> list[GpuLayout]:
    """The layout named `name` for each GPU of a node, given as (NVML index, PCI device ID):
    the first entry whose device filter and devices take the GPU. A GPU that is not
    MIG-capable is left alone (model None), so that a node without MIG-capable GPUs changes
    nothing; a GPU no entry takes too (mig_enabled None)."""
    if name not in configs:
        raise ConfigError(f"no MIG layout {name!r}; the configuration has "
                          f"{', '.join(sorted(configs))}")
    result = []
    for index, device in gpus:
        model = model_of(device)
        if model is None:
            result.append(GpuLayout(index, None, None, {}))
            continue
        entry = next((e for e in configs[name] if _filter_matches(e, device)
                      and (e["devices"] == "all" or index in e["devices"])), None)
        if entry is None:
            result.append(GpuLayout(index, model.name, None, {}))
            continue
        devices = dict(entry.get("mig-devices") or {})
        problem = fits(model, devices) if entry["mig-enabled"] else None
        result.append(GpuLayout(index, model.name, entry["mig-enabled"], devices,
                                f"GPU {index}: {problem}" if problem else None))
    return result


def difference(state: Mapping[str, Any] | None, layout: GpuLayout | None,
               index: int | None = None) -> str | None:
    """Why a GPU's MIG state (the probe's `mig` section: current, pending, devices with their
    profile; None where the GPU has no MIG) is not its layout, in words; None when it is, or
    when no layout applies to it. A pending mode change is always a difference. Verify's
    gpu.mig reports it; the MIG stage changes the GPUs that have one."""
    if state is None:
        if layout is not None and layout.mig_enabled:
            return "has no MIG, the layout wants it on"
        return None
    on, pending = bool(state.get("current")), bool(state.get("pending"))
    if on != pending:
        return (f"MIG mode {'on' if on else 'off'}, {'on' if pending else 'off'} after a reset "
                f"(pending): reset the GPU (nvidia-smi -r -i {index}) or reboot")
    if layout is None or layout.mig_enabled is None:
        return None
    if on != layout.mig_enabled:
        return (f"MIG mode {'on' if on else 'off'}, the layout wants it "
                f"{'on' if layout.mig_enabled else 'off'}")
    have: dict[str, int] = {}
    for device in state.get("devices") or []:
        have[str(device.get("profile"))] = have.get(str(device.get("profile")), 0) + 1
    want = {k: v for k, v in layout.devices.items() if v}
    if have != want:
        return (f"MIG devices {dict(sorted(have.items())) or 'none'}, the layout wants "
                f"{dict(sorted(want.items())) or 'none'}")
    return None


_BY_NAME = {model.name: model for model in MODELS}


def node_plan(layouts: Iterable[GpuLayout]) -> dict[str, Any]:
    """What gpuprov/node/mig_apply.py does on the node: per GPU that a layout entry takes, its mode
    and its instances in creation order with their placements (placements()). GPUs without
    MIG, or that no entry takes, are left out: they are left alone. ConfigError when a GPU's
    layout cannot be placed."""
    gpus = []
    for layout in layouts:
        if layout.model is None or layout.mig_enabled is None:
            continue
        if layout.problem:
            raise ConfigError(layout.problem)
        instances = []
        if layout.mig_enabled:
            placed = placements(_BY_NAME[layout.model], layout.devices)
            if isinstance(placed, str):  # plan() checked it: fits() is placements()
                raise ConfigError(f"GPU {layout.index}: {placed}")
            instances = [{"profile": p.name, "nvml_index": p.nvml_index, "start": start,
                          "size": p.size} for p, start in placed]
        gpus.append({"index": layout.index, "mig_enabled": layout.mig_enabled,
                     "instances": instances})
    return {"gpus": gpus}
