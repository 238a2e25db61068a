"""Ship the probe to a node that has only python3, and run it there in one SSH round trip.

Like Ansible's AnsiballZ: the probe's modules (gpuprov/__init__.py, gpuprov/hardware.py,
gpuprov/probe/*.py) and pynvml's single module (from the installed nvidia-ml-py) go into
a zip, embedded (base85) in a small Python script that is sent on stdin to
``python3 -I -``. The script imports the modules straight from the in-memory zip, so
nothing is written on the node, and prints the probe's JSON report on stdout.

The same script works over plain OpenSSH (``ssh node python3 -I - < script``), which
is what benchmarks compare against.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import gpuprov
from gpuprov.errors import ExitCode, GpuprovError

# -I: ignore PYTHON* variables, user site-packages and the current directory, so
# nothing on the node can shadow the shipped modules or the stdlib.
PROBE_COMMAND = "python3 -I -"
MIN_PYTHON = (3, 9)

# Runs on the node. Kept to syntax Python 3.0+ can parse, so that an old python3
# gets the version message rather than a SyntaxError.
_BOOTSTRAP = """\
# gpuprov probe payload (built by gpuprov/payload.py): runs the probe from an
# in-memory zip and prints its JSON report; writes nothing on this machine.
import sys
if sys.version_info < {min_python!r}:
    sys.stderr.write("gpuprov probe needs python3 >= {min_text}, this node has %s\\n"
                     % sys.version.split()[0])
    sys.exit(2)
import base64, importlib.abc, importlib.util, io, zipfile


class PayloadImporter(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    def __init__(self, data):
        self.zip = zipfile.ZipFile(io.BytesIO(data))
        self.names = set(self.zip.namelist())

    def _entry(self, fullname):
        base = fullname.replace(".", "/")
        if base + "/__init__.py" in self.names:
            return base + "/__init__.py", True
        if base + ".py" in self.names:
            return base + ".py", False
        return None, False

    def find_spec(self, fullname, path=None, target=None):
        entry, package = self._entry(fullname)
        if entry is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=package)

    def is_package(self, fullname):
        return self._entry(fullname)[1]

    def get_source(self, fullname):
        return self.zip.read(self._entry(fullname)[0]).decode("utf-8")

    def get_code(self, fullname):
        entry = self._entry(fullname)[0]
        return compile(self.get_source(fullname), "<gpuprov-payload>/" + entry, "exec")


sys.meta_path.insert(0, PayloadImporter(base64.b85decode(PAYLOAD)))
from gpuprov.probe.__main__ import main
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


def payload_files() -> dict[str, Path]:
    """Archive name -> source file: everything the probe imports besides the stdlib."""
    import pynvml

    package = Path(gpuprov.__file__).parent
    files = {
        "gpuprov/__init__.py": package / "__init__.py",
        "gpuprov/hardware.py": package / "hardware.py",
        "pynvml.py": Path(pynvml.__file__),
    }
    for path in sorted((package / "probe").glob("*.py")):
        files[f"gpuprov/probe/{path.name}"] = path
    return files


@functools.lru_cache(maxsize=1)
def probe_script() -> bytes:
    """The script to feed to PROBE_COMMAND's stdin; built once per process, reproducible."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, path in payload_files().items():
            # A fixed timestamp keeps the bytes identical between builds.
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes())
    encoded = base64.b85encode(buffer.getvalue()).decode("ascii")
    bootstrap = _BOOTSTRAP.format(min_python=MIN_PYTHON, min_text=".".join(map(str, MIN_PYTHON)))
    return f'PAYLOAD = b"{encoded}"\n{bootstrap}'.encode("ascii")


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
    from gpuprov.probe import collect

    return collect(root=root)
