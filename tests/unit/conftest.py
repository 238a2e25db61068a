"""Unit-test fixtures."""

from __future__ import annotations

import datetime

import pytest

# The day the unit tests judge driver lifecycles on (verify's driver.branch-eol): on it the
# recorded lab nodes' 470 and 535 are past NVIDIA's end of life (2024-07, 2026-06).
VERIFY_DAY = datetime.date(2026, 11, 26)


@pytest.fixture(autouse=True)
def _fixed_lifecycle_day(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuprov.verify.checks import driver

    monkeypatch.setattr(driver, "today", lambda: VERIFY_DAY)


# The emulated API server and a kubernetes client of it, once per module: the kube tests'
# default (a module that needs other nodes or timings defines its own `emulator`).
@pytest.fixture(scope="module")
def emulator():
    from gpuprov.lab.kube.testing import running_emulator

    with running_emulator() as emu:
        yield emu


@pytest.fixture(scope="module")
def api(emulator):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = emulator.url
    with client.ApiClient(cfg) as api_client:
        yield api_client
