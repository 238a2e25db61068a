"""gpuprov/nvidia/driver_lifecycle.py: NVIDIA's datacenter branches and their end of life, as
NVIDIA's "Supported Drivers and CUDA Toolkit Versions" pages (580, 615 and 620 editions)
list them; a pin to a branch NVIDIA never released is refused."""

from __future__ import annotations

import datetime

import pytest

from gpuprov.nvidia import driver_lifecycle as lc
from gpuprov.nvidia.driver_branches import choose_branch

TODAY = datetime.date(2026, 11, 25)
P100 = "10de:15f8"


@pytest.mark.parametrize(("branch", "kind", "eol", "cuda"), [
    (470, "LTSB", "2024-07", "11.4"), (535, "LTSB", "2026-06", "12.2"),
    (570, "PB", "2026-02", "12.8"), (580, "LTSB", "2028-06", "13.0"),
    (595, "PB", "2027-03", "13.2"), (620, "LTSB", "2029-09", "13.5"),
    (590, "NFB", None, "13.1"),
])
def test_the_table_says_what_nvidias_pages_say(branch, kind, eol, cuda):
    info = lc.BRANCHES[branch]
    assert (info.kind, info.eol, info.cuda) == (kind, eol, cuda)
    assert info.source


def test_only_580_595_and_620_are_supported_on_the_day_of_writing():
    assert [b.branch for b in lc.supported(TODAY)] == [580, 595, 620]


@pytest.mark.parametrize(("branch", "today", "words"), [
    (535, TODAY, "R535 (long term support branch) reached NVIDIA's end of life 2026-06"),
    (470, TODAY, "reached NVIDIA's end of life 2024-07"),
    (550, TODAY, "reached NVIDIA's end of life by 2025-08"),  # only known to have ended
    (595, datetime.date(2027, 1, 15), "R595 (production branch) reaches NVIDIA's end of "
                                      "life in 2027-03"),
    (535, datetime.date(2026, 6, 30), "reaches NVIDIA's end of life in 2026-06"),
    (535, datetime.date(2026, 7, 1), "reached"),
])
def test_an_ended_or_ending_branch_gets_a_note(branch, today, words):
    assert words in lc.eol_note(branch, today)


@pytest.mark.parametrize(("branch", "today"), [
    (580, TODAY), (620, TODAY), (590, TODAY), (615, TODAY), (595, datetime.date(2026, 12, 1)),
])
def test_a_supported_branch_or_one_without_a_date_gets_none(branch, today):
    assert lc.eol_note(branch, today) is None


@pytest.mark.parametrize("pin", [999, "585", "600"])
def test_a_pin_nvidia_never_released_is_refused_with_the_real_branches(pin):
    with pytest.raises(ValueError, match=f"pinned driver branch {int(pin)} is not a branch "
                                         "NVIDIA released; its datacenter branches: 410, "):
        choose_branch([P100], "debian", "12", pinned_branch=pin)
