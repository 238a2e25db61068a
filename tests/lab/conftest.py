"""One lab per test session, shared by every lab test that does not change it for good.

The lab lives in its own project directory under pytest's temp dir, so it never touches
a developer's `make demo` lab. GPUPROV_KEEP_LAB=1 leaves it up after the session.
"""

from __future__ import annotations

import os
import shutil

import pytest

from gpuprov.cli import main
from gpuprov.lab.lab import Lab
from gpuprov.ssh import SshTarget, connect


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> Lab:
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: run `make deps` (the lab tests need it)")
    project = tmp_path_factory.mktemp("labproject")
    assert main(["lab", "--dir", str(project), "up"]) == 0
    the_lab = Lab(project)
    yield the_lab
    if os.environ.get("GPUPROV_KEEP_LAB") != "1":
        main(["lab", "--dir", str(project), "down"])


@pytest.fixture(scope="session")
def lab_state(lab):
    return lab.require()


def node_target(lab: Lab, name: str) -> SshTarget:
    node = lab.require().node(name)
    return SshTarget(
        name=node.name, host="127.0.0.1", port=node.ssh_port, user="root",
        key_file=str(lab.key_path), known_hosts=str(lab.known_hosts_path),
    )


@pytest.fixture
def node_connection(lab):
    opened = []

    def _open(name: str):
        conn = connect(node_target(lab, name))
        opened.append(conn)
        return conn

    yield _open
    for conn in opened:
        conn.close()


@pytest.fixture
def clean_faults(lab):
    """Clear every fault after the test, whatever it switched on."""
    yield
    for node in lab.status()["nodes"]:
        for fault in node["faults"]:
            lab.fault(node["name"], fault.split(":")[0], clear=True)

