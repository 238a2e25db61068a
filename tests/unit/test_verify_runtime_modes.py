"""runtime.nvidia per mode (gpuprov/runtime_mode.py), on the recorded gpu-hopper probe report
turned into a CDI-mode node: containerd 2.1.9's package, nvidia not the default runtime, the
toolkit's spec in /var/run/cdi naming the report's GPUs; each way the spec or the runtime can
be wrong fails with what is wrong."""

from __future__ import annotations

import dataclasses

import pytest
from test_verify_checks import facts, run

from gpuprov.verify.findings import FAIL, PASS


def _cdi_node(doc: dict) -> None:
    doc["packages"]["runtime"] = [{"name": "containerd", "version": "2.1.9~ds1-1",
                                   "state": "installed", "held": False}]
    doc["container_runtime"]["containerd"].update(default_is_nvidia=False,
                                                  default_runtime_name="runc",
                                                  enable_cdi=None, cdi_spec_dirs=None)
    gpus = doc["nvml"]["gpus"]
    doc["container_runtime"]["cdi_specs"] = [{
        "path": "/var/run/cdi/nvidia.yaml", "kind": "nvidia.com/gpu", "error": None,
        "devices": [str(g["index"]) for g in gpus] + [g["uuid"] for g in gpus] + ["all"],
        "driver_versions": [doc["nvml"]["driver_version"]]}]


def cdi_facts(*mutations, mode: str | None = None):
    def mutate(doc: dict) -> None:
        _cdi_node(doc)
        for change in mutations:
            change(doc)
    f = facts("gpu-hopper", mutate)
    return dataclasses.replace(f, node=dataclasses.replace(f.node, toolkit_mode=mode))


def test_a_cdi_node_passes_and_says_so():
    finding = run("runtime.nvidia", cdi_facts())
    assert finding.status == PASS, finding.message
    assert finding.message.startswith("cdi mode (containerd 2.1 injects CDI devices")
    assert "names 8 GPU(s) by index and UUID" in finding.message


def test_the_same_node_set_to_legacy_is_judged_as_legacy():
    finding = run("runtime.nvidia", cdi_facts(mode="legacy"))
    assert finding.status == PASS and finding.message.startswith("legacy mode")


def _spec(**changes):
    def mutate(doc: dict) -> None:
        doc["container_runtime"]["cdi_specs"][0].update(changes)
    return mutate


def _drop_second_uuid(doc: dict) -> None:
    spec = doc["container_runtime"]["cdi_specs"][0]
    spec["devices"].remove(doc["nvml"]["gpus"][1]["uuid"])


def _no_spec(doc: dict) -> None:
    doc["container_runtime"]["cdi_specs"] = []


def _second_spec(doc: dict) -> None:
    doc["container_runtime"]["cdi_specs"].append(
        {"path": "/etc/cdi/nvidia.yaml", "kind": "nvidia.com/gpu", "error": None,
         "devices": [], "driver_versions": []})


def _containerd(**changes):
    def mutate(doc: dict) -> None:
        doc["container_runtime"]["containerd"].update(changes)
    return mutate


@pytest.mark.parametrize("mutation, words", [
    (_no_spec, "no CDI spec at /var/run/cdi/nvidia.yaml"),
    (_drop_second_uuid, "does not name GPU(s) GPU-"),
    (_spec(driver_versions=["470.256.02"]), "generated for driver 470.256.02"),
    (_spec(kind="example.com/gpu"), "not nvidia.com/gpu"),
    (_second_spec, "a second nvidia.com/gpu spec"),
    (_containerd(enable_cdi=False), "CDI is off in containerd"),
    (_containerd(cdi_spec_dirs=["/etc/cdi"]), "leave out /var/run/cdi"),
])
def test_what_cdi_mode_needs_fails_alone(mutation, words):
    finding = run("runtime.nvidia", cdi_facts(mutation))
    assert finding.status == FAIL and words in finding.message, finding.message


def test_cdi_asked_of_a_containerd_without_cdi_fails():
    def old(doc: dict) -> None:
        doc["packages"]["runtime"][0]["version"] = "1.6.20~ds1-1+deb12u3"
    finding = run("runtime.nvidia", cdi_facts(old, mode="cdi"))
    assert finding.status == FAIL and "containerd 1.6 cannot inject CDI devices" in \
        finding.message
