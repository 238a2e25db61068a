"""The lab's simulated mirror of NVIDIA's CUDA driver repository (gpuprov/lab/cudarepo.py), on
this machine (no containers): NVIDIA's layout, signed as apt will check it, cached, and what
apt really resolves from it with and without a driver pinning package."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuprov.lab import cudarepo

pytestmark = pytest.mark.skipif(
    any(shutil.which(t) is None
        for t in ("dpkg-deb", "dpkg-scanpackages", "gpg", "gpgv", "apt-get")),
    reason="needs dpkg-dev, gnupg and apt (scripts/install-system-deps.sh)",
)

# R580 twice: below bulletin 5861's fix (OLD) and at it (FIXED); then the next branch (NEW).
OLD, FIXED, NEW = "580.105.08-1", "580.178.04-1", "590.44.01-1"
DRIVER = ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced")


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> cudarepo.Repo:
    return cudarepo.build_repo(tmp_path_factory.mktemp("cudarepo"))


def _stanzas(arch_dir: Path) -> dict[tuple[str, str], dict[str, str]]:
    result = {}
    for text in (arch_dir / "Packages").read_text().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in text.splitlines()
                      if line and not line.startswith(" "))
        if fields:
            result[(fields["Package"], fields["Version"])] = fields
    return result


def _contents(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True,
                          check=True).stdout


def test_layout_mirrors_nvidias_flat_repositories(repo):
    assert sorted(p.name for p in repo.root.iterdir()) == [".inputs", "debian12", "debian13"]
    for distro, key in (("debian12", "3bf863cc.pub"), ("debian13", "8793F200.pub")):
        arch = repo.root / distro / "x86_64"
        assert repo.key_file(distro) == arch / key
        assert repo.key_file(distro).read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK")
        names = {p.name for p in arch.iterdir()}
        assert {"InRelease", "Packages", "Packages.gz", "Release", "Release.gpg"} <= names
        for version in (OLD, NEW):
            branch, upstream = version.split(".")[0], version.split("-")[0]
            for name in ("nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi",
                         "nvidia-kernel-open-dkms", "nvidia-kernel-dkms",
                         "nvidia-persistenced"):
                assert f"{name}_{version}_amd64.deb" in names
            assert f"nvidia-driver-pinning-{branch}_{branch}-5_all.deb" in names
            assert f"nvidia-driver-pinning-{upstream}_{upstream}-1_all.deb" in names
        assert "cuda-drivers-580_580.105.08-1_amd64.deb" in names
        assert not any(n.startswith("cuda-drivers-590") for n in names)
        release = (arch / "Release").read_text()
        assert "Origin: gpuprov-lab\n" in release and "SIMULATION" in release
    assert cudarepo.repo_url("debian13") == "file:/srv/gpuprov-lab-cuda/debian13/x86_64"
    assert cudarepo.key_url("debian12") == \
        "file:///srv/gpuprov-lab-cuda/debian12/x86_64/3bf863cc.pub"


@pytest.mark.parametrize("distro", cudarepo.DISTROS)
def test_release_is_signed_by_the_published_key_only(repo, distro, tmp_path,
                                                     assert_signed_by):
    assert_signed_by(repo.key_file(distro), repo.arch_dir(distro), repo.fingerprint, tmp_path)


def test_package_metadata_follows_nvidias_debian_packaging(repo, tmp_path):
    for distro, dkms in (("debian12", "dkms"), ("debian13", "dkms (>= 3.1.8)")):
        stanzas = _stanzas(repo.arch_dir(distro))
        for version in (OLD, NEW):
            upstream = version.split("-")[0]
            for name in ("nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi",
                         "nvidia-kernel-open-dkms", "nvidia-kernel-dkms"):
                fields = stanzas[(name, version)]
                assert fields["Source"] == "nvidia-graphics-drivers", name
                assert fields["Architecture"] == "amd64"
            cuda = stanzas[("nvidia-driver-cuda", version)]
            assert cuda["Depends"] == (f"libcuda1 (= {version}), libnvidia-ml1 (= {version}), "
                                       f"nvidia-smi (= {version})")
            assert cuda["Recommends"] == "nvidia-persistenced"
            assert stanzas[("libcuda1", version)]["Recommends"] == (
                f"nvidia-kernel-open-dkms (= {version}) | nvidia-kernel-dkms (= {version})")
            assert stanzas[("nvidia-persistenced", version)]["Source"] == "nvidia-persistenced"
            open_dkms = stanzas[("nvidia-kernel-open-dkms", version)]
            assert open_dkms["Depends"] == dkms
            assert open_dkms["Conflicts"] == "nvidia-kernel-dkms"
            assert stanzas[("nvidia-kernel-dkms", version)]["Conflicts"] == \
                "nvidia-kernel-open-dkms"
            pin = stanzas[(f"nvidia-driver-pinning-{upstream}", f"{upstream}-1")]
            assert pin["Provides"] == pin["Conflicts"] == "nvidia-driver-pinning"
            assert pin["Architecture"] == "all"
        assert stanzas[("cuda-drivers-580", OLD)]["Depends"].startswith(
            "nvidia-driver-cuda (>= 580.65.06), nvidia-kernel-open-dkms (>= 580.65.06)")
    arch = repo.arch_dir("debian13")
    nvml = _contents(arch / f"libnvidia-ml1_{OLD}_amd64.deb")
    # The file the lab's simulated NVML reads the installed driver version from.
    assert "./usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.105.08\n" in nvml
    assert "./usr/lib/x86_64-linux-gnu/libcuda.so.590.44.01\n" in _contents(
        arch / f"libcuda1_{NEW}_amd64.deb")
    dkms_files = _contents(arch / f"nvidia-kernel-open-dkms_{OLD}_amd64.deb")
    assert "./usr/src/nvidia-580.105.08/README.gpuprov-lab" in dkms_files
    assert "dkms.conf" not in dkms_files
    persistenced = _contents(arch / f"nvidia-persistenced_{OLD}_amd64.deb")
    # NVIDIA's unit, which the role enables; the lab never starts it (no /dev/nvidiactl).
    assert "./lib/systemd/system/nvidia-persistenced.service" in persistenced
    assert "-rwxr-xr-x root/root" in persistenced
    assert "./usr/bin/nvidia-persistenced" in persistenced
    subprocess.run(["dpkg-deb", "-x", str(arch / f"nvidia-smi_{OLD}_amd64.deb"),
                    str(tmp_path / "smi")], check=True)
    smi = tmp_path / "smi" / "usr/bin/nvidia-smi"
    assert os.access(smi, os.X_OK)
    assert smi.read_text().splitlines()[-1] == 'exec /opt/gpuprov-sim/bin/nvidia-smi "$@"'
    control = subprocess.run(
        ["dpkg-deb", "--ctrl-tarfile", str(arch / "nvidia-driver-pinning-580_580-5_all.deb")],
        capture_output=True, check=True).stdout
    assert b"/etc/apt/preferences.d/nvidia-driver-pin" in control  # a conffile


class Apt:
    """apt-get -s against one OS directory of the repository, in a configuration of its own:
    nothing of this machine's apt setup is read, and nothing is installed."""

    def __init__(self, repo: cudarepo.Repo, distro: str, tmp: Path) -> None:
        self.tmp = tmp
        for d in ("parts", "sources", "prefs", "lists/partial", "cache/archives/partial",
                  "log"):
            (tmp / d).mkdir(parents=True)
        self.keyring = keyring = tmp / "cuda-archive-keyring.gpg"
        subprocess.run(["gpg", "--batch", "--dearmor", "--output", str(keyring),
                        str(repo.key_file(distro))],
                       check=True, capture_output=True, env={**os.environ, "GNUPGHOME": str(tmp)})
        (tmp / "sources" / "cuda.sources").write_text(
            f"Types: deb\nURIs: file:{repo.arch_dir(distro)}/\nSuites: /\n"
            f"Signed-By: {keyring}\n")
        # dkms as Debian 13 ships it: the DKMS packages depend on it, and it is Debian's.
        (tmp / "status").write_text(
            "Package: dkms\nStatus: install ok installed\nPriority: optional\n"
            "Section: kernel\nMaintainer: Debian\nArchitecture: all\nVersion: 3.2.2-1\n"
            "Description: dkms\n")
        options = {
            "Dir::Etc::main": "/dev/null", "Dir::Etc::parts": tmp / "parts",
            "Dir::Etc::SourceList": "/dev/null", "Dir::Etc::SourceParts": tmp / "sources",
            "Dir::Etc::Preferences": "/dev/null", "Dir::Etc::PreferencesParts": tmp / "prefs",
            "Dir::Etc::TrustedParts": tmp / "parts", "Dir::State": tmp,
            "Dir::State::Lists": tmp / "lists", "Dir::State::status": tmp / "status",
            "Dir::Cache": tmp / "cache", "Dir::Log": tmp / "log",
            "APT::Architecture": "amd64", "APT::Sandbox::User": "root",
            "Debug::NoLocking": "1",
        }
        config = tmp / "apt.conf"
        config.write_text("".join(f'{k} "{v}";\n' for k, v in options.items())
                          + 'APT::Architectures { "amd64"; };\n')
        self.env = {**os.environ, "APT_CONFIG": str(config), "LC_ALL": "C"}
        self._apt("update")

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "-q", *args], capture_output=True, text=True,
                              env=self.env, check=False)

    def _apt(self, *args: str) -> str:
        proc = self.run(*args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "W: " not in proc.stderr and "E: " not in proc.stderr, proc.stderr
        return proc.stdout

    def install(self, *packages: str) -> dict[str, str]:
        """What `apt-get install --no-install-recommends` would install: name -> version."""
        out = self._apt("install", "-s", "--no-install-recommends", *packages)
        return dict(re.findall(r"^Inst (\S+) \((\S+) ", out, re.MULTILINE))

    def pin_with(self, deb: Path) -> None:
        """As if the pinning package were installed: its preferences file in place."""
        subprocess.run(["dpkg-deb", "-x", str(deb), str(self.tmp / "root")], check=True)
        shutil.copy(self.tmp / "root" / cudarepo.PIN_FILE, self.tmp / "prefs")


@pytest.mark.parametrize("distro", cudarepo.DISTROS)
def test_apt_takes_the_newest_branch_unless_a_pinning_package_is_installed(repo, distro,
                                                                          tmp_path):
    apt = Apt(repo, distro, tmp_path)
    driver = {"nvidia-driver-cuda", "libcuda1", "libnvidia-ml1", "nvidia-smi",
              "nvidia-kernel-open-dkms", "nvidia-persistenced"}
    assert apt.install(*DRIVER) == dict.fromkeys(driver, NEW)
    # NVIDIA's quirk: cuda-drivers-580 has lower bounds only and so pulls in 590.
    unpinned = apt.install("cuda-drivers-580")
    assert unpinned.pop("cuda-drivers-580") == FIXED
    assert set(unpinned.values()) == {NEW}

    # First transaction: the pinning package (apt resolves a transaction before its pin
    # exists, so NVIDIA's guide installs it first).
    assert apt.install("nvidia-driver-pinning-580") == {"nvidia-driver-pinning-580": "580-5"}
    apt.pin_with(repo.arch_dir(distro) / "nvidia-driver-pinning-580_580-5_all.deb")
    # The branch's newest: the fixed R580, not the vulnerable one beside it.
    assert apt.install(*DRIVER) == dict.fromkeys(driver, FIXED)
    pinned = apt.install("cuda-drivers-580")
    assert set(pinned.values()) == {FIXED}


def test_the_vulnerable_r580_is_there_to_pin(repo, tmp_path):
    apt = Apt(repo, "debian13", tmp_path)
    arch = repo.arch_dir("debian13")
    apt.pin_with(arch / "nvidia-driver-pinning-580.105.08_580.105.08-1_all.deb")
    assert set(apt.install(*DRIVER).values()) == {OLD}


def test_a_version_pin_holds_the_exact_version(repo, tmp_path):
    apt = Apt(repo, "debian13", tmp_path)
    arch = repo.arch_dir("debian13")
    apt.pin_with(arch / "nvidia-driver-pinning-590.44.01_590.44.01-1_all.deb")
    assert set(apt.install(*DRIVER).values()) == {NEW}
    pin = (tmp_path / "prefs" / "nvidia-driver-pin").read_text()
    assert "Package: src:nvidia-graphics-drivers\nPin: version 590.44.01-*\n" in pin
    assert "Pin-Priority: 1000" in pin and "not published" in pin


def test_apt_refuses_the_repository_with_another_key(repo, tmp_path):
    apt = Apt(repo, "debian13", tmp_path / "apt")
    home = tmp_path / "gnupg"
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--pinentry-mode", "loopback", "--passphrase", "",
                    "--quick-generate-key", "other <other@gpuprov.invalid>", "ed25519", "sign",
                    "never"], env=env, check=True, capture_output=True)
    subprocess.run(["gpg", "--batch", "--yes", "--export", "--output", str(apt.keyring)],
                   env=env, check=True)
    subprocess.run(["gpgconf", "--kill", "gpg-agent"], env=env, check=False)
    lists = tmp_path / "apt" / "lists"
    shutil.rmtree(lists)
    (lists / "partial").mkdir(parents=True)
    update = apt.run("update")
    # No index from an unverified Release: apt knows none of the packages.
    assert f"NO_PUBKEY {repo.fingerprint[-16:]}" in update.stderr
    assert apt.run("install", "-s", "nvidia-driver-cuda").returncode != 0


def test_rebuilt_only_when_inputs_change(tmp_path, monkeypatch):
    first = cudarepo.build_repo(tmp_path)
    stamp = first.root / ".inputs"
    mtime = stamp.stat().st_mtime_ns
    assert cudarepo.build_repo(tmp_path) == first and stamp.stat().st_mtime_ns == mtime
    monkeypatch.setattr(cudarepo, "DRIVER_VERSIONS", ("590.48.01-1",))
    again = cudarepo.build_repo(tmp_path)
    assert again.fingerprint == first.fingerprint  # the key is kept: nodes keep trusting it
    debs = sorted(p.name for p in again.arch_dir("debian13").glob("*.deb"))
    assert debs and all("590" in name for name in debs) and not any("580" in n for n in debs)
