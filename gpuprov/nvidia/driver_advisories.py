"""NVIDIA's security bulletins for the datacenter Linux GPU driver, and the first fixed version
of each branch.

One table for verify's driver.security, the nvidia_driver role's check of a pinned version
and `gpuprov hw choose`. Every row is read from NVIDIA's machine-readable CVE records in the
public repository NVIDIA/product-security, <year>/<bulletin>/CVE-*.json (CVE JSON 5): the
`affected` entries of product "Tesla" on platform "Linux(R<branch>)", whose version reads "All
driver versions prior to <first fixed version>". A bulletin is here when at least one of its
CVE records has such an entry (bulletin 5557, July 2024, fixes the Windows driver only and is
not). Dates and titles: the year's README.md in the same repository (5861: its 5861.md,
"Updated 2026-09-30"; the index's 2026 README ends 2026-08-04). The records are kept (NVIDIA's
.sha256 beside each) under tests/fixtures/nvidia/product-security/, as read through the stored
public index, and tests/unit/test_driver_advisories.py checks this table against them.

Sources: NVIDIA/product-security; the commits read are in
tests/fixtures/nvidia/product-security/README.md. Retrieved 2026-11-26.

NOT checked: the dates of 2024's rows (5520, 5551, 5586). The stored index holds no
2024/README.md that lists 2024's driver bulletins; their titles and CVE lists are checked against
each bulletin's own README.md, which gives no date.

Bulletin 5861 (114 CVEs: Windows, Linux, vGPU) is read from its own 5861.md (commit
08d1a287ef3f1fc250f3bdaca913a1d4cff6f5b3), every page: the Details table gives each CVE's
score and severity, the Security Updates table the Tesla rows on Linux(R<branch>). 80 of its
CVEs touch the datacenter Linux driver; CVE-2026-47549 and CVE-2026-47586 name no Tesla R580
fix (for 47586 NVIDIA lists GeForce and RTX R580, not Tesla), so R580 is not below them. The
rows read are kept, trimmed (the file is 304,399 characters), as
tests/fixtures/nvidia/product-security/2026/5861/5861.trimmed.md; the record
CVE-2026-47501.json is kept whole, and CVE-2026-47549.json and CVE-2026-47586.json were read
to cross-check the two without R580.

A branch gets fixes only while a bulletin lists it. NVIDIA's bulletins say of the rest:
"Earlier software GPU branch releases that support these products might also be affected. If
you are using an earlier branch release for which an update version is not listed above,
upgrade to the latest branch release" (2026/5861/5861.json, Bulletin Notes). So a branch has no
floor for a bulletin that does not list it: gpuprov names the bulletins it misses instead of
inventing one.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpuprov.nvidia import driver_lifecycle

BULLETIN_URL = "https://nvidia.custhelp.com/app/answers/detail/a_id/{}"
RECORDS_URL = "https://github.com/NVIDIA/product-security/tree/main/{year}/{bulletin}"
# A bulletin's CVE list in a message: whole up to LIST_AT_MOST names (5821's 11 for R580), else
# the first LIST_SHOWN and how many more (details and --json carry every one).
LIST_AT_MOST = 12
LIST_SHOWN = 3


def _key(version: str) -> tuple[int, ...]:
    """'580.178.04' -> (580, 178, 4); a packaging revision or epoch is dropped."""
    upstream = str(version).split(":")[-1].split("-")[0].split("~")[0]
    try:
        return tuple(int(part) for part in upstream.split("."))
    except ValueError:
        raise ValueError(f"not a driver version: {version!r}") from None


@dataclass(frozen=True)
class DriverCve:
    cve: str
    score: float  # CVSS base score, as the record gives it
    severity: str  # the record's baseSeverity, lower case
    fixed: Mapping[int, str]  # branch -> first fixed version (Tesla, Linux)


@dataclass(frozen=True)
class DriverBulletin:
    bulletin: int
    date: str  # initial publication, YYYY-MM-DD
    title: str
    cves: tuple[DriverCve, ...]
    # Every CVE of the bulletin that touches the datacenter Linux driver is listed.
    complete: bool = True
    fixed: Mapping[int, str] = field(init=False)  # branch -> first fixed version

    def __post_init__(self) -> None:
        fixed: dict[int, str] = {}
        for cve in self.cves:
            for branch, version in cve.fixed.items():
                if branch not in fixed or _key(version) > _key(fixed[branch]):
                    fixed[branch] = version
        object.__setattr__(self, "fixed", MappingProxyType(fixed))

    @property
    def url(self) -> str:
        return BULLETIN_URL.format(self.bulletin)

    @property
    def records(self) -> str:
        return RECORDS_URL.format(year=self.date[:4], bulletin=self.bulletin)

    @property
    def day(self) -> datetime.date:
        return datetime.date.fromisoformat(self.date)

    @property
    def score(self) -> float:
        return max(c.score for c in self.cves)

    @property
    def severity(self) -> str:
        return max(self.cves, key=lambda c: c.score).severity

    def cves_for(self, branch: int) -> list[str]:
        return [c.cve for c in self.cves if branch in c.fixed]

    def cve_list(self, branch: int | None = None) -> str:
        """'CVE-2026-24187, CVE-2026-24190, ...'; a long list is cut to its first CVEs and
        'and N more' (5861 fixes 80 in the datacenter driver: the message of verify's check and
        the health agent's condition, bounded to 1024 characters, would not hold them), and an
        incomplete row ends in 'and others'."""
        names = self.cves_for(branch) if branch is not None else [c.cve for c in self.cves]
        if len(names) > LIST_AT_MOST:
            names = names[:LIST_SHOWN] + [f"{len(names) - LIST_SHOWN} more"]
            names[-2:] = [" and ".join(names[-2:])]
        return ", ".join(names) + ("" if self.complete else " and others")


def _cve(cve: str, score: float, severity: str, fixed: dict[int, str]) -> DriverCve:
    return DriverCve(cve, float(score), severity, MappingProxyType(fixed))


def _bulletin(bulletin: int, date: str, title: str, cves: tuple[DriverCve, ...],
              complete: bool = True) -> DriverBulletin:
    return DriverBulletin(bulletin, date, title, cves, complete)


# Bulletin 5861's datacenter Linux fixes: the same four versions for 78 of its 80 CVEs; two
# (CVE-2026-47549, -47586) have no Tesla R580 row in NVIDIA's table.
_FIXED_5861 = {580: '580.178.04', 595: '595.91.07', 610: '610.57.04', 615: '615.71.09'}
_FIXED_5861_NOT_R580 = {595: '595.91.07', 610: '610.57.04', 615: '615.71.09'}

# Oldest first.
BULLETINS: tuple[DriverBulletin, ...] = (
    _bulletin(5520, '2024-02-28', 'Security Bulletin: NVIDIA GPU Display Driver - February 2024', (
        _cve('CVE-2022-42265', 5.3, 'medium', {470: '470.239.06'}),
        _cve('CVE-2024-0074', 7.1, 'high',
             {470: '470.239.06', 535: '535.161.07', 550: '550.54.14'}),
        _cve('CVE-2024-0075', 6.1, 'medium', {535: '535.161.07', 550: '550.54.14'}),
    )),
    _bulletin(5551, '2024-06-06', 'Security Bulletin: NVIDIA GPU Display Driver - June 2024', (
        _cve('CVE-2024-0090', 7.8, 'high',
             {470: '470.256.02', 535: '535.183.01', 550: '550.90.07'}),
        _cve('CVE-2024-0091', 7.8, 'high', {550: '550.90.07'}),
        _cve('CVE-2024-0092', 5.5, 'medium',
             {470: '470.256.02', 535: '535.183.01', 550: '550.90.07'}),
    )),
    _bulletin(5586, '2024-10-22', 'Security Bulletin: NVIDIA GPU Display Driver - October 2024', (
        _cve('CVE-2024-0126', 8.2, 'high', {535: '535.216.01', 550: '550.127.05'}),
    )),
    _bulletin(5614, '2025-01-16', 'Security Bulletin: NVIDIA GPU Display Driver - January 2025', (
        _cve('CVE-2024-0131', 4.4, 'medium',
             {535: '535.230.02', 550: '550.144.03', 570: '570.86.15'}),
        _cve('CVE-2024-0147', 5.5, 'medium',
             {535: '535.230.02', 550: '550.144.03', 570: '570.86.15'}),
        _cve('CVE-2024-0149', 3.3, 'low', {535: '535.230.02', 550: '550.144.03', 570: '570.86.15'}),
        _cve('CVE-2024-0150', 7.1, 'high',
             {535: '535.230.02', 550: '550.144.03', 570: '570.86.15'}),
        _cve('CVE-2024-53869', 5.5, 'medium', {550: '550.144.03', 570: '570.86.15'}),
    )),
    _bulletin(5630, '2025-04-24', 'Security Bulletin: NVIDIA GPU Display Driver - April 2025', (
        _cve('CVE-2025-23244', 7.8, 'high',
             {535: '535.247.01', 550: '550.163.01', 570: '570.133.07', 575: '575.51.02'}),
    )),
    _bulletin(5670, '2025-07-24', 'Security Bulletin: GPU Display Driver - July 2025', (
        _cve('CVE-2025-23279', 7, 'high', {570: '570.172.08'}),
        _cve('CVE-2025-23286', 4.4, 'medium', {535: '535.261.03'}),
    )),
    _bulletin(5703, '2025-10-09', 'Security Bulletin: NVIDIA GPU Display Driver - October 2025', (
        _cve('CVE-2025-23280', 7, 'high', {535: '535.274.02', 570: '570.195.03', 580: '580.95.05'}),
        _cve('CVE-2025-23282', 7, 'high', {535: '535.274.02', 570: '570.195.03', 580: '580.95.05'}),
        _cve('CVE-2025-23300', 5.5, 'medium',
             {535: '535.274.02', 570: '570.195.03', 580: '580.95.05'}),
        _cve('CVE-2025-23330', 5.5, 'medium',
             {535: '535.274.02', 570: '570.195.03', 580: '580.95.05'}),
        _cve('CVE-2025-23332', 5, 'medium',
             {535: '535.274.02', 570: '570.195.03', 580: '580.95.05'}),
        _cve('CVE-2025-23345', 4.4, 'medium',
             {535: '535.274.02', 570: '570.195.03', 580: '580.95.05'}),
    )),
    _bulletin(5747, '2026-01-28', 'Security Bulletin: GPU Display Driver - January 2026', (
        _cve('CVE-2025-33219', 7.8, 'high',
             {535: '535.288.01', 570: '570.211.01', 580: '580.126.09', 590: '590.48.01'}),
        _cve('CVE-2025-33220', 7.8, 'high',
             {535: '535.288.01', 570: '570.211.01', 580: '580.126.09', 590: '590.48.01'}),
    )),
    _bulletin(5821, '2026-05-19', 'Security Bulletin: GPU Display Driver - May 2026', (
        _cve('CVE-2025-33221', 4.4, 'medium',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24182', 6.5, 'medium',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24187', 8.8, 'high',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24190', 7.8, 'high',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24192', 7.8, 'high',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24193', 7.8, 'high', {535: '535.309.01', 580: '580.159.03'}),
        _cve('CVE-2026-24194', 7.8, 'high',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24196', 7.1, 'high',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24197', 6.5, 'medium',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24198', 5.6, 'medium', {580: '580.159.03', 595: '595.71.05'}),
        _cve('CVE-2026-24199', 4.7, 'medium',
             {535: '535.309.01', 580: '580.159.03', 595: '595.71.05'}),
    )),
    _bulletin(5861, '2026-09-30', 'Security Bulletin: GPU Display Driver - September 2026', (
        _cve('CVE-2026-47489', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47491', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47492', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47494', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47500', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47501', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47502', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47504', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47507', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47508', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47509', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47510', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47511', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47512', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47513', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47514', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47515', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47516', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47517', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47518', 6, 'medium', _FIXED_5861),
        _cve('CVE-2026-47522', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47523', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47524', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47525', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47526', 4.4, 'medium', _FIXED_5861),
        _cve('CVE-2026-47527', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47528', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47529', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47530', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47531', 4.4, 'medium', _FIXED_5861),
        _cve('CVE-2026-47532', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47533', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47534', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47537', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47538', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47540', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47542', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47543', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47545', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47546', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47547', 6.7, 'medium', _FIXED_5861),
        _cve('CVE-2026-47548', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47549', 5.5, 'medium', _FIXED_5861_NOT_R580),
        _cve('CVE-2026-47551', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47552', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47553', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47554', 7.1, 'high', _FIXED_5861),
        _cve('CVE-2026-47555', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47556', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47557', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47558', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47559', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47560', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47561', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47562', 4.4, 'medium', _FIXED_5861),
        _cve('CVE-2026-47563', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47565', 6.4, 'medium', _FIXED_5861),
        _cve('CVE-2026-47566', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47567', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47568', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47569', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47572', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47586', 6.4, 'medium', _FIXED_5861_NOT_R580),
        _cve('CVE-2026-47587', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47588', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47589', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47590', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47591', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47592', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47594', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47595', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47596', 7, 'high', _FIXED_5861),
        _cve('CVE-2026-47597', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47598', 7, 'high', _FIXED_5861),
        _cve('CVE-2026-47599', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47600', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47601', 7.8, 'high', _FIXED_5861),
        _cve('CVE-2026-47602', 7.1, 'high', _FIXED_5861),
        _cve('CVE-2026-47603', 5.5, 'medium', _FIXED_5861),
        _cve('CVE-2026-47604', 5.5, 'medium', _FIXED_5861),
    )),
)


def branch_of(version: str) -> int:
    return _key(version)[0]


def listed(branch: int) -> list[DriverBulletin]:
    """The bulletins that give the branch a fixed version, oldest first."""
    return [b for b in BULLETINS if branch in b.fixed]


def floor(branch: int) -> tuple[str, DriverBulletin] | None:
    """The branch's first version with every fix in the table, and the newest bulletin that set
    it; None when no bulletin lists the branch."""
    bulletins = listed(branch)
    if not bulletins:
        return None
    newest = max(bulletins, key=lambda b: _key(b.fixed[branch]))
    return newest.fixed[branch], newest


def missed(branch: int) -> list[DriverBulletin]:
    """The bulletins that fix the driver but not this branch, since the branch's last fix (or,
    for a branch no bulletin lists, since NVIDIA's end of life for it): a branch that ended
    gets no fixes, and no floor is invented for it."""
    bulletins = listed(branch)
    if bulletins:
        since = bulletins[-1].day
    else:
        info = driver_lifecycle.BRANCHES.get(branch)
        end = info.eol_date() if info else None
        if end is None:
            return []
        since = end
    return [b for b in BULLETINS if b.day > since and branch not in b.fixed]


@dataclass(frozen=True)
class Assessment:
    """What the table says of one driver version."""

    version: str
    branch: int
    below: tuple[DriverBulletin, ...]  # bulletins whose fix for the branch it lacks
    missed: tuple[DriverBulletin, ...]  # bulletins that do not fix the branch at all
    install: str | None  # the branch's first version with every fix; None: no bulletin lists it

    @property
    def vulnerable(self) -> bool:
        return bool(self.below)

    def cves(self) -> list[str]:
        return [cve for b in self.below for cve in b.cves_for(self.branch)]

    def below_text(self) -> str:
        """'bulletin 5821 (2026-05-19: CVE-..., ...), bulletin 5861 (...)'."""
        return "; ".join(f"bulletin {b.bulletin} ({b.date}, {b.severity} {b.score}: "
                         f"{b.cve_list(self.branch)})" for b in self.below)

    def missed_text(self) -> str:
        return "; ".join(f"bulletin {b.bulletin} ({b.date}: {b.cve_list()}; fixed in "
                         + ", ".join(f"R{br} {v}" for br, v in sorted(b.fixed.items())) + ")"
                         for b in self.missed)


def assess(version: str) -> Assessment:
    """The bulletins a driver of this version ("580.105.08", "580.105.08-1") lacks the fix of,
    and those its branch gets no fix from. Raises ValueError for text that is no version."""
    have = _key(version)
    branch = have[0]
    below = tuple(b for b in BULLETINS if branch in b.fixed and have < _key(b.fixed[branch]))
    found = floor(branch)
    return Assessment(version=str(version), branch=branch, below=below,
                      missed=tuple(missed(branch)), install=found[0] if found else None)


def fixed_branches(day: datetime.date) -> list[tuple[int, str]]:
    """(branch, floor) of the branches NVIDIA supports on `day` that the newest bulletin lists:
    where a node on an ended branch can go."""
    newest = BULLETINS[-1]
    supported = {b.branch for b in driver_lifecycle.supported(day)}
    return [(br, v) for br, v in sorted(newest.fixed.items()) if br in supported]
