"""Known vulnerabilities of NVIDIA's container toolkit, and the version that fixes each.

One table for `gpuprov verify` (runtime.toolkit-version) and for the nvidia_container_toolkit
role's pin (tests/unit keep the pin above every entry). Each entry names NVIDIA's security
bulletin (https://nvidia.custhelp.com/app/answers/detail/a_id/<id>) and the first version
NVIDIA's release notes (NVIDIA/cloud-native-docs container-toolkit/release-notes.md) give
as fixed. Retrieved 2026-11-25. Where sources disagreed, NVIDIA's release notes won:
Tenable (plugin 214271) puts the fix of CVE-2024-0135..0137 at 1.17.1, NVIDIA at 1.17.3.
CVE-2026-24260's fixed version and bulletin id (5850, June 2026) come from public advisories
citing NVIDIA's bulletin (Amazon ALAS2023NVIDIA-2026-297), not from NVIDIA's release notes,
which give no CVE line for 1.19.1. Checked again 2026-11-26 for the pin 1.20.1 (September 2026):
no NVIDIA bulletin names the toolkit after 5850 (NVIDIA/product-security 2026/README.md, to
2026-08-18, and the GPU Display Driver bulletin 5861 of 2026-09-30); 1.20.1 is a bug-fix
release (the release-1.20 backports after v1.20.0 in NVIDIA/nvidia-container-toolkit: the
nvidia-cdi-refresh unit creates the control device nodes, X.Org module mounts, the rootfs read
from the OCI state), so the table is unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BULLETIN_URL = "https://nvidia.custhelp.com/app/answers/detail/a_id/{}"


@dataclass(frozen=True)
class Advisory:
    cve: str
    fixed_in: str  # upstream version, without the package revision
    severity: str  # CVSS 3.1 as NVIDIA rates it
    bulletin: int  # NVIDIA's a_id
    summary: str

    @property
    def url(self) -> str:
        return BULLETIN_URL.format(self.bulletin)


ADVISORIES = (
    Advisory("CVE-2024-0132", "1.16.2", "critical 9.0", 5582,
             "TOCTOU with a crafted image: container escape, host filesystem access"),
    Advisory("CVE-2024-0133", "1.16.2", "medium 4.1", 5582,
             "a crafted image can create empty files or directories on the host"),
    Advisory("CVE-2024-0134", "1.17.0", "medium 4.1", 5585,
             "symlinks created at container start can point outside the container root"),
    Advisory("CVE-2024-0135", "1.17.3", "medium 5.0", 5599,
             "a crafted image can modify a host binary"),
    Advisory("CVE-2024-0136", "1.17.3", "high 7.6", 5599,
             "untrusted code can get read/write access to host devices (non-default config)"),
    Advisory("CVE-2024-0137", "1.17.3", "medium 5.5", 5599,
             "untrusted code can run in the host's network namespace (non-default config)"),
    Advisory("CVE-2025-23359", "1.17.4", "high 8.3", 5616,
             "TOCTOU bypassing CVE-2024-0132's fix through CUDA compat library symlinks"),
    Advisory("CVE-2025-23266", "1.17.8", "critical 9.0", 5659,
             "LD_PRELOAD in the enable-cuda-compat hook runs code as root on the host"),
    Advisory("CVE-2025-23267", "1.17.8", "high 8.5", 5659,
             "link following in the update-ldcache hook: data tampering, denial of service"),
    Advisory("CVE-2026-24260", "1.19.1", "high 8.5", 5850,
             "TOCTOU race: code execution, privilege escalation, data tampering"),
)

_VERSION = re.compile(r"^(?:\d+:)?(\d+(?:\.\d+)*)")


def upstream(version: str) -> tuple[int, ...] | None:
    """'1.17.7-1' (Debian), '0:1.17.7-1' (rpm with epoch), '1.18.0~rc.1-1' -> (1, 17, 7) ...;
    None when it is no version. The pre-release mark is dropped here; vulnerabilities()
    counts a pre-release as older than its release."""
    match = _VERSION.match(str(version or "").strip())
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def vulnerabilities(version: str) -> list[Advisory]:
    """The advisories an installed toolkit of this version is affected by."""
    have = upstream(version)
    if have is None:
        raise ValueError(f"not a toolkit version: {version!r}")
    affected = []
    for advisory in ADVISORIES:
        fixed = upstream(advisory.fixed_in)
        prerelease = "~" in str(version) and have[:len(fixed)] == fixed
        if have < fixed or prerelease:
            affected.append(advisory)
    return affected


def minimum_safe() -> str:
    """The lowest version with every fix in the table."""
    return max((a.fixed_in for a in ADVISORIES), key=upstream)
