"""SIMULATION: the lab's local, signed mirror of NVIDIA's CUDA apt repository (driver packages
only) for Debian 12 and Debian 13.

NVIDIA's repository cannot be reached from the machines gpuprov is built on, so the lab serves
simulated driver packages from a directory laid out like
https://developer.download.nvidia.com/compute/cuda/repos/ and signed with a key the lab
generates (gpuprov/lab/pkgrepo.py builds the packages, the index and the signatures the same
way for the container toolkit). Sources, cited below as [n]:
  [1] flat repositories, `deb [signed-by=...] .../repos/debian12/x86_64/ /`: the list file
      cuda-keyring installs (NVIDIA/cuda-repo-management#30), NVIDIA/gpu-driver-container
      PR #531 debian13/install.sh
  [2] keys: 3bf863cc for debian12 (NVIDIA/cuda-repo-management#4), a new key 8793F200 for
      debian13 only (NVIDIA maintainer in NVIDIA/cuda-repo-management#39)
  [3] Debian package names, compute-only `nvidia-driver-cuda nvidia-kernel-open-dkms`: the
      Driver Installation Guide's debian.html as its users quote it, and
      GoogleCloudDataproc/initialization-actions PR #1400; libcuda1 only Recommends the DKMS
      package: observed in a public homelab install script (not NVIDIA's)
  [4] pinning packages nvidia-driver-pinning-<branch>|<version>, Pin-Priority 1000 in
      /etc/apt/preferences.d/nvidia-driver-pin, installed in an earlier transaction: the
      guide's recent-updates.html "Version locking packages for Ubuntu / Debian" and apt-cache
      output users posted (branch pin version 580-5 in the debian12 repository)
  [5] cuda-drivers-580 580.105.08-1 has lower bounds only and pulled in 590: NVIDIA developer
      forum thread 353805
  [6] DKMS packages depend on dkms (>= 3.1.8) from 570.148.08: third-party notes
      (NeuralDrive docs, awslabs/amazon-eks-ami PR #2284)
  [7] debian13 started with 590+ only: NVIDIA/cuda-repo-management#38, #40

    build_repo(dir) -> Repo      packages + signed indexes, rebuilt only when inputs change
    python -m gpuprov.lab.cudarepo DIR    the same; prints the repository directory

Layout of DIR (the repository is DIR/repo, bind-mounted read-only at NODE_PATH):
    gnupg/                            the lab's CUDA signing key, kept across rebuilds
    repo/debian12/x86_64/             *.deb, Packages, Packages.gz, Release, InRelease,
    repo/debian13/x86_64/               Release.gpg, and the key (below)
    repo/.inputs                      hash of what the repository was built from

Faithful: each <distro>/x86_64/ is a FLAT repository, as NVIDIA's are (apt line
`deb [signed-by=KEY] URL/debian13/x86_64/ /`, deb822 `Suites: /`, [1]); the public key
sits in each OS directory under the name of NVIDIA's key file for that OS (debian12:
3bf863cc.pub, debian13: 8793F200.pub, [2]) but it is the LAB's key, not NVIDIA's: a
pin or check on NVIDIA's fingerprint (EB69...63CC, 0218...F200) does not match it. Release says
`Origin: gpuprov-lab` and SIMULATION in its Label (NVIDIA's say `Origin: NVIDIA`,
`Label: NVIDIA CUDA`), so a `Pin: release o=NVIDIA` does not match the lab's mirror either.
Package names, versions (`<upstream>-1`, no epoch) and the source package
nvidia-graphics-drivers are Debian-style as in NVIDIA's repository [3]; the
pinning packages work as the guide describes [4]; cuda-drivers-580 has lower bounds
only, so without a pin it pulls the newest branch [5].

Simulated: every file in the packages is a placeholder. libnvidia-ml1 ships
usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<upstream>: the lab's simulated NVML reports the newest
such version as the installed driver (gpuprov/lab/nvml/simnvml.c, installed_driver_version);
nvidia-smi ships a stand-in that runs the lab's /opt/gpuprov-sim/bin/nvidia-smi; the DKMS
packages carry no module source (the lab cannot build modules) and nvidia-persistenced no
daemon or unit (the nodes have no kernel module). Not verified: the exact lines of NVIDIA's pin
file, the packages' full Depends (no Packages excerpt was found), and whether the real
debian13 repository carries 580 (it started with 590+ only [7]).
gpuprov/lab/SIMULATION.md says the same for the lab's users.
"""

from __future__ import annotations

import hashlib
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gpuprov.lab import pkgrepo

log = logging.getLogger(__name__)

# The driver versions each OS directory serves, as apt spells them (NVIDIA's Debian versions
# are <upstream>-<revision>, no epoch). 580 first: the lab's gpu-hopper profile pins 580;
# 590 is there so that an unpinned install takes the newer branch, as it would from NVIDIA.
# R580 twice, as NVIDIA's repository keeps a branch's releases side by side: 580.105.08, below
# the fixes of NVIDIA's bulletins 5747, 5821 and 5861, and 580.178.04, 5861's fixed version
# (gpuprov/nvidia/driver_advisories.py): a node pinned to the branch gets the fixed one, and
# the vulnerable one is there to pin (nvidia_driver_version) and upgrade from.
VULNERABLE_580, FIXED_580 = "580.105.08-1", "580.178.04-1"
DRIVER_VERSIONS = (VULNERABLE_580, FIXED_580, "590.44.01-1")
DISTROS = ("debian12", "debian13")
ARCH_DIR = "x86_64"  # NVIDIA's directory name; the packages are Debian's amd64
ARCH = "amd64"
# The names of NVIDIA's key files in each OS directory [2]. The files hold the lab's key.
KEY_FILES = {"debian12": "3bf863cc.pub", "debian13": "8793F200.pub"}
# Where the nodes see the repository (bind mount) and its URLs: REPO_URL with {distro}
# (debian12, debian13) and {arch} (x86_64) filled in, as NVIDIA's
# https://developer.download.nvidia.com/compute/cuda/repos/<distro>/<arch>/.
NODE_PATH = "/srv/gpuprov-lab-cuda"
REPO_URL = f"file:{NODE_PATH}/{{distro}}/{{arch}}"
KEY_UID = "gpuprov lab CUDA repository (SIMULATION) <lab-cuda@gpuprov.invalid>"
PIN_FILE = "etc/apt/preferences.d/nvidia-driver-pin"
# dkms (>= 3.1.8): NVIDIA's DKMS packages from 570.148.08 on [6]. Only that is
# known; for debian12 (bookworm ships dkms 3.0.10) NVIDIA's dependency is unverified, so the
# lab's debian12 packages ask for plain dkms.
DKMS_DEPENDS = {"debian12": "dkms", "debian13": "dkms (>= 3.1.8)"}
MAINTAINER = "gpuprov lab <lab-cuda@gpuprov.invalid>"


def repo_url(distro: str, arch: str = ARCH_DIR) -> str:
    """The apt URL of one OS directory on a node (suite "/": a flat repository)."""
    return REPO_URL.format(distro=distro, arch=arch)


def key_url(distro: str) -> str:
    """The URL of the (lab's) signing key in one OS directory on a node."""
    return f"file://{NODE_PATH}/{distro}/{ARCH_DIR}/{KEY_FILES[distro]}"


@dataclass(frozen=True)
class Repo:
    root: Path  # mounted at NODE_PATH
    fingerprint: str

    def arch_dir(self, distro: str) -> Path:
        return self.root / distro / ARCH_DIR

    def key_file(self, distro: str) -> Path:
        """The ASCII-armoured public key (the lab's, under NVIDIA's file name)."""
        return self.arch_dir(distro) / KEY_FILES[distro]


def _placeholder(what: str) -> str:
    return (f"SIMULATION: gpuprov lab placeholder for {what}.\n"
            "Built by gpuprov/lab/cudarepo.py; see gpuprov/lab/SIMULATION.md.\n")


def _pin_file(match: str, what: str) -> str:
    """/etc/apt/preferences.d/nvidia-driver-pin: NVIDIA's pinning packages ship this file with
    Pin-Priority 1000 [4]; the lines are modelled on the guide's description."""
    stanzas = "\n".join(
        f"Package: src:{source}\nPin: version {match}\nPin-Priority: 1000\n"
        for source in ("nvidia-graphics-drivers", "nvidia-persistenced")
    )
    return (f"# {what} (gpuprov lab SIMULATION).\n"
            "# The exact lines NVIDIA ships are not published; these follow the description in\n"
            "# NVIDIA's Driver Installation Guide (version locking for Ubuntu/Debian).\n"
            f"{stanzas}")


def packages(distro: str, version: str) -> list[tuple[dict[str, str], dict[str, tuple[str, int]],
                                                        tuple[str, ...]]]:
    """(control fields, files, conffiles) of each package of one driver version in one OS
    directory."""
    upstream = version.split("-")[0]
    branch = upstream.split(".")[0]
    lib = "usr/lib/x86_64-linux-gnu"
    result: list[tuple[dict[str, str], dict[str, tuple[str, int]], tuple[str, ...]]] = []

    def driver(name: str, description: str, files: dict[str, tuple[str, int]],
               source: str = "nvidia-graphics-drivers", version: str = version,
               arch: str = ARCH, section: str = "non-free/libs",
               **relations: str) -> None:
        fields = {"Package": name, "Source": source, "Version": version, "Architecture": arch,
                  "Maintainer": MAINTAINER, "Section": section, "Priority": "optional"}
        fields |= {k.replace("_", "-"): v for k, v in relations.items()}
        fields["Description"] = (f"{description} (gpuprov lab SIMULATION)\n SIMULATION: "
                                 "placeholders, built by gpuprov/lab/cudarepo.py; see\n "
                                 "gpuprov/lab/SIMULATION.md.")
        result.append((fields, files, (f"/{PIN_FILE}",) if PIN_FILE in files else ()))

    def readme(name: str, what: str) -> dict[str, tuple[str, int]]:
        return {f"usr/share/doc/{name}/README.gpuprov-lab": (_placeholder(what), 0o644)}

    dkms = {"open": "nvidia-kernel-open-dkms", "proprietary": "nvidia-kernel-dkms"}
    kernel = f"{dkms['open']} (= {version}) | {dkms['proprietary']} (= {version})"
    # nvidia-driver-cuda is the compute-only userspace and depends on no kernel module;
    # libcuda1 only Recommends one, so --no-install-recommends leaves it out [3].
    driver("nvidia-driver-cuda", "NVIDIA driver compute-only userspace (CUDA, NVML)",
           readme("nvidia-driver-cuda", "NVIDIA's compute-only driver metapackage"),
           Depends=f"libcuda1 (= {version}), libnvidia-ml1 (= {version}), "
           f"nvidia-smi (= {version})",
           Recommends="nvidia-persistenced")
    driver("libcuda1", "NVIDIA CUDA Driver Library",
           {f"{lib}/libcuda.so.{upstream}": (_placeholder(f"libcuda {upstream}"), 0o644)},
           Recommends=kernel)
    driver("libnvidia-ml1", "NVIDIA Management Library (NVML) runtime library",
           # The file the lab's NVML reads the installed driver version from.
           {f"{lib}/libnvidia-ml.so.{upstream}": (_placeholder(f"NVML {upstream}"), 0o644)})
    driver("nvidia-smi", "NVIDIA System Management Interface",
           {"usr/bin/nvidia-smi": ("#!/bin/sh\n# SIMULATION: the gpuprov lab's nvidia-smi "
                                   "(node image), see gpuprov/lab/SIMULATION.md\n"
                                   'exec /opt/gpuprov-sim/bin/nvidia-smi "$@"\n', 0o755)},
           section="non-free/utils")
    for kind, name in dkms.items():
        other = dkms["proprietary" if kind == "open" else "open"]
        driver(name, f"NVIDIA binary kernel module DKMS source ({kind} modules)",
               # No dkms.conf: the lab cannot build kernel modules.
               {f"usr/src/nvidia-{upstream}/README.gpuprov-lab":
                (_placeholder(f"the {kind} kernel module source {upstream}"), 0o644)},
               section="non-free/kernel", Depends=DKMS_DEPENDS[distro], Conflicts=other)
    driver("nvidia-persistenced", "daemon to maintain persistent software state in the driver",
           {
               # The unit of NVIDIA's own template (NVIDIA/nvidia-persistenced,
               # init/systemd/nvidia-persistenced.service.template), so the role enables what
               # it would on a server. The lab never starts it: the node image's drop-in makes
               # it wait for /dev/nvidiactl, which a lab node does not have.
               "lib/systemd/system/nvidia-persistenced.service": (
                   "[Unit]\nDescription=NVIDIA Persistence Daemon\nWants=syslog.target\n\n"
                   "[Service]\nType=forking\n"
                   "ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced\n"
                   "ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced\n\n"
                   "[Install]\nWantedBy=multi-user.target\n", 0o644),
               # SIMULATION: no daemon (no kernel module to hold open).
               "usr/bin/nvidia-persistenced": (
                   "#!/bin/sh\n# SIMULATION: gpuprov lab stand-in, see gpuprov/lab/SIMULATION.md\n"
                   "echo 'nvidia-persistenced: no NVIDIA kernel module in the gpuprov lab' >&2\n"
                   "exit 1\n", 0o755),
           },
           source="nvidia-persistenced", section="non-free/utils")
    for pin_version, match, what in (
        (f"{branch}-5", f"{branch}.*", f"APT driver pinning file for driver branch {branch}"),
        (f"{upstream}-1", f"{upstream}-*", f"APT driver pinning file for driver version "
         f"{upstream}"),
    ):
        suffix = pin_version.rsplit("-", 1)[0]
        driver(f"nvidia-driver-pinning-{suffix}", what,
               {PIN_FILE: (_pin_file(match, what), 0o644)},
               source="", version=pin_version, arch="all",
               section="non-free/admin", Provides="nvidia-driver-pinning",
               Conflicts="nvidia-driver-pinning", Replaces="nvidia-driver-pinning")
    if branch == "580":
        # Lower bounds only, as NVIDIA's cuda-drivers-580 580.105.08-1 [5]:
        # unpinned, it pulls the newest branch. NVIDIA's also depends on nvidia-driver,
        # nvidia-settings and nvidia-xconfig (desktop packages the lab does not serve).
        floor = "(>= 580.65.06)"
        driver("cuda-drivers-580", "CUDA Driver meta-package, branch-specific",
               readme("cuda-drivers-580", "the cuda-drivers-580 metapackage"),
               section="non-free/metapackages",
               Depends=f"nvidia-driver-cuda {floor}, nvidia-kernel-open-dkms {floor} | "
               f"nvidia-kernel-dkms {floor}")
    return result


def _inputs_digest(fingerprint: str) -> str:
    h = hashlib.sha256()
    for path in (Path(__file__), Path(pkgrepo.__file__)):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"{' '.join(DRIVER_VERSIONS)}\0{' '.join(DISTROS)}\0{fingerprint}".encode())
    return h.hexdigest()


def build_repo(out_dir: Path) -> Repo:
    """The signed repository under out_dir/repo; rebuilt only when its inputs changed."""
    pkgrepo.need("dpkg-deb", "dpkg-scanpackages", "gpg")
    out_dir = out_dir.resolve()
    home = out_dir / "gnupg"
    fingerprint = pkgrepo.ensure_key(home, KEY_UID)
    root = out_dir / "repo"
    stamp = root / ".inputs"
    digest = _inputs_digest(fingerprint)
    repo = Repo(root, fingerprint)
    if stamp.exists() and stamp.read_text().strip() == digest:
        return repo
    log.warning("building the lab's simulated NVIDIA CUDA driver repository in %s", root)
    with pkgrepo.staged(out_dir, root, home) as staging:
        key = pkgrepo.export_key(home, fingerprint)
        for distro in DISTROS:
            arch_dir = staging / distro / ARCH_DIR
            arch_dir.mkdir(parents=True)
            built: set[tuple[str, str]] = set()
            with tempfile.TemporaryDirectory(prefix="pkg-", dir=out_dir) as work:
                for version in DRIVER_VERSIONS:
                    for fields, files, conffiles in packages(distro, version):
                        # A branch's own packages (nvidia-driver-pinning-580 580-5) come with
                        # each of its versions: one copy, as NVIDIA's repository has.
                        name = (fields["Package"], fields["Version"])
                        if name not in built:
                            built.add(name)
                            pkgrepo.build_deb(fields, files, arch_dir, Path(work), conffiles)
            header = ["Origin: gpuprov-lab", "Label: NVIDIA CUDA (gpuprov lab SIMULATION)",
                      f"Architectures: {ARCH}"]
            pkgrepo.write_signed_index(arch_dir, header, home, fingerprint)
            (arch_dir / KEY_FILES[distro]).write_text(key)
        (staging / ".inputs").write_text(digest + "\n")
    return repo


def main(argv: list[str] | None = None) -> int:
    return pkgrepo.repo_main(
        argv, "python -m gpuprov.lab.cudarepo",
        "Build the lab's signed, simulated mirror of NVIDIA's CUDA driver repository for "
        "debian12 and debian13 (cached; rebuilt when its inputs change). Prints the repository "
        "directory.", build_repo)


if __name__ == "__main__":
    raise SystemExit(main())
