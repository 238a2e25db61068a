"""Ship the probe to a node that has only python3, and run it there in one SSH round trip.

Like Ansible's AnsiballZ: what runs on a node (the gpuprov/node/ folder, with the NVIDIA facts it
imports from gpuprov/nvidia/) and pynvml's single module (from the installed nvidia-ml-py) are
packed into a small Python script that is sent on stdin to ``python3 -I -``. The script
imports the modules from memory, so nothing is written on the node, and prints the
probe's JSON report on stdout.

The probe is started once per node per run, so its start-up is most of its cost (it was
0.2 CPU-s, 40 % of it compiling the modules, pynvml most of that). Hence the packing: a
zlib-compressed marshal of plain dicts (zlib, binascii and marshal are built in; zipfile
alone imports pathlib and more), base64 (decoded in C; base85 is pure Python), and, beside
each source, its bytecode compiled by the controller's Python, which the node uses only
when its own bytecode magic number is the same (the same Python minor version); any other
node compiles the sources.

The same script works over plain OpenSSH (``ssh node python3 -I - < script``), which
is what benchmarks compare against.

Building it costs the controller about 0.08 CPU-s (compiling pynvml, compressing), as much as
probing a dozen nodes, on every `gpuprov verify` run. So the built script is kept in the
user's cache directory (``$GPUPROV_CACHE_DIR``, else ``$XDG_CACHE_HOME/gpuprov``, else
``~/.cache/gpuprov``) under the hash of everything it is made of, and later runs read it
(see _cached).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
import json
import logging
import marshal
import os
import re
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpuprov
from gpuprov.errors import ExitCode, GpuprovError

log = logging.getLogger(__name__)

# -I: ignore PYTHON* variables, user site-packages and the current directory, so
# nothing on the node can shadow the shipped modules or the stdlib.
PROBE_COMMAND = "python3 -I -"
MIN_PYTHON = (3, 9)
PAYLOAD_PREFIX = "<gpuprov-payload>/"  # file names of the shipped modules on the node

# Runs on the node. Kept to syntax Python 3.0+ can parse, so that an old python3
# gets the version message rather than a SyntaxError.
_BOOTSTRAP = """\
# gpuprov node payload (built by gpuprov/payload.py): runs {entry} from the
# modules packed below; writes no files of its own on this machine.
import sys
if sys.version_info < {min_python!r}:
    sys.stderr.write("gpuprov probe needs python3 >= {min_text}, this node has %s\\n"
                     % sys.version.split()[0])
    sys.exit(2)
import binascii, marshal, zlib
from importlib.machinery import ModuleSpec
from importlib.util import MAGIC_NUMBER

PREFIX = {prefix!r}


# A meta path finder and loader over the payload's name -> source dict.
class PayloadImporter:
    def __init__(self, payload):
        self.sources = payload["sources"]
        # Bytecode only when it was compiled by a Python with this one's magic number.
        # Taken out of the payload: what is not used for this Python is freed now, and each
        # module's bytecode once it is loaded (get_code).
        code = payload.pop("code")
        self.code = code if payload["magic"] == MAGIC_NUMBER else {{}}
        self.payload_id = payload.get("id")  # the sources' hash (an entry may cache bytecode)
        self.prefix = PREFIX

    def _entry(self, fullname):
        base = fullname.replace(".", "/")
        if base + "/__init__.py" in self.sources:
            return base + "/__init__.py", True
        if base + ".py" in self.sources:
            return base + ".py", False
        return None, False

    def find_spec(self, fullname, path=None, target=None):
        entry, package = self._entry(fullname)
        if entry is None:
            return None
        return ModuleSpec(fullname, self, origin=PREFIX + entry, is_package=package)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        exec(self.get_code(module.__name__), module.__dict__)

    def is_package(self, fullname):
        return self._entry(fullname)[1]

    def get_source(self, fullname):  # tracebacks show the shipped lines
        return self.sources[self._entry(fullname)[0]].decode("utf-8")

    def get_code(self, fullname):
        entry = self._entry(fullname)[0]
        if entry in self.code:
            return marshal.loads(self.code.pop(entry))
        return compile(self.get_source(fullname), PREFIX + entry, "exec", dont_inherit=True)


PAYLOAD = marshal.loads(zlib.decompress(binascii.a2b_base64(PAYLOAD)))
IMPORTER = PayloadImporter(PAYLOAD)
sys.meta_path.insert(0, IMPORTER)
{prelude}from {entry} import main
sys.exit(main(sys.argv[1:]))
"""


class ProbeError(GpuprovError):
    """The probe could not produce a report on a node (it ran, but failed)."""

    def __init__(
        self,
        message: str,
        host: str | None = None,
        stderr: str = "",
        code: ExitCode = ExitCode.CHECK_FAILED,
    ) -> None:
        super().__init__(f"{host}: {message}" if host else message, code)
        self.host = host
        self.stderr = stderr


class ProbeUnreachable(ProbeError):
    """No SSH session to the node: connection refused, timeout, authentication, host key."""

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message, host=host, code=ExitCode.UNREACHABLE)


# The programs a payload can run on a node: the probe (reads only), the MIG stage's applier
# (gpuprov/node/mig_apply.py, which changes the GPUs' MIG layout; the gpu_mig role's), and the
# health agent (gpuprov/node/health/, run with verify's node phase as its checks; the
# gpu_health role installs its script as a file and runs it as a service).
ENTRIES = {"probe": "gpuprov.node.probe.__main__", "mig-apply": "gpuprov.node.mig_apply",
           "health-agent": "gpuprov.verify.node_phase"}
# What an entry runs before its first import: the long-running agent gets bytecode for the
# node's Python from a cache it keeps (gpuprov/node/health/launch.py says why); the one-shot
# probe and MIG applier write nothing on the node.
PRELUDES = {"health-agent": "from gpuprov.node.health.launch import keep_bytecode\n"
                            "keep_bytecode(IMPORTER, sys.argv[1:])\n"}

# What the health agent needs beyond the node folder: verify's node phase (the same checks as
# `gpuprov verify`, gpuprov/verify/node_phase.py) and what those import, and prometheus_client
# (pure Python; its framework adapters, which need twisted, django or aiohttp, are left out).
HEALTH_AGENT_FILES = ("gpuprov/runtime_mode.py", "gpuprov/verify/__init__.py",
                      "gpuprov/verify/findings.py", "gpuprov/verify/facts.py",
                      "gpuprov/verify/node_phase.py", "gpuprov/verify/checks/__init__.py",
                      "gpuprov/verify/checks/_util.py", "gpuprov/verify/checks/host.py",
                      "gpuprov/verify/checks/nvml.py", "gpuprov/verify/checks/driver.py",
                      "gpuprov/verify/checks/gpu.py", "gpuprov/verify/checks/runtime.py")
PROMETHEUS_CLIENT_SKIP = ("twisted", "django", "aiohttp", "bridge")


def payload_files(entry: str = "probe") -> dict[str, Path]:
    """Archive name -> source file: everything under gpuprov/node/ (the folder is what runs on
    a node), the modules of gpuprov/nvidia/ that it imports, the packages' __init__.py files
    and pynvml; for the health agent also HEALTH_AGENT_FILES and prometheus_client."""
    if entry not in ENTRIES:
        raise ValueError(f"no payload entry {entry!r} (one of {', '.join(ENTRIES)})")
    # Found, not imported: the controller never calls NVML, and importing pynvml costs as much
    # CPU as probing two nodes. ImportError where it is missing, as the import would raise.
    spec = importlib.util.find_spec("pynvml")
    if spec is None or not spec.origin:
        raise ImportError("No module named 'pynvml' (install nvidia-ml-py)", name="pynvml")
    package = Path(gpuprov.__file__).parent
    node = sorted((package / "node").rglob("*.py"))
    files = {"gpuprov/__init__.py": package / "__init__.py"}
    files.update({f"gpuprov/{path.relative_to(package).as_posix()}": path for path in node})
    if entry == "health-agent":
        extra = [package.parent / name for name in HEALTH_AGENT_FILES]
        files.update({name: package.parent / name for name in HEALTH_AGENT_FILES})
        node = node + extra
        files.update(_prometheus_client_files())
    facts = nvidia_imports(node)
    if facts:
        files["gpuprov/nvidia/__init__.py"] = package / "nvidia" / "__init__.py"
    files.update({f"gpuprov/nvidia/{name}.py": package / "nvidia" / f"{name}.py"
                  for name in sorted(facts)})
    files["pynvml.py"] = Path(spec.origin)
    return files


def _prometheus_client_files() -> dict[str, Path]:
    spec = importlib.util.find_spec("prometheus_client")
    if spec is None or not spec.origin:
        raise ImportError("No module named 'prometheus_client' (install prometheus_client)",
                          name="prometheus_client")
    root = Path(spec.origin).parent
    return {f"prometheus_client/{path.relative_to(root).as_posix()}": path
            for path in sorted(root.rglob("*.py"))
            if path.relative_to(root).parts[0] not in PROMETHEUS_CLIENT_SKIP}


# How node code imports NVIDIA's facts: `from ...nvidia import hardware` (relative, so that it
# works as the collection's module_utils too). Read with a pattern, not ast: parsing the folder
# costs 20 ms per process, ten times the cached script's read; tests/unit/test_package_layout.py
# checks that the pattern finds what ast finds.
_NVIDIA_IMPORT = re.compile(rb"^[ \t]*from[ \t]+(?:\.+|gpuprov\.)nvidia(?:\.(\w+))?[ \t]+"
                            rb"import[ \t]+([\w, \t]+?)[ \t]*(?:#.*)?$", re.M)


def nvidia_imports(paths: list[Path]) -> set[str]:
    """The gpuprov/nvidia/ modules these files import, and those they import in turn."""
    found: set[str] = set()
    todo = list(paths)
    while todo:
        for match in _NVIDIA_IMPORT.finditer(todo.pop().read_bytes()):
            # `from gpuprov.nvidia.hardware import classify` names the module itself
            # and `import x as y` imports x
            names = ([match.group(1).decode()] if match.group(1) else
                     [part.split()[0] for part in match.group(2).decode().split(",")
                      if part.strip()])
            for name in names:
                if name and name not in found:
                    found.add(name)
                    todo.append(Path(gpuprov.__file__).parent / "nvidia" / f"{name}.py")
    return found


# Version 2: from version 3 on, marshal writes whether each string is interned and marks
# objects for back-references by their reference count, both states of the whole process:
# a one-character string is a process-wide singleton, interned once anything interns it.
# Seen in the test suite: a rebuild late in the run wrote toml_subset.py's "[" and "]" as
# interned, the build early in the run had not. Version 2 writes neither, so the same
# sources give the same bytes; the bytecode is 5 % larger and starts as fast.
MARSHAL_VERSION = 2


def probe_script() -> bytes:
    """The probe's script to feed to PROBE_COMMAND's stdin; built once per process."""
    return node_script("probe")


@functools.lru_cache(maxsize=len(ENTRIES))
def node_script(entry: str) -> bytes:
    """The script that runs ENTRIES[entry] on a node from PROBE_COMMAND's stdin (its arguments
    after the "-"); read from the cache, or built, once per process per entry.

    Reproducible for the same sources and Python (marshal orders the constants of a
    frozenset by hash, so the bytecode part may differ between PYTHONHASHSEEDs).
    """
    sources = {name: path.read_bytes() for name, path in payload_files(entry).items()}
    bootstrap = _BOOTSTRAP.format(min_python=MIN_PYTHON, min_text=".".join(map(str, MIN_PYTHON)),
                                  prefix=PAYLOAD_PREFIX, entry=ENTRIES[entry],
                                  prelude=PRELUDES.get(entry, ""))
    return _cached(entry, _build_key(sources, bootstrap), lambda: _build(sources, bootstrap))


def _build(sources: dict[str, bytes], bootstrap: str) -> bytes:
    # The file name is what tracebacks show; dont_inherit: not this module's __future__
    # flags; optimize=0: asserts stay even when the controller runs python -O.
    code = {name: marshal.dumps(compile(source, PAYLOAD_PREFIX + name, "exec",
                                        dont_inherit=True, optimize=0), MARSHAL_VERSION)
            for name, source in sources.items()}
    # Dicts of str and bytes, readable by every Python 3; the code objects inside stay opaque
    # bytes until their magic number has been checked. "id" names the sources (the health
    # agent's bytecode cache on the node is keyed by it and the node's magic number).
    source_hash = hashlib.sha256()
    for name in sorted(sources):
        for part in (name.encode(), sources[name]):
            source_hash.update(len(part).to_bytes(8, "big"))
            source_hash.update(part)
    packed = marshal.dumps({"sources": sources, "code": code, "id": source_hash.hexdigest(),
                            "magic": importlib.util.MAGIC_NUMBER}, MARSHAL_VERSION)
    # zlib's default level: level 9 saves 1 % of the size for 3x the time.
    encoded = base64.b64encode(zlib.compress(packed)).decode("ascii")
    return f'PAYLOAD = b"{encoded}"\n{bootstrap}'.encode("ascii")


# Built scripts kept per entry; older ones beyond this are removed (two checkouts or versions
# used in turn each keep theirs).
CACHE_KEEP = 8


def cache_dir() -> Path:
    """gpuprov's cache directory: $GPUPROV_CACHE_DIR, else $XDG_CACHE_HOME/gpuprov, else
    ~/.cache/gpuprov, where the XDG base directory specification places a user's caches."""
    given = os.environ.get("GPUPROV_CACHE_DIR")
    if given:
        return Path(given).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser().resolve() / "gpuprov"


def _build_key(sources: dict[str, bytes], bootstrap: str) -> str:
    """Hash of everything the script is made of: the shipped sources, the bootstrap, the
    Python that compiles the bytecode, and this module (the way they are packed)."""
    digest = hashlib.sha256()
    parts = [Path(__file__).read_bytes(), bootstrap.encode(), importlib.util.MAGIC_NUMBER,
             sys.version.encode(), str(MARSHAL_VERSION).encode()]
    for name in sorted(sources):
        parts += [name.encode(), sources[name]]
    for part in parts:  # length-prefixed: no two different inputs hash the same stream
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def _private_dir(path: Path) -> bool:
    """The directory exists, is this user's and no one else can write in it: the scripts in
    it run as the SSH user (often root) on every node."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & 0o022


def _cached(entry: str, key: str, build: Callable[[], bytes]) -> bytes:
    """The script with this key from the cache, else build() written to the cache.

    Each file holds the script's own SHA-256 on its first line: a file cut short (a full
    disk, a crash before the data reached the disk) reads as absent and is built again.
    Files are written whole under another name and renamed, so a concurrent run reads the
    old file or the new one, never half of one. Any failure of the cache only costs the build.
    """
    directory = cache_dir()
    path = directory / f"{entry}-{key}.py"
    if not _private_dir(directory):
        log.debug("payload cache %s is not private to this user: not used", directory)
        return build()
    try:
        head, _, script = path.read_bytes().partition(b"\n")
        if head == b"# sha256 " + hashlib.sha256(script).hexdigest().encode():
            return script
    except OSError:
        pass
    script = build()
    try:
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{entry}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(b"# sha256 " + hashlib.sha256(script).hexdigest().encode() + b"\n")
                out.write(script)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        older = sorted(directory.glob(f"{entry}-*.py"), key=_mtime, reverse=True)[CACHE_KEEP:]
        for stale in older:
            stale.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("payload cache %s not written: %s", directory, exc)
    return script


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another run
        return 0.0


def parse_report(stdout: str, host: str | None = None, stderr: str = "") -> dict:
    """The report from the probe's stdout; tolerates lines a login script printed first."""
    text = stdout.strip()
    candidates = [text] + [line for line in reversed(text.splitlines()) if line.startswith("{")]
    for candidate in candidates:
        try:
            report = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get("schema_version") == 1:
            return report
        if isinstance(report, dict):
            raise ProbeError(
                f"probe report has schema_version {report.get('schema_version')!r}, expected 1",
                host,
                stderr,
            )
    raise ProbeError("probe printed no JSON report" + _stderr_hint(stderr), host, stderr)


def _stderr_hint(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f": {lines[-1].strip()}" if lines else ""


def check_exit(rc: int, stdout: str, stderr: str, host: str | None = None) -> dict:
    """Map the remote command's outcome to a report or a ProbeError."""
    if rc == 127:
        raise ProbeError("python3 not found on the node: install python3 (>= 3.9)", host, stderr)
    if rc != 0:
        raise ProbeError(f"probe exited {rc}" + _stderr_hint(stderr), host, stderr)
    return parse_report(stdout, host, stderr)


def _read_all(recv: Any, deadline: float) -> bytes:
    chunks = []
    while True:
        chunk = recv(65536, deadline)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def run_probe(connection: Any, timeout: float = 60.0) -> dict:
    """Run the probe on a fabric Connection's host; one exec request, script on stdin.

    Talks to the paramiko channel directly: invoke's in_stream feeds a non-terminal
    stream to the remote side one byte per 10 ms (bytes_to_read() is 1 for anything
    that is not a TTY, and input_sleep is 0.01 s), which makes a 100 kB script take
    minutes; the channel takes it in one sendall().
    """
    import paramiko

    host = getattr(connection, "host", None)
    script = probe_script()
    deadline = time.monotonic() + timeout
    try:
        connection.open()
        channel = connection.create_session()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise ProbeUnreachable(f"cannot open an SSH session: {exc}", host) from exc

    def recv(method: Any) -> Any:
        def read(size: int, until: float) -> bytes:
            channel.settimeout(max(until - time.monotonic(), 0.001))
            return method(size)

        return read

    try:
        channel.settimeout(timeout)
        channel.exec_command(PROBE_COMMAND)
        channel.sendall(script)
        channel.shutdown_write()
        stdout = _read_all(recv(channel.recv), deadline)
        stderr = _read_all(recv(channel.recv_stderr), deadline)
        rc = channel.recv_exit_status()
    except TimeoutError as exc:
        raise ProbeError(f"probe timed out after {timeout:g} s", host) from exc
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise ProbeUnreachable(f"SSH session failed: {exc}", host) from exc
    finally:
        channel.close()
    return check_exit(
        rc, stdout.decode("utf-8", "replace"), stderr.decode("utf-8", "replace"), host
    )


def run_probe_local(root: str = "/") -> dict:
    """The probe, in this process (for `gpuprov probe` and verify's local connection)."""
    from gpuprov.node.probe.report import collect

    return collect(root=root)
