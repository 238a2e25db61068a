#!/usr/bin/env python3
"""Each role's "Role variables" table, generated from its meta/argument_specs.yml.

argument_specs is the one description of a role's variables (Ansible checks them against it
when the role runs); the README table is written from it, and defaults/main.yml must give the
same defaults (tests/unit/test_role_docs.py fails when any of the three disagree).

    python scripts/role_docs.py           rewrite the tables in roles/*/README.md
    python scripts/role_docs.py --check   exit 1 naming the READMEs that are out of date

The table (and the line above it saying where it comes from) in the "## Role variables"
section is replaced; the section's other paragraphs stay.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ROLES = ROOT / "roles"
HEADING = "## Role variables"
# The line above the table (today's words, and the words of the READMEs before it existed).
INTRO_WORDS = ("Generated from `meta/argument_specs.yml`", "Mirrors `meta/argument_specs.yml`")
ANSIBLE_CODE = re.compile(r"\b[CVO]\(([^()]*)\)")
INTRO = ("Generated from `meta/argument_specs.yml` by `make docs` (`scripts/role_docs.py`); "
         "the defaults are those of `defaults/main.yml`.")


def options(role: Path) -> dict[str, dict]:
    """The main entry point's options, in their file order."""
    doc = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
    return doc["argument_specs"]["main"].get("options") or {}


def defaults(role: Path) -> dict:
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def _code(value: object) -> str:
    """A value as YAML writes it inline, in backticks."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        text = text.removesuffix("\n...").strip()
    return "`" + text.replace("|", "\\|") + "`"


def _type(spec: dict) -> str:
    kind = spec.get("type", "str")
    if kind == "list" and spec.get("elements"):
        kind = f"list of {spec['elements']}"
    if spec.get("choices"):
        kind += ": " + ", ".join(_code(c) for c in spec["choices"])
    return kind


def _default(name: str, spec: dict, role_defaults: dict) -> str:
    if "default" in spec:
        return _code(spec["default"])
    if spec.get("required"):
        return "required"
    value = role_defaults.get(name)
    if isinstance(value, str) and "{{" in value:
        return _code(value)  # resolved by Ansible: the expression says from what
    return "unset"


def _description(spec: dict) -> str:
    text = spec.get("description") or ""
    if isinstance(text, list):
        text = " ".join(str(t) for t in text)
    text = ANSIBLE_CODE.sub(r"`\1`", " ".join(text.split()))  # ansible-doc's C() / V() / O()
    return text.replace("|", "\\|")


def table(role: Path) -> str:
    role_defaults = defaults(role)
    rows = ["| variable | type | default | description |", "|---|---|---|---|"]
    for name, spec in options(role).items():
        rows.append(f"| `{name}` | {_type(spec)} | {_default(name, spec, role_defaults)} | "
                    f"{_description(spec)} |")
    return "\n".join(rows)


def render(readme: str, role: Path) -> str:
    """The README with the table of its Role variables section (and the line that says
    where it comes from) written anew; the section's other paragraphs stay."""
    lines = readme.split("\n")
    try:
        start = lines.index(HEADING)
    except ValueError:
        raise ValueError(f"{role.name}/README.md has no '{HEADING}' section") from None
    first = next((i for i in range(start + 1, len(lines))
                  if lines[i].startswith("|") or lines[i].startswith("## ")), len(lines))
    if first == len(lines) or not lines[first].startswith("|"):
        # No table yet: it goes at the end of the section's paragraphs (which may have the
        # line that says where it comes from, replaced like the table's).
        first = last = next((i for i in range(start + 1, len(lines))
                             if lines[i].startswith("## ")), len(lines))
    else:
        last = first
        while last < len(lines) and lines[last].startswith("|"):
            last += 1
    intro = [i for i in range(start + 1, first) if lines[i].startswith(INTRO_WORDS)]
    head = [line for i, line in enumerate(lines[start + 1:first], start + 1) if i not in intro]
    while head and not head[-1].strip():
        head.pop()
    body = [*head, "", INTRO, "", table(role)] if any(h.strip() for h in head) \
        else ["", INTRO, "", table(role)]
    return "\n".join([*lines[:start + 1], *body, *lines[last:]])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for role in sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists()):
        path = role / "README.md"
        old = path.read_text()
        new = render(old, role)
        if new != old:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"role_docs: out of date: {', '.join(stale)}; run `make docs`", file=sys.stderr)
        return 1
    for name in stale:
        print(f"role_docs: wrote {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
