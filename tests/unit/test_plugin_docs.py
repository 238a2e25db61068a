"""Every Ansible module of the project documents itself as ansible-doc and ansible-lint read
it: DOCUMENTATION, EXAMPLES and RETURN parse (a stray "word: " in a plain YAML line does not),
and the documented options are the ones the module's argument spec takes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from ansible.parsing.plugin_docs import read_docstring

MODULES = sorted((Path(__file__).resolve().parents[2] / "plugins" / "modules").glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_module_docs_parse_and_match_the_argument_spec(path):
    docs = read_docstring(str(path))
    doc = docs["doc"]
    assert doc and doc["module"] == path.stem
    assert docs["plainexamples"] and docs["returndocs"]
    # The argument spec's keys, read from the source (the module is not imported here).
    tree = ast.parse(path.read_text())
    specs = [kw.value for node in ast.walk(tree) if isinstance(node, ast.Call)
             for kw in node.keywords if kw.arg == "argument_spec"]
    assert len(specs) == 1 and isinstance(specs[0], ast.Dict)
    keys = {k.value for k in specs[0].keys if isinstance(k, ast.Constant)}
    assert keys == set(doc.get("options") or {})
