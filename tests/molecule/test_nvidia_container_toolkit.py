"""Molecule scenario of the nvidia_container_toolkit role: check mode on fresh nodes, converge,
idempotence and verify on the lab's node image (see molecule/nvidia_container_toolkit/).
Needs podman and the image localhost/gpuprov-node. The role installs the simulated toolkit from
the lab's signed package repository (gpuprov/lab/pkgrepo.py), built here first: the scenario
mounts it into the nodes."""

from __future__ import annotations

from gpuprov.lab import pkgrepo
from gpuprov.lab.cache import CACHE

LAB_REPO_DIR = CACHE / "gpuprov-lab-repo"


def test_molecule_nvidia_container_toolkit(molecule) -> None:
    repo = pkgrepo.build_repo(LAB_REPO_DIR)
    assert (repo.root / "stable" / "deb" / "amd64" / "InRelease").is_file()
    molecule("nvidia_container_toolkit", ("check", "converge", "idempotence", "verify"))
