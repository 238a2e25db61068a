"""The gpu_verify role's decision (gpuprov/stages/gpu_verify.py): the settings it hands
`gpuprov verify`, as Ansible resolved them for each host."""

from __future__ import annotations

from gpuprov.stages import gpu_verify
from gpuprov.verify.inventory import SETTING_VARS


def test_each_host_gets_the_settings_verify_reads_and_no_other():
    known = SETTING_VARS[0]
    hostvars = {"gpu-a": {known: "x", "ansible_host": "10.0.0.1"},
                "gpu-b": {known: None},
                "cpu-c": {}}
    assert gpu_verify.host_vars(["gpu-a", "gpu-b", "cpu-c"], hostvars) == {
        "gpu-a": {known: "x"}, "gpu-b": {}, "cpu-c": {}}


def test_the_filter_hands_over_the_play_hosts(ansible_plugin):
    filters = ansible_plugin("filter/gpu_verify.py").FilterModule().filters()
    known = SETTING_VARS[0]
    assert filters["gpuprov_verify_host_vars"](["gpu-a"], {"gpu-a": {known: 1}}) == {
        "gpu-a": {known: 1}}
