"""The roles' layout rules (issue 17's "house"), read from the files, so that a change that
breaks one fails here:

- decisions live in Python (gpuprov/*_plan.py, filters), so roles/*/vars/main.yml hold data:
  at most MAX_JINJA_LINES lines of Jinja in all of them together;
- a node fact has one reader (gpuprov_node_state, the probe): no shell scripts in roles/*/files;
- an include chain is at most MAX_INCLUDE_DEPTH task files deep, counting main.yml;
- task files are named in snake_case.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
MAX_JINJA_LINES = 20
MAX_INCLUDE_DEPTH = 3
INCLUDES = ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks")


def _jinja_lines(path: Path) -> int:
    """Source lines of the top-level values that hold Jinja (expressions or statements): a
    folded scalar counts each of its lines, a one-line value one."""
    count = 0
    for block in re.split(r"\n(?=\S)", path.read_text()):  # one block per top-level key
        code = [line for line in block.splitlines() if not line.lstrip().startswith("#")]
        if any("{{" in line or "{%" in line for line in code):
            count += len([line for line in code[1:] if line.strip()]) or 1
    return count


def test_vars_main_hold_data_not_decisions():
    counts = {role.name: _jinja_lines(role / "vars" / "main.yml")
              for role in ROLES if (role / "vars" / "main.yml").exists()}
    assert sum(counts.values()) <= MAX_JINJA_LINES, counts


def test_no_shell_scripts_read_nodes():
    assert sorted(ROOT.glob("roles/*/files/*.sh")) == []


def _tasks(items: list | None):
    for task in items or []:
        yield task
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section))


def _included(tasks_dir: Path, name: str) -> list[Path]:
    pattern = re.sub(r"\{\{.*?\}\}", "*", name)
    return sorted(tasks_dir.glob(pattern if pattern.endswith(".yml") else f"{pattern}.yml"))


def _depth(tasks_dir: Path, path: Path, seen: tuple = ()) -> int:
    assert path not in seen, f"include cycle through {path}"
    deepest = 0
    for task in _tasks(yaml.safe_load(path.read_text())):
        for key in INCLUDES:
            if key in task:
                for child in _included(tasks_dir, str(task[key])):
                    deepest = max(deepest, _depth(tasks_dir, child, (*seen, path)))
    return 1 + deepest


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_include_chains_are_at_most_three_files_deep(role):
    assert _depth(role / "tasks", role / "tasks" / "main.yml") <= MAX_INCLUDE_DEPTH


def test_the_depth_rule_sees_a_deep_chain(tmp_path):
    for name, child in (("main", "a"), ("a", "b_{{ x }}"), ("b_one", "c"), ("c", None)):
        tasks = [{"ansible.builtin.include_tasks": f"{child}.yml"}] if child else []
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump(tasks))
    assert _depth(tmp_path, tmp_path / "main.yml") == 4


def test_task_files_are_snake_case():
    names = [p.name for p in ROOT.glob("roles/*/tasks/*.yml")]
    assert names and [n for n in names if not re.fullmatch(r"[a-z0-9_]+\.yml", n)] == []
