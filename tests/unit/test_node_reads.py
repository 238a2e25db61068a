"""The roles' one read of a node (gpuprov.node.probe.node_state, run by the gpuprov_node_state
module) and the filters the roles decide from (plugins/filter/nvidia_driver.py).

Fixture cases, the way pyinfra's tests/facts/*/ are written: each
tests/fixtures/node_state/*.yml gives the module's arguments, the files of a node (under a
directory that stands for /), what each command the read runs prints there, and the state
the read must return. Where each command's output comes from is said in the case's comment.
A command a case does not list fails the test: each case names everything the read runs.
One more test runs the module itself through ansible-playbook, as the roles do, so that its
module_utils (gpuprov's probe, through plugins/module_utils/gpuprov) are shipped for real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from gpuprov.node.probe import node_state
from gpuprov.node.probe.fs import Root
from gpuprov.stages import _node_read

REPO = Path(__file__).resolve().parents[2]
CASES = sorted((REPO / "tests" / "fixtures" / "node_state").glob("*.yml"))
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"


@pytest.fixture(scope="module")
def packages(ansible_plugin):
    return ansible_plugin("filter/nvidia_driver.py")


def _plant(root: Path, files: dict) -> None:
    """Node files: path -> text, or {text, mode, encoding}; a path ending in / is a directory."""
    for node_path, spec in (files or {}).items():
        target = root / node_path.lstrip("/")
        if node_path.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            continue
        spec = spec if isinstance(spec, dict) else {"text": spec}
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(spec["text"].encode(spec.get("encoding", "utf-8")))
        target.chmod(int(str(spec.get("mode", "0644")), 8))


def _runner(commands: list, root: Path):
    answers = {tuple(a.replace("{root}", str(root)) for a in c["argv"]): c for c in commands}

    def run(argv: list, path: str = "") -> tuple[int, str, str]:
        answer = answers.get(tuple(argv))
        assert answer is not None, f"the read ran {argv}, which the case does not list"
        return answer.get("rc", 0), answer.get("stdout", ""), answer.get("stderr", "")

    return run


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.stem)
def test_node_reads_as_the_case_says(case, tmp_path):
    spec = yaml.safe_load(case.read_text())
    _plant(tmp_path, spec.get("root"))
    args = spec.get("args", {})
    state = node_state.read(
        Root(str(tmp_path)), _runner(spec.get("commands", []), tmp_path),
        read_packages=args.get("packages", False), units=tuple(args.get("units", ())),
        files=tuple(args.get("files", ())), configs=tuple(args.get("configs", ())),
        version_command=tuple(args.get("version_command", ())))
    expected = spec["state"]
    # The files' owner is whoever runs the test (the case's files are planted by it).
    for found in expected.get("files", []):
        found.update(uid=os.getuid(), gid=os.getgid())
    assert state == {**EMPTY_STATE, **expected}


EMPTY_STATE = {"package_manager": None, "packages": {}, "packages_error": None,
               "interrupted": [], "nouveau_loaded": False, "module_version": None, "units": {},
               "files": [], "contents": {}, "unreadable": [], "version": None}


def test_the_module_runs_under_ansible_with_the_probe_as_its_module_utils(tmp_path):
    """The module as the roles run it: AnsiballZ carries gpuprov's probe to the "node" (here a
    local connection), so a missing module_utils file or an absolute import that Ansible does
    not ship fails here, not on a cluster."""
    written = tmp_path / "written.conf"
    written.write_text("blacklist nouveau\n")
    playbook = tmp_path / "read.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"gpuprov.cluster.gpuprov_node_state": {
            "units": ["nvidia-persistenced"], "files": [str(written), str(tmp_path / "absent")],
            "configs": [str(written)], "version_command": ["gpuprov-no-such-runtime", "-v"]},
            "register": "read"},
            {"ansible.builtin.copy": {"content": "{{ read.state | to_json }}",
                                      "dest": str(tmp_path / "state.json")}}]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    proc = subprocess.run(
        [str(PLAYBOOK_BIN), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(playbook)],
        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    state = json.loads((tmp_path / "state.json").read_text())
    assert [f["path"] for f in state["files"]] == [str(written)]
    assert state["contents"] == {str(written): "blacklist nouveau\n"}
    assert state["version"]["rc"] == 127
    assert set(state["units"]) == {"nvidia-persistenced"}


def test_missing_packages_honour_state_and_pinned_version():
    installed = {"a": {"version": "535.261.03-1~deb12u1", "state": "installed"},
                 "b": {"version": "535.261.03-1~deb12u1", "state": "half-configured"}}
    assert _node_read.packages_missing(["a", "b", "c"], installed) == ["b", "c"]
    assert _node_read.packages_missing(["a"], installed, version="535.261.03-1~deb12u1") == []
    assert _node_read.packages_missing(["a"], installed, version="535.261.03*") == []
    assert _node_read.packages_missing(["a"], installed, version="535.261.03") == ["a"]
    assert _node_read.packages_missing(["a"], installed, version="470.256.02-1") == ["a"]


def test_missing_packages_read_the_probe_list_too():
    probe_list = [{"name": "nvidia-container-toolkit", "version": "1.17.8-1",
                   "state": "installed", "held": False}]
    names = ["nvidia-container-toolkit", "libnvidia-container1"]
    assert _node_read.packages_missing(names, probe_list) == ["libnvidia-container1"]
    assert _node_read.packages_missing(names[:1], probe_list, version="1.17.7-1") == names[:1]


def test_written_files_are_current_only_with_the_same_content_mode_and_root_owner(packages,
                                                                                   tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/sources").write_text("Types: deb\n")
    (tmp_path / "etc/blacklist").write_text("blacklist nouveau\n")
    (tmp_path / "etc/blacklist").chmod(0o600)
    root = Root(str(tmp_path))
    files = [root.file_facts(p) for p in ("/etc/sources", "/etc/blacklist")]
    uid_is_root = os.getuid() == 0 and os.getgid() == 0
    assert packages.gpuprov_file_current(files, "/etc/sources", "Types: deb\n") is uid_is_root
    assert not packages.gpuprov_file_current(files, "/etc/sources", "Types: deb-src\n")
    assert not packages.gpuprov_file_current(files, "/etc/blacklist", "blacklist nouveau\n")  # 0600
    assert not packages.gpuprov_file_current(files, "/etc/absent", "")
    with pytest.raises(AnsibleFilterError, match="list of files"):
        packages.gpuprov_file_current({"path": "/etc/sources"}, "/etc/sources", "")
