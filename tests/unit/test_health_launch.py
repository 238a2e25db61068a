"""The health agent's bytecode cache (gpuprov/node/health/launch.py): on a node whose Python is
not the controller's, the first start compiles the payload once, keeps the bytecode under the
agent's state directory and starts again from it; every later start compiles nothing. The
one-shot probe keeps writing nothing."""

from __future__ import annotations

import base64
import json
import marshal
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from gpuprov import payload
from gpuprov.node.health import launch

FOREIGN_MAGIC = b"\x00\x00\r\n"  # no Python's: the shipped bytecode is never used

# Runs the payload script as `python3 -I SCRIPT ARGS` would (runpy, __main__), with compile()
# counted for the payload's own files: one "COMPILED <file>" line on stderr each. The agent's
# re-execution runs this wrapper again (sys.orig_argv), so each process counts its own.
WRAPPER = """\
import builtins, runpy, sys
real = builtins.compile
def counted(source, filename, *args, **kwargs):
    if str(filename).startswith("<gpuprov-payload>/"):
        sys.stderr.write("COMPILED %s\\n" % filename)
    return real(source, filename, *args, **kwargs)
builtins.compile = counted
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _repack(script: bytes, edit) -> bytes:
    head, rest = script.split(b"\n", 1)
    packed = marshal.loads(zlib.decompress(base64.b64decode(head[len(b'PAYLOAD = b"'):-1])))
    edit(packed)
    encoded = base64.b64encode(zlib.compress(marshal.dumps(packed, payload.MARSHAL_VERSION)))
    return b'PAYLOAD = b"' + encoded + b'"\n' + rest


def _foreign(packed: dict) -> None:
    packed["magic"] = FOREIGN_MAGIC


@pytest.fixture(scope="module")
def foreign_script(tmp_path_factory) -> tuple[Path, int]:
    """The agent's payload script as built by a controller whose Python is not the node's, and
    how many files it ships."""
    directory = tmp_path_factory.mktemp("script")
    built = payload.node_script("health-agent")
    sources = len(marshal.loads(zlib.decompress(base64.b64decode(
        built.split(b"\n", 1)[0][len(b'PAYLOAD = b"'):-1])))["sources"])
    (directory / "health-agent.py").write_bytes(_repack(built, _foreign))
    (directory / "wrapper.py").write_text(WRAPPER)
    return directory, sources


def _start(directory: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "kmsg").write_text("6,0,0,-;Linux\n")
    config = tmp_path / "health.json"
    config.write_text(json.dumps({"node_name": "here", "state_dir": str(tmp_path / "state"),
                                  "kmsg": str(tmp_path / "kmsg")}))
    run = subprocess.run([sys.executable, "-I", str(directory / "wrapper.py"),
                          str(directory / "health-agent.py"), "agent", "--config", str(config),
                          "--once"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    return run


def _compiled(stderr: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in stderr.splitlines()
            if line.startswith("COMPILED ")]


def _compiled_before_restart(stderr: str, sources: int) -> bool:
    """The launcher, then every file once, then the re-execution."""
    before, restarted, _ = stderr.partition("starting again")
    compiled = _compiled(before)
    return bool(restarted) and compiled[:len(LAUNCHER)] == PREFIXED \
        and len(compiled) == len(set(compiled[len(LAUNCHER):])) + len(LAUNCHER) \
        == sources + len(LAUNCHER)


# What each process compiles before it can read the cache: the launcher and its packages'
# __init__ files (5 kB of the payload's 0.8 MB).
LAUNCHER = ["gpuprov/__init__.py", "gpuprov/node/__init__.py",
            "gpuprov/node/health/__init__.py", "gpuprov/node/health/launch.py"]

PREFIXED = [payload.PAYLOAD_PREFIX + name for name in LAUNCHER]


def _cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "state").glob("payload-*.bytecode"))


@pytest.mark.skipif(sys.version_info < (3, 10), reason="re-execution needs sys.orig_argv")
def test_the_first_start_compiles_once_and_later_starts_read_no_source(foreign_script, tmp_path):
    directory, sources = foreign_script
    first = _start(directory, tmp_path)
    # Every file once in the process that then re-executed itself; the re-executed agent
    # (whose stderr follows) compiled only the launcher again.
    assert _compiled_before_restart(first.stderr, sources), first.stderr
    assert _compiled(first.stderr.partition("starting again")[2]) == PREFIXED
    [cache] = _cache_files(tmp_path)
    assert cache.stat().st_mode & 0o077 == 0
    assert json.loads((tmp_path / "state" / "conditions.json").read_text())["node"] == "here"

    second = _start(directory, tmp_path)
    assert _compiled(second.stderr) == PREFIXED
    assert f"read from {cache}" in second.stderr


@pytest.mark.skipif(sys.version_info < (3, 10), reason="re-execution needs sys.orig_argv")
def test_a_cache_file_others_may_write_is_not_run(foreign_script, tmp_path):
    directory, sources = foreign_script
    _start(directory, tmp_path)
    [cache] = _cache_files(tmp_path)
    cache.chmod(0o666)
    again = _start(directory, tmp_path)
    assert _compiled_before_restart(again.stderr, sources), again.stderr  # not loaded
    [cache] = _cache_files(tmp_path)
    assert cache.stat().st_mode & 0o077 == 0  # and replaced by one of its own


def test_the_probe_and_the_mig_applier_keep_bytecode_nowhere():
    # One-shot programs write nothing on the node: no prelude, so no cache.
    assert set(payload.PRELUDES) == {"health-agent"}
    assert b"keep_bytecode" not in payload.node_script("probe")
    assert b"keep_bytecode" in payload.node_script("health-agent")


class _Importer:
    def __init__(self, sources: dict, code: dict | None = None, payload_id: str = "p1"):
        self.sources, self.code, self.payload_id = sources, code or {}, payload_id
        self.prefix = payload.PAYLOAD_PREFIX


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "health.json"
    config.write_text(json.dumps({"node_name": "n", "state_dir": str(tmp_path / "state")}))
    return config


def test_shipped_bytecode_for_this_python_writes_nothing(tmp_path):
    importer = _Importer({"a.py": b"x = 1\n"}, code={"a.py": b"..."})
    argv = ["agent", "--config", str(_config(tmp_path))]
    assert launch.keep_bytecode(importer, argv) == "shipped"
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("argv", [["remove-conditions", "--config", "CONFIG"], ["--help"],
                                  ["agent", "--config", "MISSING"]])
def test_other_commands_and_unreadable_configs_compile_in_memory(tmp_path, argv):
    config = str(_config(tmp_path))
    argv = [config if a == "CONFIG" else str(tmp_path / "missing") if a == "MISSING" else a
            for a in argv]
    assert launch.keep_bytecode(_Importer({"a.py": b"x = 1\n"}), argv) == "source"
    assert not (tmp_path / "state").exists()


def test_a_cache_of_another_payload_or_python_or_cut_short_reads_as_absent(tmp_path):
    code = {"a.py": marshal.dumps(compile("x = 1\n", "a.py", "exec"))}
    path = launch.cache_path(str(tmp_path), "p1")
    assert launch.write_cache(path, "p1", code)
    assert launch.read_cache(path, "p1", ["a.py"]) == code
    assert launch.read_cache(path, "p2", ["a.py"]) is None  # another payload
    assert launch.read_cache(path, "p1", ["a.py", "b.py"]) is None  # other files
    data = Path(path).read_bytes()
    Path(path).write_bytes(data.replace(launch.MAGIC_NUMBER, b"\x00\x00\r\n"))
    assert launch.read_cache(path, "p1", ["a.py"]) is None  # another Python's
    Path(path).write_bytes(data[: len(data) // 2])
    assert launch.read_cache(path, "p1", ["a.py"]) is None  # cut short
    os.chmod(tmp_path, 0o777)
    Path(path).write_bytes(data)
    assert launch.read_cache(path, "p1", ["a.py"]) is None  # a directory others may write
    os.chmod(tmp_path, 0o700)
    assert launch.read_cache(path, "p1", ["a.py"]) == code


def test_compiled_here_and_cached_then_restarted_once(tmp_path, monkeypatch):
    importer = _Importer({"a.py": b"x = 1\n"})
    argv = ["agent", "--config", str(_config(tmp_path))]
    calls = []
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-I", __file__, *argv], raising=False)
    monkeypatch.setattr(sys, "argv", [__file__, *argv])
    monkeypatch.delenv(launch.REEXEC_MARK, raising=False)
    launch.keep_bytecode(importer, argv, execv=lambda exe, args: calls.append(args))
    assert calls == [["python3", "-I", __file__, *argv]]
    assert os.environ.pop(launch.REEXEC_MARK) == "p1"
    # The re-executed process reads the file.
    assert launch.keep_bytecode(_Importer({"a.py": b"x = 1\n"}), argv) == "cache"
    # A second re-execution is never asked for, even where the cache cannot be read back.
    for cache in (tmp_path / "state").glob("payload-*"):
        cache.chmod(0o666)
    monkeypatch.setenv(launch.REEXEC_MARK, "p1")
    calls.clear()
    importer = _Importer({"a.py": b"x = 1\n"})
    assert launch.keep_bytecode(importer, argv, execv=lambda exe, args: calls.append(args)) \
        == "compiled"
    assert calls == [] and set(importer.code) == {"a.py"}
