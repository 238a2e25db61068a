"""Where things live, as tests (DESIGN.md "Where things live", README's architecture table):

- a role's decisions are gpuprov/stages/<role>.py, its filters plugins/filter/<role>.py, its
  stage tests tests/unit/test_stage_<role>.py; nothing else is named like a stage or a filter
  file, and a filter file calls its own role's stage (or the stages' shared parts);
- gpuprov/nvidia/ (NVIDIA's facts) imports the standard library only, and each module names
  its sources with the date they were read;
- gpuprov/node/ (what runs on a node) imports the standard library, gpuprov.nvidia and
  gpuprov.node only (pynvml inside functions, relatively inside gpuprov, so that it also works
  as the collection's module_utils gpuprov), and needs no newer Python than the probe claims
  (gpuprov.payload.MIN_PYTHON);
- what a node gets is derived from the folder: the payload and the module's module_utils.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuprov import payload

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gpuprov"
STAGES, NVIDIA, NODE = PACKAGE / "stages", PACKAGE / "nvidia", PACKAGE / "node"
FILTERS = REPO / "plugins" / "filter"
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())
STDLIB = sys.stdlib_module_names | {"__future__"}
# A filter call in a role's tasks or vars, by its FQCN: `| gpuprov.cluster.gpuprov_name(`.
FILTER_CALL = re.compile(r"\|\s*gpuprov\.cluster\.(gpuprov_\w+)")


def _modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> list[tuple[str, ast.AST, bool]]:
    """(absolute module, node, at module level) of every import in the file; a relative import
    is resolved against the file's package, `from X import name` counts X.name where that is a
    module of the repository."""
    tree = ast.parse(path.read_text(), str(path))
    package = _dotted(path) if path.name == "__init__.py" else _dotted(path).rpartition(".")[0]
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node, id(node) in top_level) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                name = f"{base}.{alias.name}"
                module = REPO / Path(*name.split("."))
                found.append((name if module.with_suffix(".py").exists() or module.is_dir()
                              else base, node, id(node) in top_level))
    return found


# -- a room per role ----------------------------------------------------------------------


def test_roles_stage_modules_and_filter_files_are_in_step():
    stages = {p.stem for p in STAGES.glob("*.py") if not p.stem.startswith("_")}
    filters = {p.stem for p in FILTERS.glob("*.py")}
    with_filters = {role for role in ROLES if any(
        FILTER_CALL.search(path.read_text())
        for path in (REPO / "roles" / role).glob("*/*.yml"))}
    assert stages == filters == with_filters
    assert stages <= set(ROLES)
    # Each stage is tested under its own name.
    assert {p.name for p in (REPO / "tests" / "unit").glob("test_stage_*.py")} >= {
        f"test_stage_{role}.py" for role in stages}


def test_a_role_calls_filters_that_exist():
    defined = set()
    for path in FILTERS.glob("*.py"):
        defined |= set(re.findall(r"^def (gpuprov_\w+)\(", path.read_text(), re.M))
    for role in ROLES:
        for path in (REPO / "roles" / role).glob("*/*.yml"):
            called = set(FILTER_CALL.findall(path.read_text()))
            assert called <= defined, f"{path.relative_to(REPO)}: {called - defined}"


def test_roles_and_playbooks_call_gpuprovs_plugins_by_their_fqcn():
    """A role of an installed collection finds its own collection's modules by short name, but
    not its filters and lookups (Ansible's "Using collections in a playbook"); FQCN throughout
    works from a clone and from the installed collection alike."""
    bare = re.compile(r"\|\s*gpuprov_\w+|(?:lookup|query)\(\s*'gpuprov_\w+"
                      r"|^\s*(?:-\s+)?gpuprov_\w+:", re.M)
    paths = [*REPO.glob("roles/*/*/*.yml"), *REPO.glob("roles/*/templates/**/*.j2"),
             *REPO.glob("playbooks/*.yml")]
    found = {str(p.relative_to(REPO)): bare.findall(p.read_text()) for p in paths}
    assert {path: calls for path, calls in found.items() if calls} == {}


@pytest.mark.parametrize("role", sorted(p.stem for p in FILTERS.glob("*.py")))
def test_a_filter_file_calls_its_own_stage(role):
    """Thin: it checks what the role hands it and calls gpuprov/stages/<role>.py (or a part the
    stages share, or NVIDIA's facts); it imports no gpuprov module at load time."""
    text = (FILTERS / f"{role}.py").read_text()
    called = set(re.findall(r"\bstage\(\"(\w+)\"\)", text))
    assert called and all(name == role or name.startswith("_") for name in called), called
    assert not re.search(r"^(from|import) gpuprov\b", text, re.M)
    assert "class FilterModule" not in text  # the shared filter_module() builds it


# -- gpuprov/nvidia/ ----------------------------------------------------------------------


@pytest.mark.parametrize("path", _modules(NVIDIA), ids=lambda p: p.name)
def test_nvidia_facts_import_the_standard_library_only(path):
    for name, _, _ in _imports(path):
        top = name.split(".")[0]
        assert top in STDLIB or name.startswith("gpuprov.nvidia"), f"{path.name}: {name}"


@pytest.mark.parametrize("path", [p for p in _modules(NVIDIA) if p.name != "__init__.py"],
                         ids=lambda p: p.name)
def test_nvidia_facts_name_their_sources_with_a_date(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert re.search(r"\b20\d\d-[01]\d\b", doc), f"{path.name}: no dated source in its docstring"


# -- gpuprov/node/ ------------------------------------------------------------------------


@pytest.mark.parametrize("path", _modules(NODE), ids=lambda p: str(p.relative_to(NODE)))
def test_node_code_imports_the_standard_library_nvidia_and_node_only(path):
    for name, node, top_level in _imports(path):
        top = name.split(".")[0]
        if top in STDLIB:
            continue
        if top in ("pynvml", "prometheus_client"):
            # Lazily: a node without the driver still gets a report, and the controller that
            # builds the payload never imports it (prometheus_client: the health agent's
            # metrics only, shipped in its payload).
            assert not top_level, f"{path.name}: {top} imported at load time"
            continue
        assert name == "gpuprov" or name.startswith(("gpuprov.nvidia", "gpuprov.node")), \
            f"{path.name}: {name}"
        # Relative inside the package, so that the same files work as ansible.module_utils.
        assert isinstance(node, ast.ImportFrom) and (node.level or name == "gpuprov"), \
            f"{path.name}: import {name} relatively"


@pytest.mark.parametrize("path", _modules(NODE) + [NVIDIA / "hardware.py"],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_node_code_parses_with_the_oldest_python_the_probe_supports(path):
    ast.parse(path.read_text(), str(path), feature_version=payload.MIN_PYTHON)


def test_node_code_needs_no_newer_python_than_the_probe_supports(tool):
    """vermin reads the standard library's API too (zip(strict=) is 3.10's): every file the
    payload ships but pynvml and prometheus_client (their own projects'; prometheus_client
    declares Requires-Python >= 3.9), the health agent's payload being the largest."""
    files = [str(p) for name, p in payload.payload_files("health-agent").items()
             if name != "pynvml.py" and not name.startswith("prometheus_client/")]
    target = ".".join(map(str, payload.MIN_PYTHON))
    run = subprocess.run([tool("vermin"), f"-t={target}-", "--violations", "--no-tips", *files],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


# -- shipped by folder ----------------------------------------------------------------------


@pytest.mark.parametrize("entry", sorted(payload.ENTRIES))
def test_the_payload_is_the_node_folder_and_the_nvidia_facts_it_imports(entry):
    shipped = _modules(NODE)
    if entry == "health-agent":
        shipped = shipped + [REPO / name for name in payload.HEALTH_AGENT_FILES]
    imported = {name.split(".")[2] for path in shipped for name, _, _ in _imports(path)
                if name.startswith("gpuprov.nvidia.")}
    # The payload reads the imports with a pattern (faster than ast): it must find the same.
    assert payload.nvidia_imports(shipped) == imported
    expected = {f"gpuprov/{p.relative_to(PACKAGE).as_posix()}" for p in shipped}
    expected |= {"gpuprov/__init__.py", "gpuprov/nvidia/__init__.py", "pynvml.py"}
    expected |= {f"gpuprov/nvidia/{name}.py" for name in imported}
    files = set(payload.payload_files(entry))
    if entry == "health-agent":
        assert "prometheus_client/__init__.py" in files
        files = {f for f in files if not f.startswith("prometheus_client/")}
    assert files == expected


def test_the_health_agent_payload_imports_only_what_it_ships():
    """verify's node phase runs on the node: everything its files import at load time is the
    standard library or shipped with them (not fabric, kubernetes, yaml ...)."""
    shipped = {name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
               for name in payload.payload_files("health-agent")}
    for name in payload.HEALTH_AGENT_FILES:
        for module, _, top_level in _imports(REPO / name):
            if not top_level or module.split(".")[0] in STDLIB:
                continue
            assert module in shipped or module.rpartition(".")[0] in shipped, (name, module)


def test_the_module_utils_are_the_node_and_nvidia_folders():
    module_utils = REPO / "plugins" / "module_utils" / "gpuprov"
    links = {p.name: p.resolve() for p in module_utils.iterdir()}
    assert all(p.is_symlink() for p in module_utils.iterdir())
    assert links == {"__init__.py": PACKAGE / "__init__.py", "node": NODE, "nvidia": NVIDIA}
