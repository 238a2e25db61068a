"""Molecule scenario of the gpu_preflight, gpu_node_labels and nvidia_device_plugin roles, in
site.yml's order: converge, idempotence and verify on the lab's node image against the lab's
emulated Kubernetes API (see molecule/gpu_stages/). Needs podman and the image
localhost/gpuprov-node."""

from __future__ import annotations


def test_molecule_gpu_stages(molecule) -> None:
    molecule("gpu_stages", ("converge", "idempotence", "verify"))
