"""Molecule scenario of the nvidia_driver role: converge, idempotence and verify on the lab's
node image (see molecule/nvidia_driver/). Needs podman and the image localhost/gpuprov-node."""

from __future__ import annotations

from gpuprov.lab.cache import CACHE

# Downloaded .debs are kept here between runs (mounted at /var/cache/apt/archives).
APT_CACHE = CACHE / "apt-archives" / "molecule-nvidia_driver"


def test_molecule_nvidia_driver(molecule) -> None:
    for branch in ("535", "470"):
        (APT_CACHE / branch).mkdir(parents=True, exist_ok=True)
    molecule("nvidia_driver", ("converge", "idempotence", "verify"))
