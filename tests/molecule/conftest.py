"""Runs molecule scenarios the way a developer does (`molecule test -s NAME`), with the lab's
podman settings and this virtualenv's Ansible."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov.lab.cache import CACHE

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def run_scenario(name: str, steps: tuple[str, ...]) -> None:
    """`molecule test -s name`; fails with the failed tasks unless every step in `steps` ran
    and succeeded (molecule fails idempotence itself when the second run changes)."""
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(REPO / "gpuprov" / "lab" / "image" / "containers.conf"),
        # molecule runs ansible-playbook and ansible-config from the same environment.
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        # The scenarios mount their package caches from the machine's cache.
        "GPUPROV_CACHE_DIR": str(CACHE),
    }
    result = subprocess.run([str(VENV_BIN / "molecule"), "test", "-s", name], cwd=REPO,
                            env=env, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    failures = "\n".join(line for line in output.splitlines()
                         if "fatal:" in line or "FAILED!" in line)
    assert result.returncode == 0, f"{failures}\n...\n{output[-8000:]}"
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    for step in steps:
        assert f"➜ {step}: Executed: Successful" in plain, plain[-4000:]


@pytest.fixture(scope="session")
def molecule():
    """run_scenario, once the scenarios' image (localhost/gpuprov-node:latest) is this
    checkout's lab node image: built if missing, retagged if another checkout moved it."""
    os.environ.setdefault("CONTAINERS_CONF",
                          str(REPO / "gpuprov" / "lab" / "image" / "containers.conf"))
    from gpuprov.lab import image, podman

    podman.podman("tag", image.ensure_node_image(), f"{image.NODE_REPO}:latest")
    return run_scenario
