"""The driver advisories table (gpuprov/nvidia/driver_advisories.py) against NVIDIA's own CVE
records, kept under tests/fixtures/nvidia/product-security/ as read through the stored public index
(NVIDIA/product-security, <year>/<bulletin>/CVE-*.json, each with NVIDIA's .sha256; the README
there names the commits), and what the table says of versions."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from gpuprov.nvidia import driver_advisories as adv

RECORDS = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia" / "product-security"
# Tesla (NVIDIA's product name for the datacenter driver) on "Linux(R580)"; vGPU and the
# other products are not what gpuprov installs.
PLATFORM = re.compile(r"Linux\(R(\d+)\)")
FIXED = re.compile(r"^All driver versions? prior to (\d+\.\d+(?:\.\d+)?)$")
# Bulletins no kept index lists: the index's 2026/README.md ends 2026-08-04.
NOT_IN_README = {5861}
# Bulletins whose every CVE is read from the bulletin's own markdown (its Details and Security
# Updates tables), trimmed to the rows the table needs; the README there says how.
TRIMMED = {5861: RECORDS / "2026" / "5861" / "5861.trimmed.md"}
# The stored index holds no 2024/README.md that lists 2024's driver bulletins (its versions end
# with November's, without them): their titles and CVE lists are checked against each bulletin's
# own README.md (2024/<bulletin>/README.md), which gives no date. Their dates are NOT checked
# here (driver_advisories.py says so).
DATE_NOT_IN_INDEX = {5520, 5551, 5557, 5586}


def _records() -> list[Path]:
    return sorted(RECORDS.glob("20*/*/CVE-*.json"))


def _datacenter_linux(record: dict) -> dict[int, str]:
    """Branch -> first fixed version, from the record's Tesla entries on Linux."""
    fixed: dict[int, str] = {}
    for entry in record["containers"]["cna"]["affected"]:
        if entry["product"] != "Tesla":
            continue
        for platform in entry.get("platforms", []):
            match = PLATFORM.fullmatch(platform)
            if match is None:
                continue
            (version,) = entry["versions"]
            assert version["status"] == "affected"
            fixed_in = FIXED.match(version["version"])
            assert fixed_in, f"unexpected version text {version['version']!r}"
            fixed[int(match.group(1))] = fixed_in.group(1)
    return fixed


def _readme_rows() -> dict[int, tuple[str, str | None, list[str]]]:
    """Bulletin -> (title, initial publication date, CVE ids), from each year's README.md, and
    (title, None, CVE ids) from a bulletin's own README.md where no year's README lists it."""
    rows: dict[int, tuple[str, str | None, list[str]]] = {}
    for readme in RECORDS.glob("20*/*/README.md"):
        text = readme.read_text()
        title = re.search(r"^ - (.+)$", text, re.M)
        assert title, readme
        rows[int(readme.parent.name)] = (title.group(1).strip(), None,
                                         re.findall(r"\[(CVE-[\d-]+)\.json\]", text))
    for readme in RECORDS.glob("20*/README.md"):
        for line in readme.read_text().splitlines():
            match = re.match(r"\| \[(\d+)\]\([^)]*\) \| ([^|]+) \| (\S+) \| \S+ \| (.*)\|$",
                             line)
            if match:
                rows[int(match.group(1))] = (match.group(2).strip(), match.group(3),
                                             re.findall(r"\[(CVE-[\d-]+)\]", match.group(4)))
    return rows


def _trimmed(path: Path) -> tuple[dict[str, tuple[float, str]], dict[str, dict[int, str]]]:
    """(CVE -> (base score, severity)) from the Details rows and (CVE -> branch -> first fixed
    version) from the Security Updates rows of product Tesla on Linux(R<branch>)."""
    scores: dict[str, tuple[float, str]] = {}
    fixed: dict[str, dict[int, str]] = {}
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not cells[0].startswith("CVE-"):
            continue
        if len(cells) == 3:
            scores[cells[0]] = (float(cells[1]), cells[2].lower())
            continue
        cve, product, platform, affected, updated = cells
        match = PLATFORM.fullmatch(platform)
        assert product == "Tesla" and match, line
        fixed_in = FIXED.match(affected)
        assert fixed_in and fixed_in.group(1) == updated, line
        fixed.setdefault(cve, {})[int(match.group(1))] = updated
    return scores, fixed


TABLE = {b.bulletin: b for b in adv.BULLETINS}
TABLE_CVES = {c.cve: (b, c) for b in adv.BULLETINS for c in b.cves}


def test_the_fixtures_are_nvidias_records_unchanged():
    records = _records()
    assert len(records) >= len([c for c, (b, _) in TABLE_CVES.items() if b.bulletin not in TRIMMED])
    for path in records:
        published = path.with_name(path.name + ".sha256").read_text().split()[0]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == published, path


@pytest.mark.parametrize("path", _records(), ids=lambda p: p.stem)
def test_every_record_with_a_datacenter_linux_entry_is_in_the_table_as_it_reads(path):
    record = json.loads(path.read_text())
    cve = record["cveMetadata"]["cveId"]
    assert path.stem == cve
    fixed = _datacenter_linux(record)
    if not fixed:
        # 5557 (July 2024) fixes the Windows driver only: no row for it.
        assert cve not in TABLE_CVES
        assert int(path.parent.name) not in TABLE
        return
    bulletin, row = TABLE_CVES[cve]
    assert bulletin.bulletin == int(path.parent.name)
    assert bulletin.date.startswith(path.parent.parent.name)
    assert dict(row.fixed) == fixed
    (metric,) = record["containers"]["cna"]["metrics"]
    cvss = next(v for k, v in metric.items() if k.startswith("cvssV3"))
    assert row.score == cvss["baseScore"]
    assert row.severity == cvss["baseSeverity"].lower()


def test_every_cve_in_the_table_cites_a_recorded_file():
    recorded = {p.stem: p for p in _records()}
    trimmed = {n: set(_trimmed(p)[1]) for n, p in TRIMMED.items()}
    for cve, (bulletin, _) in TABLE_CVES.items():
        if cve in trimmed.get(bulletin.bulletin, ()):
            continue
        assert cve in recorded, f"{cve} (bulletin {bulletin.bulletin}) has no record"
        assert recorded[cve].parent.name == str(bulletin.bulletin)


@pytest.mark.parametrize("bulletin", sorted(TRIMMED))
def test_a_trimmed_bulletin_is_in_the_table_as_it_reads(bulletin):
    """Every CVE of the bulletin with a Tesla Linux row is in the table with those fixed versions
    and the Details table's score and severity; no other CVE of it is."""
    scores, fixed = _trimmed(TRIMMED[bulletin])
    assert len(scores) == 114 and len(fixed) == 80  # as counted in 5861.md
    assert set(fixed) <= set(scores)
    row = TABLE[bulletin]
    assert row.complete
    assert {c.cve: dict(c.fixed) for c in row.cves} == fixed
    assert {c.cve: (c.score, c.severity) for c in row.cves} == {c: scores[c] for c in fixed}


def test_a_trimmed_bulletin_agrees_with_its_kept_records():
    for bulletin, path in TRIMMED.items():
        _, fixed = _trimmed(path)
        kept = [p for p in _records() if p.parent.name == str(bulletin)]
        assert kept
        for record in kept:
            assert _datacenter_linux(json.loads(record.read_text())) == fixed[record.stem]


def test_bulletins_as_nvidias_index_lists_them():
    rows = _readme_rows()
    for bulletin in adv.BULLETINS:
        if bulletin.bulletin in NOT_IN_README:
            assert bulletin.bulletin not in rows
            assert bulletin.bulletin in TRIMMED  # read whole from its own markdown instead
            continue
        title, date, cves = rows[bulletin.bulletin]
        assert bulletin.title == title
        if date is None:
            assert bulletin.bulletin in DATE_NOT_IN_INDEX
        else:
            assert bulletin.date == date
        assert {c.cve for c in bulletin.cves} <= set(cves)
        assert bulletin.complete


def test_every_driver_bulletin_in_the_index_is_decided():
    """Each bulletin of 2024 on whose title names the display driver is in the table or has a
    recorded file showing it does not touch the datacenter Linux driver. For 2024 only the
    bulletins kept here are known (no year's README for 2024: DATE_NOT_IN_INDEX)."""
    decided = set(TABLE) | {int(p.parent.name) for p in _records()}
    driver = {n for n, (title, date, _) in _readme_rows().items()
              if "Display Driver" in title and (date is None or date >= "2024")}
    assert driver and driver <= decided


def test_the_table_is_oldest_first_with_one_floor_per_branch_and_bulletin():
    dates = [b.date for b in adv.BULLETINS]
    assert dates == sorted(dates)
    for bulletin in adv.BULLETINS:
        for branch, version in bulletin.fixed.items():
            assert {c.fixed[branch] for c in bulletin.cves if branch in c.fixed} == {version}


def test_bulletin_5861_floors_as_the_issue_reports():
    b = TABLE[5861]
    assert dict(b.fixed) == {580: "580.178.04", 595: "595.91.07", 610: "610.57.04",
                             615: "615.71.09"}


def test_below_the_floor_names_bulletins_and_the_version_to_install():
    a = adv.assess("580.105.08-1")
    assert a.vulnerable
    assert [b.bulletin for b in a.below] == [5747, 5821, 5861]
    assert a.install == "580.178.04"
    assert "CVE-2026-47501" in a.cves() and "CVE-2025-33219" in a.cves()
    assert a.missed == ()


def test_at_the_floor_nothing_is_missing():
    a = adv.assess("580.178.04")
    assert not a.vulnerable and a.missed == () and a.install == "580.178.04"
    assert not adv.assess("595.91.07").vulnerable


def test_a_version_between_two_fixes_lacks_only_the_later_ones():
    a = adv.assess("580.159.03")
    assert [b.bulletin for b in a.below] == [5861]


def test_an_ended_branch_gets_no_invented_floor():
    # R550 (ended): last listed in 5630 (550.163.01); later bulletins fix other branches only.
    a = adv.assess("550.163.01")
    assert not a.vulnerable
    assert a.install == "550.163.01"  # its last fix, not a version NVIDIA never named
    assert [b.bulletin for b in a.missed] == [5670, 5703, 5747, 5821, 5861]
    assert all(550 not in b.fixed for b in a.missed)


def test_an_ended_branch_below_its_last_floor_is_vulnerable_and_misses_the_rest():
    # Debian 12's own R535: 535.261.03 (5670's fix), below 5703, 5747 and 5821.
    a = adv.assess("535.261.03")
    assert [b.bulletin for b in a.below] == [5703, 5747, 5821]
    assert a.install == "535.309.01"
    assert [b.bulletin for b in a.missed] == [5861]


def test_a_branch_no_bulletin_lists_and_still_supported_has_nothing_to_say():
    a = adv.assess("620.10.01")
    assert (a.below, a.missed, a.install) == ((), (), None)


def test_a_long_cve_list_is_cut_and_says_how_many_more():
    b = TABLE[5861]
    assert b.cve_list(580) == (f"{b.cves_for(580)[0]}, {b.cves_for(580)[1]}, "
                               f"{b.cves_for(580)[2]} and {len(b.cves_for(580)) - 3} more")
    assert len(b.cves_for(580)) == 78 and len(b.cves_for(595)) == 80
    # Lists up to the bound are whole: 5821's eleven for R580.
    assert TABLE[5821].cve_list(580) == ", ".join(TABLE[5821].cves_for(580))
    # Every CVE is still there for --json and the details.
    assert len(adv.assess("580.105.08").cves()) == 2 + 11 + 78


def test_the_message_of_a_branch_below_every_fix_fits_a_condition():
    # The health agent's condition message holds 1024 characters; x.0.0 lacks every fix.
    for branch in {br for b in adv.BULLETINS for br in b.fixed}:
        assert len(adv.assess(f"{branch}.0.0").below_text()) < 1024, branch


def test_not_a_version():
    with pytest.raises(ValueError, match="not a driver version"):
        adv.assess("latest")
