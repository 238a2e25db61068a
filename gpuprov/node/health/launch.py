"""The health agent's start: bytecode for the node's own Python, kept under the agent's state
directory, so that the long-running agent never compiles its modules itself.

Why: the payload (gpuprov/payload.py) ships bytecode compiled by the controller's Python, used
only where the node's Python has the same magic number; any other node compiles the ~0.8 MB of
sources at every start, and the compiler's memory stays resident for the process's life
(CPython's small-object allocator keeps its arenas: the agent resident at 44.3 instead of
30.8 MiB, `bench/health_agent.py --part memory`). The probe and the MIG applier are
one-shot processes that must write nothing on the node: they keep compiling in memory. The
agent owns a directory (state_dir, writable under its unit's ProtectSystem=strict), so:

  1. the bytecode shipped for this Python: used, nothing written;
  2. else a cache file state_dir/payload-<payload id>-<magic>.bytecode written by an earlier
     start of this payload on this Python: used (the second start compiles nothing);
  3. else every module is compiled here, written to that file (whole, then renamed), and the
     process re-executes itself once (same pid, same argv), so that the running agent is a
     process that loaded bytecode, not one that holds the compiler's arenas.

Chosen over compiling once in the gpu_health role at install: the cache follows the node's
Python on its own (an upgrade of python3 changes the magic number: the next start writes the
new file) and needs no task that runs python3 on the node in check mode.

The file is code run as root: it is used only when it and its directory belong to this user
and nobody else may write them (as gpuprov's controller-side cache, payload._private_dir), and
only when it names this payload and this Python; anything else reads as absent.
"""

from __future__ import annotations

import json
import marshal
import os
import sys
import tempfile
from importlib.util import MAGIC_NUMBER
from typing import Any

REEXEC_MARK = "GPUPROV_HEALTH_REEXEC"  # set for the one re-execution (no loop on a bad disk)
MARSHAL_VERSION = 2  # as payload.py: no process-wide interning state in the bytes


def cache_path(directory: str, payload_id: str) -> str:
    return os.path.join(directory, f"payload-{payload_id}-{MAGIC_NUMBER.hex()}.bytecode")


def _private(path: str) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def read_cache(path: str, payload_id: str, names: Any) -> dict | None:
    """The cached {module file: marshalled code}, or None where it is absent or not to trust."""
    if not (_private(os.path.dirname(path) or ".") and _private(path)):
        return None
    try:
        with open(path, "rb") as f:
            doc = marshal.loads(f.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(doc, dict) or doc.get("id") != payload_id \
            or doc.get("magic") != MAGIC_NUMBER or not isinstance(doc.get("code"), dict) \
            or set(doc["code"]) != set(names):
        return None
    return doc["code"]


def write_cache(path: str, payload_id: str, code: dict) -> bool:
    """Written whole under another name and renamed: a crash leaves the old file or none.
    Other payloads' files are removed (one agent, one payload at a time)."""
    directory = os.path.dirname(path) or "."
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=".payload-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps({"id": payload_id, "magic": MAGIC_NUMBER, "code": code},
                                      MARSHAL_VERSION))
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        for name in os.listdir(directory):
            if name.startswith("payload-") and name.endswith(".bytecode") \
                    and name != os.path.basename(path):
                os.unlink(os.path.join(directory, name))
    except OSError as exc:
        _say(f"bytecode not cached in {directory}: {exc}")
        return False
    return True


def _say(text: str) -> None:
    sys.stderr.write(f"gpuprov-health: INFO {text}\n")


def _state_dir(argv: list[str]) -> str | None:
    """The config's state_dir for the `agent` command; None for anything else (remove-conditions
    at uninstall, --help, a config the agent itself will refuse with its own message)."""
    if not argv or argv[0] != "agent":
        return None
    config = "/etc/gpuprov/health.json"  # agent.CONFIG_PATH (not imported: that compiles it)
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            config = argv[i + 1]
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
    try:
        with open(config) as f:
            value = json.load(f).get("state_dir", "/var/lib/gpuprov/health")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and os.path.isabs(value) else None


def keep_bytecode(importer: Any, argv: list[str], execv: Any = os.execv) -> str:
    """Give the payload's importer bytecode for this Python (see the module's docstring) before
    anything else is imported; returns how: "shipped", "cache", "compiled", or "source" (no
    state directory to keep it in: compiled as each module is imported, as the probe is)."""
    marked = os.environ.pop(REEXEC_MARK, None)
    if importer.code:
        return "shipped"
    directory = _state_dir(argv)
    payload_id = getattr(importer, "payload_id", None)
    if directory is None or not payload_id:
        return "source"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return "source"
    path = cache_path(directory, payload_id)
    code = read_cache(path, payload_id, importer.sources)
    if code is not None:
        importer.code = code
        _say(f"bytecode for this Python read from {path}")
        return "cache"
    code = {name: marshal.dumps(compile(source, importer.prefix + name, "exec",
                                        dont_inherit=True, optimize=0), MARSHAL_VERSION)
            for name, source in importer.sources.items()}
    written = write_cache(path, payload_id, code)
    restart = getattr(sys, "orig_argv", None)  # Python >= 3.10; else no re-execution
    if written and not marked and restart and os.path.isfile(sys.argv[0]):
        _say(f"bytecode for this Python compiled into {path}; starting again from it")
        sys.stderr.flush()
        os.environ[REEXEC_MARK] = payload_id
        execv(sys.executable, restart)
    importer.code = code
    return "compiled"
