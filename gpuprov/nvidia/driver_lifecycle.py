"""NVIDIA's datacenter driver branches: which exist, their kind, CUDA version and end of life.

Standard library only (shipped with driver_branches.py). The facts, each with its source
(retrieved 2026-11-25 through the project's search tools; NVIDIA's pages were read in stored
copies):

[DC620]  docs.nvidia.com/datacenter/tesla/drivers/620/supported-drivers-and-cuda-toolkit-
         versions.html: R580 LTSB EOL June 2028, R595 PB EOL March 2027, R620 LTSB EOL
         September 2029; "New Feature Branches are short-lived and do not have an
         end-of-life date".
[DC615]  the 615 edition of the same page (2026-09-09): R535 LTSB EOL June 2026, R610 NFB
         EOL August 2026.
[DC580]  the 580 edition (2025-08-04): R570 PB EOL February 2026; "All other previous driver
         branches not listed (such as R575, R565, R560, R550, R525, R515, R510, R495, R465,
         R460, R455, R450, R440, R418, R410) are end of life".
[CUDART] CUDA toolkit release notes, table 3 (toolkit -> minimum driver): the CUDA version
         each branch ships with up to 13.2; [REDIST] developer.download.nvidia.com/compute/
         nvidia-driver/redist/redistrib_<version>.json for 610 (13.3) and 620 (13.5).
[GO]     NVIDIA/gpu-operator issue #927: "R470 branch is EOL as of July 2024".
[AKS]    Azure/aks-gpu PR #113, quoting the `type` field of NVIDIA's releases.json.
[EOLD]   endoflife-date/endoflife.date products/nvidia-driver.md PR #10992: R615, NFB,
         2026-09-09 (CUDA 13.4: secondary sources only).

NOT confirmed: the month R525, R550, R560, R565 and R575 ended (only that NVIDIA's 2025-08
page lists them as ended: their `eol` is that page's month, marked approximate).
"""

from __future__ import annotations

import dataclasses
import datetime

LTSB, PB, NFB = "LTSB", "PB", "NFB"
KIND_NAMES = {LTSB: "long term support branch", PB: "production branch",
              NFB: "new feature branch"}
# A branch ending within this many days is reported as ending soon (verify, hw choose).
EOL_WARNING_DAYS = 90


@dataclasses.dataclass(frozen=True)
class Branch:
    branch: int
    kind: str | None  # LTSB | PB | NFB; None: not recorded
    eol: str | None  # "YYYY-MM", the last month of support; None: no date (NFB, or current)
    cuda: str | None  # the CUDA version the branch ships with
    eol_approximate: bool = False  # only known to have ended by then
    source: str = ""

    def eol_date(self) -> datetime.date | None:
        """The last day of the EOL month."""
        if self.eol is None:
            return None
        year, month = (int(part) for part in self.eol.split("-"))
        first_of_next = datetime.date(year + month // 12, month % 12 + 1, 1)
        return first_of_next - datetime.timedelta(days=1)


def _ended(branch: int, kind: str | None = None, cuda: str | None = None) -> Branch:
    return Branch(branch, kind, "2025-08", cuda, eol_approximate=True, source="DC580")


BRANCHES: dict[int, Branch] = {b.branch: b for b in (
    _ended(410), _ended(418), _ended(440), _ended(450, LTSB), _ended(455), _ended(460, PB),
    _ended(465, NFB), Branch(470, LTSB, "2024-07", "11.4", source="GO, AKS, CUDART"),
    _ended(495, NFB), _ended(510, PB), _ended(515, PB), _ended(520, NFB),
    _ended(525, PB, "12.0"),
    Branch(535, LTSB, "2026-06", "12.2", source="DC580, DC615, CUDART"),
    _ended(550, PB, "12.4"), _ended(560, NFB, "12.6"), _ended(565, NFB),
    Branch(570, PB, "2026-02", "12.8", source="DC580, CUDART"),
    _ended(575, NFB, "12.9"),
    Branch(580, LTSB, "2028-06", "13.0", source="DC615, DC620, CUDART"),
    Branch(590, NFB, None, "13.1", source="CUDART, REDIST"),
    Branch(595, PB, "2027-03", "13.2", source="DC615, DC620, CUDART"),
    Branch(610, NFB, "2026-08", "13.3", source="DC615, REDIST"),
    Branch(615, NFB, None, "13.4", source="EOLD"),
    Branch(620, LTSB, "2029-09", "13.5", source="DC620, REDIST"),
)}


def released(branch: int) -> bool:
    return branch in BRANCHES


def released_list() -> str:
    return ", ".join(str(b) for b in sorted(BRANCHES))


def supported(today: datetime.date) -> list[Branch]:
    """The LTS and production branches NVIDIA still supports on `today`, oldest first."""
    return [b for b in BRANCHES.values() if b.kind in (LTSB, PB)
            and b.eol_date() is not None and b.eol_date() >= today]


def eol_note(branch: int, today: datetime.date) -> str | None:
    """One line when the branch is past NVIDIA's end of life or ends within
    EOL_WARNING_DAYS (None otherwise, and for branches without a date)."""
    info = BRANCHES.get(branch)
    end = info.eol_date() if info else None
    if end is None:
        return None
    kind = KIND_NAMES.get(info.kind or "", "branch")
    when = f"by {info.eol}" if info.eol_approximate else info.eol
    if end < today:
        return f"R{branch} ({kind}) reached NVIDIA's end of life {when}"
    if (end - today).days <= EOL_WARNING_DAYS:
        return f"R{branch} ({kind}) reaches NVIDIA's end of life in {info.eol}"
    return None
