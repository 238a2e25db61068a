"""NVML collection against a pynvml test double (tests/fixtures/probe/fake_pynvml.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gpuprov.node.probe import nvml

FIXTURES = Path(__file__).parent.parent / "fixtures" / "probe"
_spec = importlib.util.spec_from_file_location("fake_pynvml", FIXTURES / "fake_pynvml.py")
fake_pynvml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake_pynvml)


@pytest.fixture(autouse=True)
def _no_real_library(monkeypatch):
    monkeypatch.setattr(nvml, "loaded_library", lambda: None)


def test_system_facts():
    doc = nvml.collect(fake_pynvml.load("two-gpus"))
    assert doc["available"] is True and doc["error"] is None
    assert doc["driver_version"] == "535.161.08"
    assert doc["nvml_version"] == "12.535.161.08"
    assert (doc["cuda_driver_version"], doc["cuda_driver_version_int"]) == ("12.2", 12020)
    assert doc["device_count"] == 3
    assert doc["errors"] == {}


def test_gpu_identity_and_health():
    p100 = nvml.collect(fake_pynvml.load("two-gpus"))["gpus"][0]
    assert p100["name"] == "Tesla P100-PCIE-16GB"
    assert p100["uuid"] == "GPU-5d3f0c1a-0000-4000-8000-000000000001"
    assert (p100["pci_bus_id"], p100["pci_device_id"], p100["pci_subsystem_id"]) == (
        "00000000:3B:00.0",
        "10de:15f8",
        "10de:118f",
    )
    # the double answers v1 only for this GPU, as a driver before R510: no reservation apart
    assert p100["memory"] == {"total": 17179869184, "used": 1048576, "free": 17178820608,
                              "reserved": None}
    assert (p100["compute_capability"], p100["architecture"]) == ("6.0", "pascal")
    assert p100["temperature"] == {"current": 86, "slowdown": 85, "shutdown": 90}
    assert p100["utilization"] == {"gpu": 97, "memory": 40}
    assert p100["power"] == {"usage_w": 180.123, "limit_w": 250.0}
    assert p100["persistence_mode"] is True
    assert p100["ecc"] == {
        "mode_current": True,
        "mode_pending": False,
        "volatile": {"corrected": 2, "uncorrected": 1},
        "aggregate": {"corrected": 12, "uncorrected": 1},
    }
    assert p100["retired_pages"] == {"sbe": 2, "dbe": 1, "pending": True}
    assert p100["pcie"] == {"gen_current": 1, "gen_max": 3, "width_current": 16, "width_max": 16}


def test_fallbacks_for_functions_older_drivers_lack():
    nv = fake_pynvml.load("two-gpus")
    p100 = nvml.collect(nv)["gpus"][0]
    # nvmlDeviceGetCurrentClocksEventReasons and the _v3 process query are missing:
    # their older equivalents answer, and no error is recorded for them.
    assert p100["clock_event_reasons"] == {
        "mask": 0x60,
        "names": ["sw_thermal_slowdown", "hw_thermal_slowdown"],
    }
    assert p100["processes"] == [{"pid": 4242, "used_memory": 1048576}]
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in nv.calls
    assert set(p100["errors"]) == {"remapped_rows"}


def test_unsupported_queries_are_recorded_per_field():
    h100 = nvml.collect(fake_pynvml.load("two-gpus"))["gpus"][1]
    assert h100["serial"] is None
    assert h100["retired_pages"] is None
    assert h100["remapped_rows"] == {
        "correctable": 1,
        "uncorrectable": 0,
        "pending": True,
        "failure": False,
    }
    assert h100["errors"]["serial"] == {
        "code": 3,
        "name": "NVML_ERROR_NOT_SUPPORTED",
        "message": "Not Supported",
    }
    assert set(h100["errors"]) == {
        "serial",
        "retired_pages.sbe",
        "retired_pages.dbe",
        "retired_pages.pending",
    }
    assert h100["architecture"] == "hopper"
    assert h100["processes"] == []


def test_lost_gpu_is_an_entry_with_its_error():
    doc = nvml.collect(fake_pynvml.load("two-gpus"))
    assert doc["gpus"][2] == {
        "index": 2,
        "error": {"code": 15, "name": "NVML_ERROR_GPU_IS_LOST", "message": "GPU is lost"},
    }


@pytest.mark.parametrize(
    ("fixture", "name"),
    [
        ("version-mismatch", "NVML_ERROR_LIB_RM_VERSION_MISMATCH"),
        ("no-library", "NVML_ERROR_LIBRARY_NOT_FOUND"),
    ],
)
def test_init_failure_is_data(fixture, name):
    nv = fake_pynvml.load(fixture)
    doc = nvml.collect(nv)
    assert doc["available"] is False
    assert doc["error"]["name"] == name
    assert doc["gpus"] == [] and doc["device_count"] is None
    assert "nvmlShutdown" not in nv.calls


def test_shutdown_after_successful_init():
    nv = fake_pynvml.load("two-gpus")
    nvml.collect(nv)
    assert nv.calls[0] == "nvmlInit" and nv.calls[-1] == "nvmlShutdown"


def test_pynvml_missing_is_data(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    doc = nvml.collect()
    assert doc["available"] is False
    assert doc["error"]["name"] == "PYNVML_NOT_FOUND"


def test_clock_event_reason_names():
    assert nvml.decode_clock_event_reasons(0) == []
    assert nvml.decode_clock_event_reasons(0x1 | 0x8 | 0x100) == [
        "gpu_idle",
        "hw_slowdown",
        "display_clock_setting",
    ]
