"""Each role variable is described once: meta/argument_specs.yml. defaults/main.yml gives the
same defaults, and the README's "Role variables" table is generated from it
(scripts/role_docs.py, `make docs`); this fails when any of the three disagree."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("role_docs", ROOT / "scripts" / "role_docs.py")
role_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(role_docs)

ROLES = sorted(p for p in (ROOT / "roles").iterdir()
               if (p / "meta" / "argument_specs.yml").exists())


def _templated(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def test_every_role_is_covered():
    assert [r.name for r in ROLES] == sorted(p.name for p in (ROOT / "roles").iterdir()
                                             if p.is_dir())


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_readme_table_is_generated_from_argument_specs(role):
    readme = (role / "README.md").read_text()
    assert role_docs.render(readme, role) == readme, \
        f"{role.name}/README.md is out of date: run `make docs`"


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.name)
def test_defaults_and_argument_specs_agree(role):
    options, defaults = role_docs.options(role), role_docs.defaults(role)
    assert set(defaults) <= set(options), f"undocumented: {sorted(set(defaults) - set(options))}"
    for name, spec in options.items():
        if name not in defaults:
            # Only another role's variable that this one reads (gpu_preflight reads the
            # driver's branch pin) has its default there.
            assert not name.startswith(role.name + "_"), f"{name} has no default"
            assert any(name in role_docs.options(r) for r in ROLES if r != role), name
            continue
        value = defaults[name]
        if _templated(value):
            continue  # resolved by Ansible; the table shows the expression
        assert spec.get("default") == value, name


def _role_with_a_section_after_the_table() -> Path:
    """A role whose README has another section after the settings table: the render tests
    below check that what follows the table is kept."""
    for role in ROLES:
        readme = (role / "README.md").read_text()
        if "\n## " in readme[readme.index(role_docs.HEADING):]:
            return role
    raise AssertionError("no role README has a section after its settings table")


def test_render_keeps_the_sections_other_paragraphs(tmp_path):
    role = _role_with_a_section_after_the_table()
    readme = (role / "README.md").read_text()
    section_end = readme.index("\n## ", readme.index(role_docs.HEADING))
    extended = readme[:section_end] + "\nA paragraph after the table.\n" + readme[section_end:]
    assert role_docs.render(extended, role) == extended
    row = readme.index("| `", readme.index(role_docs.HEADING))
    stale = readme[:row] + "| `stale_" + readme[row + 3:]
    assert role_docs.render(stale, role) == readme


def test_render_writes_a_missing_table_once_after_the_sections_paragraphs():
    role = _role_with_a_section_after_the_table()
    readme = (role / "README.md").read_text()
    start = readme.index(role_docs.HEADING)
    end = readme.index("\n## ", start)
    # A new role's README: a paragraph and the line that says where the table comes from.
    bare = (readme[:start] + role_docs.HEADING + "\n\nA paragraph.\n\n" + role_docs.INTRO + "\n"
            + readme[end:])
    rendered = role_docs.render(bare, role)
    assert rendered.count(role_docs.INTRO) == 1
    section = rendered[start:rendered.index("\n## ", start)]
    assert section.index("A paragraph.") < section.index(role_docs.INTRO) < section.index("| `")
    assert role_docs.render(rendered, role) == rendered
