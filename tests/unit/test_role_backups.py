"""Every task of the roles and playbooks that writes a file on a node keeps a backup of the
file it replaces (Ansible's `backup: true`), read from the task files themselves, so a new
task that forgets it fails here. The lab and molecule tests check that the backups appear."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]

# Modules that write a file on the managed node and take `backup`.
FILE_WRITERS = {
    "ansible.builtin.template", "ansible.builtin.copy", "ansible.builtin.lineinfile",
    "ansible.builtin.blockinfile", "ansible.builtin.replace", "ansible.builtin.get_url",
    "community.general.ini_file",
}
# Files written that are not configuration, each with why no backup is kept.
NO_BACKUP = {
    # NVIDIA's repository key as downloaded (ASCII armour), replaced when NVIDIA rotates it:
    # a backup of an old key is never wanted back; the keyring made from it is apt's config.
    "{{ __nvidia_container_toolkit_plan.key_source }}",
    # The copy IS the backup: of the second CDI spec earlier releases wrote to /etc/cdi, kept
    # out of /etc/cdi before the role removes it (roles/nvidia_container_toolkit/tasks/cdi.yml).
    "/var/backups/gpuprov-etc-cdi-nvidia.yaml",
    # The health agent's program (gpuprov's payload, about 0.8 MB), replaced whole by each
    # gpuprov release: not configuration; its config and unit beside it are backed up.
    "{{ gpu_health_install_dir }}/health-agent.py",
}


def _tasks(items: list | None):
    for task in items or []:
        yield task
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section))


def _task_files() -> list[Path]:
    return sorted(ROOT.glob("roles/*/tasks/*.yml")) + sorted(ROOT.glob("roles/*/handlers/*.yml"))


def _playbook_tasks(path: Path):
    for play in yaml.safe_load(path.read_text()) or []:
        for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
            yield from _tasks(play.get(section))


def _writers():
    for path in _task_files():
        for task in _tasks(yaml.safe_load(path.read_text())):
            yield path, task
    for path in sorted(ROOT.glob("playbooks/*.yml")):
        for task in _playbook_tasks(path):
            yield path, task


WRITERS = [(path, task) for path, task in _writers() if FILE_WRITERS & task.keys()]


def test_the_roles_write_files():
    # The scan finds the tasks it is about (else the test below would pass on nothing).
    assert len(WRITERS) >= 8, [t.get("name") for _, t in WRITERS]


@pytest.mark.parametrize(("path", "task"), WRITERS,
                         ids=[f"{p.relative_to(ROOT)}:{t.get('name')}" for p, t in WRITERS])
def test_a_task_that_writes_a_file_backs_it_up(path, task):
    module = next(iter(FILE_WRITERS & task.keys()))
    args = task[module]
    target = args.get("dest") or args.get("path")
    if target in NO_BACKUP:
        return
    assert args.get("backup") is True, (
        f"{path.relative_to(ROOT)}: task {task.get('name')!r} writes {target} without "
        "backup: true"
    )
