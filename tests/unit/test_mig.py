"""gpuprov.nvidia.mig: MIG profiles per model, whether a layout fits one GPU, the default layouts
and the layout a mig-parted configuration gives each GPU, against NVIDIA's MIG user guide and
mig-parted's default configuration (NVIDIA/mig-parted deployments/systemd/config-default.yaml,
whose layouts the expectations below restate)."""

from __future__ import annotations

import pytest

from gpuprov.nvidia import mig

H100, A100_40, A30, H200, P100 = 0x2330, 0x20B0, 0x20B7, 0x2335, 0x15F8


@pytest.mark.parametrize(("device", "layout"), [
    (H100, {"1g.10gb": 7}),
    (H100, {"1g.20gb": 4}),
    (H100, {"2g.20gb": 3}),
    (H100, {"3g.40gb": 2}),
    (H100, {"4g.40gb": 1, "3g.40gb": 1}),
    (H100, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),  # mig-parted's all-balanced
    (H100, {"2g.20gb": 3, "1g.10gb": 1}),
    (H100, {"7g.80gb": 1}),
    (H100, {"1g.10gb+me": 1, "1g.10gb": 6}),
    (A100_40, {"1g.10gb": 4}),  # mig-parted's all-1g.10gb for the 40GB boards
    (A30, {"1g.6gb": 2, "2g.12gb": 1}),
    (A30, {"4g.24gb": 1}),
    (H200, {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
    (H200, {}),
])
def test_layouts_nvidia_documents_fit(device, layout):
    assert mig.fits(mig.model_of(device), layout) is None


@pytest.mark.parametrize(("device", "layout", "words"), [
    (H100, {"1g.10gb": 8}, "at most 7 1g.10gb"),
    (H100, {"1g.5gb": 1}, "has no MIG profile '1g.5gb'"),
    (H100, {"4g.40gb": 1, "4g.40gb ": 1}, "has no MIG profile"),
    (H100, {"3g.40gb": 2, "1g.10gb": 1}, "placements overlap"),  # 7 compute, 9 memory slices
    (H100, {"3g.40gb": 1, "4g.40gb": 1, "1g.10gb": 0, "1g.20gb": 1}, "compute slices"),
    (H100, {"1g.20gb": 4, "1g.10gb": 1}, "placements overlap"),
    (A30, {"1g.6gb+me": 1, "2g.12gb+me": 1}, "one +me instance"),
    (H100, {"1g.10gb": -1}, "whole number"),
])
def test_layouts_that_do_not_fit_say_why(device, layout, words):
    problem = mig.fits(mig.model_of(device), layout)
    assert problem is not None and words in problem, problem


def test_only_mig_capable_gpus_have_a_model():
    assert mig.model_of(P100) is None
    # H100-80GB and A100-80GB: one profile set, each its own SMs per instance.
    h100, a100 = mig.model_of(H100), mig.model_of(0x20B2)
    assert h100.profiles == a100.profiles and h100.multiprocessors != a100.multiprocessors


def test_every_profile_has_its_nvml_index_id_and_sms():
    for model in mig.MODELS:
        indices = [p.nvml_index for p in model.profiles]
        ids = [p.nvml_id for p in model.profiles]
        assert len(set(indices)) == len(indices) and len(set(ids)) == len(ids), model.name
        assert {p.compute for p in model.profiles} == set(model.multiprocessors), model.name
        whole = next(p for p in model.profiles if p.compute == model.compute_slices)
        assert whole.nvml_id == 0, model.name  # the whole-GPU profile is ID 0 [lgip]


def test_default_layouts_are_mig_parteds():
    configs = mig.validate({"version": "v1", "mig-configs": mig.default_configs()})
    assert configs["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    by_model = {tuple(e["device-filter"]): e["mig-devices"] for e in configs["all-1g.10gb"]}
    assert {"1g.10gb": 7} in by_model.values() and {"1g.10gb": 4} in by_model.values()
    h100 = next(e for e in configs["all-balanced"] if "0x233010DE" in e["device-filter"])
    assert h100["mig-devices"] == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert "all-1g.10gb.me" in configs and "all-7g.141gb" in configs
    # Every default layout fits every model it names.
    for name, entries in configs.items():
        for entry in entries:
            for device in (int(f[2:6], 16) for f in entry.get("device-filter", [])):
                assert mig.fits(mig.model_of(device), entry["mig-devices"]) is None, name


def test_plan_picks_each_gpus_entry_by_filter_and_index():
    configs = mig.validate({"version": "v1", "mig-configs": {
        **mig.default_configs(),
        "half": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                 {"devices": "all", "mig-enabled": False}],
    }})
    node = [(i, H100) for i in range(4)] + [(4, P100)]
    layouts = mig.plan(configs, "half", node)
    assert [(g.index, g.mig_enabled, dict(g.devices)) for g in layouts[:3]] == [
        (0, True, {"3g.40gb": 2}), (1, True, {"3g.40gb": 2}), (2, False, {})]
    assert (layouts[4].model, layouts[4].mig_enabled) == (None, None)  # P100: left alone
    balanced = mig.plan(configs, "all-balanced", [(0, A30), (1, H200)])
    assert [dict(g.devices) for g in balanced] == [{"1g.6gb": 2, "2g.12gb": 1},
                                                   {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}]
    assert all(g.problem is None for g in balanced)


def test_plan_reports_a_layout_a_gpu_cannot_take():
    configs = mig.validate({"version": "v1", "mig-configs": {
        "too-many": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 8}}]}})
    (layout,) = mig.plan(configs, "too-many", [(3, H100)])
    assert layout.problem == "GPU 3: H100-80GB takes at most 7 1g.10gb, not 8"
    with pytest.raises(mig.ConfigError, match="no MIG layout 'nope'; the configuration has"):
        mig.plan(configs, "nope", [(0, H100)])


@pytest.mark.parametrize(("doc", "words"), [
    ({"mig-configs": {}}, "version: v1"),
    ({"version": "v1", "mig-configs": {"x": []}}, "non-empty list"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "some", "mig-enabled": True}]}},
     "devices must be all or a list of GPU indices"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": "yes"}]}},
     "mig-enabled must be true or false"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": False,
                                              "mig-devices": {"1g.10gb": 1}}]}},
     "mig-devices with mig-enabled false"),
    ({"version": "v1", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                                              "migdevices": {}}]}}, "unknown keys migdevices"),
])
def test_bad_configurations_are_one_clear_error(doc, words):
    with pytest.raises(mig.ConfigError, match=words):
        mig.validate(doc)
