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
