"""Installed NVIDIA driver and CUDA packages, and whether they are held.

dpkg: one `dpkg-query` call gives name, version and the selection state, where
"hold" is what `apt-mark hold` sets (so `apt-mark showhold` needs no second call).
rpm: `rpm -qa` with name patterns; holds come from the dnf/yum versionlock plugin's
list files, read directly because starting dnf takes seconds.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
from collections.abc import Callable

from .fs import Root

Runner = Callable[[list], "tuple[int, str, str]"]

# Driver-ish: the driver, its libraries, kernel module packages, firmware, container toolkit.
DRIVER_PACKAGE = re.compile(r"^(lib)?(nvidia|cuda)|^(kmod|dkms|firmware|xserver-xorg-video)-nvidia")
# A CUDA toolkit on the host (compilers, dev libraries, the toolkit metapackages).
# Not toolkit: cuda-drivers*, cuda-compat*, cuda-keyring, libcuda1 (the driver's libcuda).
CUDA_TOOLKIT_PACKAGE = re.compile(
    r"^(cuda|cuda-\d+-\d+|cuda-toolkit.*|nvidia-cuda-toolkit.*|nvidia-cuda-dev"
    r"|cuda-nvcc.*|cuda-compiler.*|cuda-libraries-dev.*|cuda-cudart-dev.*)$"
)
# The container runtime's package (its version decides whether it can inject CDI devices:
# gpuprov/runtime_mode.py).
RUNTIME_PACKAGE = re.compile(r"^(containerd(\.io)?|cri-o|docker-ce|docker\.io|moby-engine)$")
DPKG_FORMAT = "${Package}\\t${Version}\\t${Status}\\n"
RPM_FORMAT = "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\n"
RPM_PATTERNS = ("*nvidia*", "*cuda*", "containerd*", "cri-o*", "docker-ce")
VERSIONLOCK_FILES = (
    "/etc/dnf/plugins/versionlock.list",
    "/etc/yum/pluginconf.d/versionlock.list",
    "/etc/dnf/versionlock.toml",  # dnf5
)


SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def run_command(argv: list, path: str = SYSTEM_PATH) -> tuple[int, str, str]:
    exe = shutil.which(argv[0], path=path)
    if exe is None:
        return 127, "", f"{argv[0]}: not found"
    proc = subprocess.run(
        [exe, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
        env={"LC_ALL": "C", "PATH": path},
    )
    return proc.returncode, proc.stdout, proc.stderr


def parse_dpkg_query(text: str) -> list[dict]:
    """Lines of DPKG_FORMAT; Status is "<selection> <flag> <state>", e.g. "hold ok installed"."""
    packages = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, version, status = parts
        words = status.split()
        if len(words) != 3 or words[2] in ("not-installed", "config-files"):
            continue
        packages.append(
            {"name": name, "version": version, "state": words[2], "held": words[0] == "hold"}
        )
    return packages


def parse_rpm_query(text: str) -> list[dict]:
    packages = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        name, evr, arch = parts
        packages.append(
            {
                "name": name,
                "version": evr[2:] if evr.startswith("0:") else evr,
                "state": "installed",
                "held": False,
                "arch": arch,
                "_evr": evr,
            }
        )
    return packages


def parse_versionlock(text: str) -> list[str]:
    """Lock patterns, as globs over "name-[epoch:]version-release.arch".

    dnf4/yum list files hold one such pattern per line ("!" lines exclude, not lock);
    dnf5's versionlock.toml names packages (`name = "..."`), locked at any version.
    """
    toml_names = re.findall(r'^\s*name\s*=\s*"([^"]+)"', text, re.MULTILINE)
    if toml_names:
        return [f"{name}-[0-9]*" for name in toml_names]
    return [
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "!"))
    ]


def is_locked(package: dict, patterns: list[str]) -> bool:
    evr = package["_evr"]
    name, arch = package["name"], package.get("arch")
    candidates = (f"{name}-{evr}.{arch}", f"{name}-{evr.split(':', 1)[-1]}.{arch}")
    return any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns)


def _manager(root: Root) -> str | None:
    if root.exists("/var/lib/dpkg/status"):
        return "dpkg"
    if root.exists("/var/lib/rpm") or root.exists("/usr/lib/sysimage/rpm"):
        return "rpm"
    return None


def query(root: Root, run: Runner = run_command, rpm_patterns: tuple = RPM_PATTERNS) -> dict:
    """The package manager and its installed packages: {"manager", "error", "packages"}.

    dpkg: every installed package. rpm: those matching rpm_patterns (all for ()), with the
    versionlock holds. Each package is {"name", "version", "state", "held"} (rpm: "arch").
    """
    doc: dict = {"manager": _manager(root), "error": None, "packages": []}
    if doc["manager"] == "dpkg":
        argv = ["dpkg-query", "-W", "-f", DPKG_FORMAT]
        if root.base != "/":
            argv.insert(1, f"--admindir={root.path('/var/lib/dpkg')}")
        parse = parse_dpkg_query
    elif doc["manager"] == "rpm":
        argv = ["rpm", "-qa", "--qf", RPM_FORMAT, *rpm_patterns]
        if root.base != "/":
            argv[1:1] = ["--root", root.base]
        parse = parse_rpm_query
    else:
        return doc
    try:
        rc, out, err = run(argv)
    except (OSError, subprocess.SubprocessError) as exc:
        rc, out, err = -1, "", str(exc)
    if rc != 0:
        doc["error"] = f"{argv[0]} exited {rc}: {err.strip()[:500]}"
        return doc
    packages = parse(out)
    if doc["manager"] == "rpm":
        locks = [p for f in VERSIONLOCK_FILES for p in parse_versionlock(root.read(f) or "")]
        for package in packages:
            package["held"] = is_locked(package, locks)
    for package in packages:
        package.pop("_evr", None)
    packages.sort(key=lambda p: p["name"])
    doc["packages"] = packages
    return doc


def dpkg_interrupted(root: Root, run: Runner = run_command) -> list[str]:
    """Why dpkg must finish first ("dpkg was interrupted"), empty when it need not.

    `dpkg --audit` lists half-installed and unconfigured packages; a numbered journal entry
    under /var/lib/dpkg/updates is what apt checks before it refuses to run.
    """
    reasons = []
    argv = ["dpkg", "--audit"]
    if root.base != "/":
        argv.insert(1, f"--admindir={root.path('/var/lib/dpkg')}")
    try:
        rc, out, err = run(argv)
    except (OSError, subprocess.SubprocessError) as exc:
        rc, out, err = -1, "", str(exc)
    if (out + err).strip():
        reasons.append("dpkg --audit lists packages" if rc == 0 and out.strip()
                       else f"dpkg --audit: {(err or out).strip()[:200]}")
    if any(path.rsplit("/", 1)[-1].isdigit() for path in root.glob("/var/lib/dpkg/updates/*")):
        reasons.append("dpkg journal entries in /var/lib/dpkg/updates")
    return reasons


def collect(root: Root, run: Runner = run_command) -> dict:
    found = query(root, run)
    packages = found.pop("packages")
    found["driver"] = [p for p in packages if DRIVER_PACKAGE.search(p["name"])]
    found["cuda_toolkit"] = [p for p in packages if CUDA_TOOLKIT_PACKAGE.match(p["name"])]
    found["runtime"] = [p for p in packages if RUNTIME_PACKAGE.match(p["name"])]
    return found
