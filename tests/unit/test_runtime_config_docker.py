"""Docker's daemon.json merged by the toolkit stage (gpuprov/stages/_runtime_config.py
docker_nvidia) on real daemon.json files from other projects (tests/fixtures/runtime/docker/,
sources in SOURCES.md): NVIDIA's runtime, the cdi feature and a Swarm GPU node's generic
resources are set, everything else the admin wrote is kept, and a second merge changes nothing.
And the Swarm naming: the toolkit's swarm-resource must be the variable swarmkit sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.stages import _runtime_config as rc
from gpuprov.stages import _toolkit_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "runtime" / "docker"
REAL = sorted(FIXTURES.glob("*.json"))
UUIDS = ["GPU-5d0c7c1e-0000-1111-2222-333344445555", "GPU-9a1b2c3d-6666-7777-8888-999900001111"]


def test_the_fixtures_are_real_files_with_their_sources():
    sources = (FIXTURES / "SOURCES.md").read_text()
    assert len(REAL) >= 6
    for path in REAL:
        assert f"| {path.name} |" in sources, path.name
        json.loads(path.read_text())


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_a_swarm_gpu_node_on_docker_25_keeps_every_setting_of_the_admin(path):
    text = path.read_text()
    before = json.loads(text)
    merged = rc.docker_nvidia(text, cdi=True, generic_resources=UUIDS, set_default=True)
    after = json.loads(merged["text"])
    assert merged["changed"]
    # Every key of the admin's file is still there with its value, but the ones the merge owns.
    owned = {"runtimes", "default-runtime", "features", "node-generic-resources"}
    assert {k: v for k, v in before.items() if k not in owned} == \
        {k: v for k, v in after.items() if k not in owned}
    # Other runtimes (gVisor's) untouched; NVIDIA's entry keeps what the admin gave it.
    for name, entry in (before.get("runtimes") or {}).items():
        if name != "nvidia":
            assert after["runtimes"][name] == entry
    nvidia = after["runtimes"]["nvidia"]
    assert nvidia["path"] == "/usr/bin/nvidia-container-runtime"
    assert nvidia.get("runtimeArgs", []) == (before.get("runtimes", {}).get("nvidia") or {}).get(
        "runtimeArgs", [])
    assert after["default-runtime"] == "nvidia"
    # The cdi feature beside the admin's others (NVIDIA's nvidia-ctk EnableCDI replaces the
    # whole features object when it came from JSON: pkg/config/engine/docker/docker.go).
    assert after["features"] == {**(before.get("features") or {}), "cdi": True}
    # Generic resources of other kinds are kept; ours are exactly the node's GPUs.
    others = [e for e in before.get("node-generic-resources", [])
              if not e.startswith("NVIDIA-GPU=")]
    assert after["node-generic-resources"] == others + [f"NVIDIA-GPU={u}" for u in UUIDS]
    again = rc.docker_nvidia(merged["text"], cdi=True, generic_resources=UUIDS, set_default=True)
    assert again == {"text": merged["text"], "changed": False, "config": after}


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_a_docker_host_outside_swarm_keeps_runc_as_the_default(path):
    text = path.read_text()
    before = json.loads(text)
    after = json.loads(rc.docker_nvidia(text, cdi=False, generic_resources=None)["text"])
    assert "default-runtime" not in after or after["default-runtime"] != "nvidia"
    assert after.get("features") == before.get("features")
    # Not a Swarm GPU node: node-generic-resources is the admin's business.
    assert after.get("node-generic-resources") == before.get("node-generic-resources")


def test_a_gpu_gone_from_the_node_goes_from_its_generic_resources():
    text = rc.docker_nvidia(None, generic_resources=UUIDS)["text"]
    merged = rc.docker_nvidia(text, generic_resources=UUIDS[1:])
    assert json.loads(merged["text"])["node-generic-resources"] == [f"NVIDIA-GPU={UUIDS[1]}"]
    assert merged["changed"]


@pytest.mark.parametrize("text, words", [
    ('{"features": ["cdi"]}', "features is not an object"),
    ('{"node-generic-resources": "NVIDIA-GPU=GPU-1"}', "node-generic-resources is not a list"),
    ('{"runtimes": []}', "runtimes is not an object"),
    ('{"debug": true,}', "is not valid JSON"),
])
def test_a_daemon_json_that_cannot_be_merged_is_one_clear_line(text, words):
    with pytest.raises(rc.RuntimeConfigError) as err:
        rc.docker_nvidia(text, cdi=True, generic_resources=UUIDS)
    assert words in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind, variable", [
    # swarmkit api/genericresource/string.go EnvFormat: strings.ToUpper(prefix + "_" + kind),
    # prefix "DOCKER_RESOURCE" (moby daemon/cluster/executor/container/container.go); its design
    # doc's example: banana -> DOCKER_RESOURCE_BANANA.
    ("banana", "DOCKER_RESOURCE_BANANA"),
    # NVIDIA's commented default (api/config/v1/toml.go) fits only this kind ...
    ("gpu", "DOCKER_RESOURCE_GPU"),
    # ... not the one Docker's daemon.json reference uses: the classic mismatch.
    ("NVIDIA-GPU", "DOCKER_RESOURCE_NVIDIA-GPU"),
])
def test_the_swarm_resource_is_the_variable_swarm_sets(kind, variable):
    assert rc.swarm_resource_env(kind) == variable


@pytest.mark.parametrize("kind", ["", " gpu", "NVIDIA=GPU", "a,b", None])
def test_a_kind_swarm_would_split_is_refused(kind):
    assert rc.swarm_kind_problem(kind)
    with pytest.raises(rc.RuntimeConfigError):
        rc.docker_nvidia(None, generic_resources=UUIDS, resource_kind=kind)


def test_the_toolkit_config_gets_the_swarm_resource_uncommented():
    """NVIDIA's config.toml as `nvidia-ctk config default` writes it: the key at its default is
    a comment, which is not a setting."""
    text = ('disable-require = false\n#swarm-resource = "DOCKER_RESOURCE_GPU"\n\n'
            '[nvidia-container-cli]\nenvironment = []\n')
    merged = _toolkit_config.merge(text, {"swarm-resource": "DOCKER_RESOURCE_NVIDIA-GPU"})
    assert merged["changed"]
    assert 'swarm-resource = "DOCKER_RESOURCE_NVIDIA-GPU"' in merged["text"]
    import tomllib

    doc = tomllib.loads(merged["text"])
    assert doc["swarm-resource"] == "DOCKER_RESOURCE_NVIDIA-GPU"
    assert doc["nvidia-container-cli"] == {"environment": []}
    assert _toolkit_config.merge(merged["text"], {"swarm-resource":
                                                  "DOCKER_RESOURCE_NVIDIA-GPU"})["changed"] is False
