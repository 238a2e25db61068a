"""SIMULATION: the lab's local, signed apt repository of NVIDIA's container toolkit.

NVIDIA's repositories cannot be reached from the machines gpuprov is built on, so the lab
serves simulated `nvidia-container-toolkit` packages from a repository of its own, laid out
like NVIDIA's (https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH), a flat
repository, key at the top as `gpgkey`) and signed with a key the lab generates, so apt's
signature check (deb822 Signed-By) is the real one. The nvidia_container_toolkit role
reaches it through the repository-URL and key variables an air-gapped site sets for its
mirror; the lab bind-mounts the directory read-only into every node at NODE_PATH, so no
container talks to the network for it.

    build_repo(dir) -> Repo      packages + signed index, rebuilt only when inputs change
    python -m gpuprov.lab.pkgrepo DIR    the same, for the molecule scenario

Layout of DIR:
    gnupg/                       the lab's signing key (no passphrase), kept across rebuilds
    repo/gpgkey                  its public key, ASCII-armoured (as NVIDIA publishes theirs)
    repo/stable/deb/amd64/       *.deb, Packages, Packages.gz, Release, InRelease, Release.gpg
    repo/.inputs                 hash of what the repository was built from

Packages, as NVIDIA splits them (each version of TOOLKIT_VERSIONS): nvidia-container-toolkit-base
(nvidia-ctk, nvidia-container-runtime, /etc/nvidia-container-runtime/config.toml; from 1.18
the nvidia-cdi-refresh units and a postinst that enables them, as NVIDIA's),
libnvidia-container1 (empty: a README instead of the library), libnvidia-container-tools
(nvidia-container-cli) and nvidia-container-toolkit (nvidia-container-runtime-hook; depends
on the base and the tools, like NVIDIA's). Their programs are the stand-ins in
toolkit/; SIMULATION.md says what they do and do not do.

The generic parts (signing key, .deb from control fields and files, signed flat index, the
in-place replace of the repository directory) are shared with gpuprov/lab/cudarepo.py.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from gpuprov.errors import GpuprovError

log = logging.getLogger(__name__)

TOOLKIT_DIR = Path(__file__).parent / "toolkit"
# The versions the repository serves, as apt spells them: the nvidia_container_toolkit role's
# pin first (NVIDIA's current release, roles/nvidia_container_toolkit/defaults/main.yml), then
# 1.17.7, which has known CVEs (gpuprov/nvidia/toolkit_advisories.py), for the tests that install an
# old, vulnerable toolkit and expect verify to fail and site.yml to move the node to the pin.
TOOLKIT_VERSIONS = ("1.20.1-1", "1.17.7-1")
TOOLKIT_VERSION = TOOLKIT_VERSIONS[0]
ARCH = "amd64"
# Where the nodes see the repository (bind mount), and the role settings that point at it:
# the same variables an air-gapped site sets for its own mirror.
NODE_PATH = "/srv/gpuprov-lab-repo"
REPO_URL = f"file:{NODE_PATH}/stable/deb/$(ARCH)"
KEY_URL = f"file://{NODE_PATH}/gpgkey"
KEY_UID = "gpuprov lab package repository (SIMULATION) <lab-repo@gpuprov.invalid>"
# Fixed file times in the packages: the same inputs give the same .debs.
SOURCE_DATE_EPOCH = 1763769600  # 2025-11-22

# name -> (files: source in toolkit/ -> (path in package, mode), Depends ({version}: the
# package's own), Description)
PACKAGES: dict[str, tuple[dict[str, tuple[str, int]], str, str]] = {
    "nvidia-container-toolkit-base": (
        {
            "nvidia-ctk": ("usr/bin/nvidia-ctk", 0o755),
            "nvidia-container-runtime": ("usr/bin/nvidia-container-runtime", 0o755),
            "config.toml": ("etc/nvidia-container-runtime/config.toml", 0o644),
            # The modules the stand-ins share (gpuprov/lab/toolkit/__init__.py).
            "toolkit_rules.py": ("usr/lib/gpuprov-sim/python/toolkit_rules.py", 0o644),
            "simnvml_client.py": ("usr/lib/gpuprov-sim/python/simnvml_client.py", 0o644),
            # Since 1.18 (SINCE below): the units that keep /var/run/cdi/nvidia.yaml current.
            "nvidia-cdi-refresh.service": ("usr/lib/systemd/system/nvidia-cdi-refresh.service",
                                           0o644),
            "nvidia-cdi-refresh.path": ("usr/lib/systemd/system/nvidia-cdi-refresh.path", 0o644),
        },
        "python3, runc",
        "NVIDIA Container Toolkit Base (gpuprov lab SIMULATION)",
    ),
    "libnvidia-container1": (
        {"README.libnvidia-container1": ("usr/share/doc/libnvidia-container1/README.gpuprov-lab",
                                         0o644)},
        "",
        "NVIDIA container runtime library (gpuprov lab SIMULATION: no library inside)",
    ),
    "libnvidia-container-tools": (
        {"nvidia-container-cli": ("usr/bin/nvidia-container-cli", 0o755)},
        "libnvidia-container1 (>= {version})",
        "NVIDIA container runtime library (command-line tools) (gpuprov lab SIMULATION)",
    ),
    "nvidia-container-toolkit": (
        {"nvidia-container-runtime-hook": ("usr/bin/nvidia-container-runtime-hook", 0o755)},
        "nvidia-container-toolkit-base (= {version}), "
        "libnvidia-container-tools (>= {version})",
        "NVIDIA Container toolkit (gpuprov lab SIMULATION)",
    ),
}
CONFFILES = {"nvidia-container-toolkit-base": ["/etc/nvidia-container-runtime/config.toml"]}
# Files (and maintainer scripts) a package has only from an upstream version on: the CDI
# refresh units and the postinst that enables them came with toolkit 1.18.
SINCE = {"nvidia-cdi-refresh.service": (1, 18), "nvidia-cdi-refresh.path": (1, 18),
         "nvidia-container-toolkit-base.postinst": (1, 18)}
# name -> {maintainer script: source in toolkit/}
SCRIPTS = {"nvidia-container-toolkit-base": {"postinst": "nvidia-container-toolkit-base.postinst"}}


@dataclass(frozen=True)
class Repo:
    root: Path  # mounted at NODE_PATH
    key_file: Path  # ASCII-armoured public key (root/gpgkey)
    fingerprint: str


# The generic machinery below (key, .deb, signed flat index, in-place publish) is shared with
# the lab's CUDA driver repository, gpuprov/lab/cudarepo.py.


def run(*args: str, env: dict | None = None, cwd: Path | None = None) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise GpuprovError(f"building a lab package repository: {args[0]} failed: {last}")
    return proc.stdout


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise GpuprovError(
            f"the lab's package repositories need {', '.join(missing)}: run "
            "scripts/install-system-deps.sh (Debian: dpkg-dev, gnupg)"
        )


# gpg-agent's socket is <GNUPGHOME>/S.gpg-agent(.browser, .extra, .ssh); a Unix socket's path
# fits in 108 bytes (unix(7): sun_path). A deeper key directory (a lab in pytest-xdist's temp
# directories) leaves gpg with "No agent running": it is reached through a short link instead.
_SOCKET_ROOM = 107 - len("/S.gpg-agent.browser")


def gpg_env(home: Path) -> dict:
    return {**os.environ, "GNUPGHOME": str(_short(home)), "LC_ALL": "C"}


def _short(home: Path) -> Path:
    """home, or a short link to it (the same link for the same home) where its sockets' paths
    would not fit."""
    if len(str(home)) <= _SOCKET_ROOM:
        return home
    link = Path(tempfile.gettempdir()) / (
        "gpuprov-gnupg-" + hashlib.sha256(str(home).encode()).hexdigest()[:12])
    if not (link.is_symlink() and os.readlink(link) == str(home)):
        tmp = link.with_name(f"{link.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(home)
        os.replace(tmp, link)
    return link


def ensure_key(home: Path, uid: str = KEY_UID) -> str:
    """A lab signing key (generated once per key directory): its fingerprint."""
    env = gpg_env(home)
    if not home.exists():
        home.mkdir(parents=True, mode=0o700)
        run("gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
            "--quick-generate-key", uid, "ed25519", "sign", "never", env=env)
    out = run("gpg", "--batch", "--with-colons", "--list-secret-keys", uid, env=env)
    fingerprints = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    if not fingerprints:
        raise GpuprovError(f"no signing key in {home}: remove that directory and retry")
    return fingerprints[0]


def export_key(home: Path, fingerprint: str) -> str:
    """The public key, ASCII-armoured."""
    return run("gpg", "--batch", "--armor", "--export", fingerprint, env=gpg_env(home))


def build_deb(fields: dict[str, str], files: dict[str, tuple[str, int]], out_dir: Path,
              work: Path, conffiles: tuple[str, ...] = (),
              scripts: dict[str, str] | None = None) -> Path:
    """out_dir/<Package>_<Version>_<Architecture>.deb from control fields (empty ones left
    out; Installed-Size added), files: path in the package -> (text, mode), and maintainer
    scripts: name (postinst, prerm ...) -> text."""
    name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
    root = work / f"{name}_{version}"
    for dest, (text, mode) in files.items():
        target = root / dest
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)
    control = root / "DEBIAN"
    control.mkdir(parents=True)
    size_kib = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) // 1024 + 1
    fields = {**fields, "Installed-Size": str(size_kib)}
    (control / "control").write_text("".join(f"{k}: {v}\n" for k, v in fields.items() if v))
    if conffiles:
        (control / "conffiles").write_text("".join(f"{p}\n" for p in conffiles))
    for script, text in (scripts or {}).items():
        (control / script).write_text(text)
        (control / script).chmod(0o755)
    for path in [root, *root.rglob("*")]:
        os.utime(path, (SOURCE_DATE_EPOCH, SOURCE_DATE_EPOCH), follow_symlinks=False)
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
    deb = out_dir / f"{name}_{version}_{arch}.deb"
    run("dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb), env=env)
    return deb


def _release(arch_dir: Path, header: list[str]) -> str:
    """A flat repository's Release file: header fields, then hashes of its indexes."""
    lines = [*header, f"Date: {formatdate(time.time(), usegmt=True)}"]
    for field, algo in (("MD5Sum", "md5"), ("SHA256", "sha256")):
        lines.append(f"{field}:")
        for name in ("Packages", "Packages.gz"):
            data = (arch_dir / name).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>8} {name}")
    return "\n".join(lines) + "\n"


def write_signed_index(arch_dir: Path, header: list[str], home: Path, fingerprint: str) -> None:
    """Packages, Packages.gz, Release (header fields first), InRelease and Release.gpg of the
    flat repository of the .debs in arch_dir."""
    # Filename: paths relative to the repository URL, as in a flat repository.
    packages = run("dpkg-scanpackages", "--multiversion", ".", "/dev/null", cwd=arch_dir)
    packages = packages.replace("Filename: ./", "Filename: ")
    (arch_dir / "Packages").write_text(packages)
    with gzip.GzipFile(arch_dir / "Packages.gz", "wb", mtime=0) as gz:
        gz.write(packages.encode())
    (arch_dir / "Release").write_text(_release(arch_dir, header))
    env = gpg_env(home)
    sign = ("gpg", "--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", "",
            "--local-user", fingerprint, "--digest-algo", "SHA256")
    run(*sign, "--clearsign", "--output", str(arch_dir / "InRelease"),
        str(arch_dir / "Release"), env=env)
    run(*sign, "--armor", "--detach-sign", "--output", str(arch_dir / "Release.gpg"),
        str(arch_dir / "Release"), env=env)


@contextmanager
def staged(out_dir: Path, root: Path, home: Path) -> Iterator[Path]:
    """A staging directory under out_dir; what it holds when the block ends replaces the
    contents of root. Nothing is replaced if the block fails."""
    staging = Path(tempfile.mkdtemp(prefix=".repo-", dir=out_dir))
    try:
        yield staging
        for path in [staging, *staging.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        # Replaced in place, not renamed: running nodes have this very directory mounted.
        root.mkdir(exist_ok=True)
        root.chmod(0o755)
        for child in root.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        for child in staging.iterdir():
            shutil.move(str(child), str(root / child.name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=gpg_env(home),
                       capture_output=True, check=False)


def _inputs_digest(fingerprint: str) -> str:
    h = hashlib.sha256()
    # Files only: importing the toolkit's modules (the lab's kubelet does) leaves __pycache__.
    for path in sorted([Path(__file__), *(p for p in TOOLKIT_DIR.iterdir() if p.is_file())]):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    h.update(f"{' '.join(TOOLKIT_VERSIONS)}\0{fingerprint}".encode())
    return h.hexdigest()


def _build_deb(name: str, version: str, out_dir: Path, work: Path) -> None:
    sources, depends, description = PACKAGES[name]
    upstream = tuple(int(part) for part in version.split("-")[0].split(".")[:2])
    files = {}
    for source, (dest, mode) in sources.items():
        if upstream < SINCE.get(source, (0, 0)):
            continue
        text = (TOOLKIT_DIR / source).read_text()
        text = text.replace("@VERSION_CLI@", version.split("-")[0])
        files[dest] = (text.replace("@VERSION@", version.split("-")[0]), mode)
    fields = {
        "Package": name,
        "Version": version,
        "Architecture": ARCH,
        "Maintainer": "gpuprov lab <lab-repo@gpuprov.invalid>",
        "Depends": depends.format(version=version),
        "Section": "utils",
        "Priority": "optional",
        "Homepage": "https://github.com/NVIDIA/nvidia-container-toolkit",
        "Description": f"{description}\n SIMULATION: small scripts standing in for NVIDIA's "
        "programs, built by\n gpuprov/lab/pkgrepo.py; see gpuprov/lab/SIMULATION.md.",
    }
    scripts = {script: (TOOLKIT_DIR / source).read_text()
               for script, source in SCRIPTS.get(name, {}).items()
               if upstream >= SINCE.get(source, (0, 0))}
    build_deb(fields, files, out_dir, work, tuple(CONFFILES.get(name, ())), scripts)


def build_repo(out_dir: Path) -> Repo:
    """The signed repository under out_dir/repo; rebuilt only when its inputs changed."""
    need("dpkg-deb", "dpkg-scanpackages", "gpg")
    out_dir = out_dir.resolve()
    home = out_dir / "gnupg"
    fingerprint = ensure_key(home)
    root = out_dir / "repo"
    stamp = root / ".inputs"
    digest = _inputs_digest(fingerprint)
    repo = Repo(root, root / "gpgkey", fingerprint)
    if stamp.exists() and stamp.read_text().strip() == digest:
        return repo
    log.warning("building the lab's simulated NVIDIA container toolkit repository in %s", root)
    with staged(out_dir, root, home) as staging:
        arch_dir = staging / "stable" / "deb" / ARCH
        arch_dir.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="pkg-", dir=out_dir) as work:
            for version in TOOLKIT_VERSIONS:
                for name in PACKAGES:
                    _build_deb(name, version, arch_dir, Path(work))
        header = ["Origin: gpuprov-lab",
                  "Label: gpuprov lab NVIDIA container toolkit (SIMULATION)",
                  f"Architectures: {ARCH}"]
        write_signed_index(arch_dir, header, home, fingerprint)
        (staging / "gpgkey").write_text(export_key(home, fingerprint))
        (staging / ".inputs").write_text(digest + "\n")
    return repo


def repo_main(argv: list[str] | None, prog: str, description: str, build) -> int:
    """`python -m gpuprov.lab.<module> DIR`: build (cached) and print the repository."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("dir", type=Path, help="work directory (key, repository)")
    args = parser.parse_args(argv)
    try:
        repo = build(args.dir)
    except GpuprovError as exc:
        parser.exit(2, f"gpuprov: error: {exc}\n")
    print(repo.root)
    return 0


def main(argv: list[str] | None = None) -> int:
    return repo_main(
        argv, "python -m gpuprov.lab.pkgrepo",
        "Build the lab's signed repository of the simulated NVIDIA container toolkit (cached; "
        "rebuilt when its inputs change). Prints the repository directory.", build_repo)


if __name__ == "__main__":
    raise SystemExit(main())
