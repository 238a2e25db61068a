"""The probe payload: self-contained, runs on a bare python3, and over a real SSH channel.

The SSH tests run an in-process paramiko server on 127.0.0.1 whose exec requests run
the command locally (with a minimal environment, as sshd gives one), so run_probe's
fabric/paramiko path is the production one.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import marshal
import os
import shutil
import socket
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import fabric
import paramiko
import pytest

from gpuprov import payload
from gpuprov.errors import ExitCode

ROOTS = Path(__file__).parent.parent / "fixtures" / "probe" / "roots"
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs a system python3")


def run_payload(args=(), env=None, cwd=None, script=None):
    return subprocess.run(
        [SYSTEM_PYTHON, "-I", "-", *args],
        input=script or payload.probe_script(),
        capture_output=True,
        env=env or {"PATH": "/usr/bin:/bin"},
        cwd=cwd,
        check=False,
        timeout=60,
    )


def test_bare_python_cannot_import_pynvml():
    # The precondition of the next test: only the payload can provide pynvml.
    proc = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-c", "import pynvml"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        check=False,
    )
    assert proc.returncode != 0


def test_payload_runs_on_bare_python_with_what_it_ships(tmp_path):
    proc = run_payload(
        ["--root", str(ROOTS / "gpu-node")],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    report = payload.check_exit(0, proc.stdout.decode(), proc.stderr.decode())
    # pynvml came from the payload: NVML itself is what is missing on this machine.
    assert report["nvml"]["error"]["name"] == "NVML_ERROR_LIBRARY_NOT_FOUND"
    # gpuprov.nvidia.hardware came along too.
    assert [d["classification"]["name"] for d in report["pci"]] == [
        "Tesla P100-PCIE-16GB",
        "NVIDIA H100 80GB HBM3",
    ]
    assert report["probe"]["errors"] == {}
    assert list(tmp_path.iterdir()) == []  # nothing written on the "node"


def test_payload_report_equals_the_in_process_probe():
    proc = run_payload(["--root", str(ROOTS / "gpu-node")])
    shipped = payload.parse_report(proc.stdout.decode())
    local = payload.run_probe_local(root=str(ROOTS / "gpu-node"))
    for key in ("pci", "kernel_module", "kernel_log", "container_runtime", "summary"):
        assert shipped[key] == local[key], key


@pytest.mark.parametrize(("root", "gpus"), [("gpu-node", 2), ("cpu-only", 0)])
def test_arguments_after_the_dash_reach_the_probe(root, gpus):
    # How roles run it: `python3 -I - --root DIR`, the script on stdin.
    proc = run_payload(["--root", str(ROOTS / root)])
    report = payload.check_exit(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    assert report["probe"]["root"] == str(ROOTS / root)
    assert report["summary"]["pci_gpu_count"] == gpus


def test_a_bad_argument_is_the_probe_usage_error():
    proc = run_payload(["--no-such-option"])
    with pytest.raises(payload.ProbeError, match="unrecognized arguments: --no-such-option$"):
        payload.check_exit(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_payload_ships_the_probe_hardware_table_and_pynvml():
    assert set(payload.payload_files()) >= {
        "gpuprov/__init__.py",
        "gpuprov/nvidia/hardware.py",
        "gpuprov/node/probe/__init__.py",
        "gpuprov/node/probe/__main__.py",
        "gpuprov/node/probe/nvml.py",
        "pynvml.py",
    }
    assert not any(name.startswith("gpuprov/lab") for name in payload.payload_files())


def test_script_is_built_once_and_reproducible(tmp_path, monkeypatch):
    # Each build with an empty cache directory of its own: two builds, not one read back.
    monkeypatch.setenv("GPUPROV_CACHE_DIR", str(tmp_path / "first"))
    payload.node_script.cache_clear()
    assert payload.probe_script() is payload.probe_script()
    first = payload.probe_script()
    monkeypatch.setenv("GPUPROV_CACHE_DIR", str(tmp_path / "second"))
    payload.node_script.cache_clear()
    assert payload.probe_script() == first
    payload.node_script.cache_clear()


def test_script_does_not_depend_on_which_strings_the_process_interned(tmp_path):
    # A fresh interpreter, so that the first build sees one-character strings (the probe's
    # "[" and "]", ...) not yet interned; the second build comes after they all are, with
    # another empty cache directory (a build, not the first one read back).
    code = ("import os, string, sys; from gpuprov import payload; first = payload.probe_script(); "
            "[sys.intern(c) for c in string.printable]; payload.node_script.cache_clear(); "
            f"os.environ['GPUPROV_CACHE_DIR'] = {str(tmp_path / 'second')!r}; "
            "sys.exit(0 if payload.probe_script() == first else 1)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "GPUPROV_CACHE_DIR": str(tmp_path / "first")})
    assert proc.returncode == 0, proc.stderr or "the second build differs from the first"


def _unpack(script: bytes) -> dict:
    """The packed payload of a script: {"sources": ..., "code": ..., "magic": ...}."""
    head = script.split(b"\n", 1)[0]
    return marshal.loads(zlib.decompress(base64.b64decode(head[len(b'PAYLOAD = b"'):-1])))


def _repack(script: bytes, edit) -> bytes:
    """The script with its packed payload changed by edit(payload_dict)."""
    rest = script.split(b"\n", 1)[1]
    packed = _unpack(script)
    edit(packed)
    encoded = base64.b64encode(zlib.compress(marshal.dumps(packed, payload.MARSHAL_VERSION)))
    return b'PAYLOAD = b"' + encoded + b'"\n' + rest


def _break_main_source(packed: dict) -> None:
    packed["sources"]["gpuprov/node/probe/__main__.py"] = b"raise SystemExit('ran the source')\n"


def _system_python_magic() -> bytes:
    return subprocess.run([SYSTEM_PYTHON, "-I", "-c", "import importlib.util, sys; "
                           "sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER)"],
                          capture_output=True, check=True).stdout


def test_a_node_with_the_same_python_runs_the_shipped_bytecode():
    if _system_python_magic() != importlib.util.MAGIC_NUMBER:
        pytest.skip("the system python3 is another minor version than the test's Python")
    # Only the source is broken; the bytecode compiled here from the real one runs.
    proc = run_payload(["--root", str(ROOTS / "gpu-node")],
                       script=_repack(payload.probe_script(), _break_main_source))
    assert proc.returncode == 0, proc.stderr.decode()
    assert payload.parse_report(proc.stdout.decode())["summary"]["pci_gpu_count"] == 2


def test_a_node_with_another_python_compiles_the_sources():
    def other_python(packed: dict) -> None:
        packed["magic"] = b"\x00\x00\r\n"

    proc = run_payload(["--root", str(ROOTS / "gpu-node")],
                       script=_repack(payload.probe_script(), other_python))
    assert proc.returncode == 0, proc.stderr.decode()
    assert payload.parse_report(proc.stdout.decode())["summary"]["pci_gpu_count"] == 2

    def other_python_broken_source(packed: dict) -> None:
        other_python(packed)
        _break_main_source(packed)

    proc = run_payload(script=_repack(payload.probe_script(), other_python_broken_source))
    assert proc.returncode == 1 and b"ran the source" in proc.stderr


def test_too_old_python_gets_one_clear_line(monkeypatch):
    monkeypatch.setattr(payload, "MIN_PYTHON", (99, 0))
    payload.node_script.cache_clear()
    try:
        proc = run_payload()
    finally:
        payload.node_script.cache_clear()
    assert proc.returncode == 2
    with pytest.raises(payload.ProbeError, match=r"needs python3 >= 99\.0, this node has 3\."):
        payload.check_exit(proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_parse_report_skips_login_noise():
    report = payload.parse_report('Welcome to node-1\n{"schema_version": 1, "pci": []}\n')
    assert report == {"schema_version": 1, "pci": []}


@pytest.mark.parametrize(
    ("rc", "stdout", "stderr", "message"),
    [
        (127, "", "bash: python3: command not found", "python3 not found on the node"),
        (1, "", "Traceback...\nMemoryError", "probe exited 1: MemoryError"),
        (0, "garbage", "", "probe printed no JSON report"),
        (0, '{"schema_version": 2}', "", "schema_version 2"),
    ],
)
def test_failures_map_to_probe_error(rc, stdout, stderr, message):
    with pytest.raises(payload.ProbeError, match=message) as info:
        payload.check_exit(rc, stdout, stderr, host="node-1")
    assert info.value.message.startswith("node-1: ")
    assert info.value.code == ExitCode.CHECK_FAILED


# -- the cache of built scripts ----------------------------------------------------------------
@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache directory of this test's own, and no script built in this process yet."""
    directory = tmp_path / "cache"
    monkeypatch.setenv("GPUPROV_CACHE_DIR", str(directory))
    payload.node_script.cache_clear()
    yield directory
    payload.node_script.cache_clear()


def _count_builds(monkeypatch) -> list:
    """The builds node_script makes from now on (one list item each)."""
    builds: list = []
    build = payload._build

    def counted(*args):
        builds.append(args)
        return build(*args)

    monkeypatch.setattr(payload, "_build", counted)
    return builds


def _as_new_process() -> None:
    payload.node_script.cache_clear()


def test_a_later_run_reads_the_script_from_the_cache(cache, monkeypatch):
    builds = _count_builds(monkeypatch)
    first = payload.probe_script()
    (stored,) = cache.glob("probe-*.py")
    # Others can neither read nor change what runs on every node.
    assert cache.stat().st_mode & 0o077 == 0 and stored.stat().st_mode & 0o077 == 0
    _as_new_process()
    assert payload.probe_script() == first
    assert len(builds) == 1


def test_a_changed_source_is_built_again(cache, monkeypatch, tmp_path):
    files = {}
    for name, path in payload.payload_files().items():
        files[name] = tmp_path / "src" / name
        files[name].parent.mkdir(parents=True, exist_ok=True)
        files[name].write_bytes(path.read_bytes())
    monkeypatch.setattr(payload, "payload_files", lambda entry="probe": dict(files))
    builds = _count_builds(monkeypatch)
    first = payload.probe_script()
    main = files["gpuprov/node/probe/__main__.py"]
    main.write_bytes(main.read_bytes() + b"# changed\n")
    _as_new_process()
    second = payload.probe_script()
    assert len(builds) == 2
    assert _unpack(second)["sources"]["gpuprov/node/probe/__main__.py"].endswith(b"# changed\n")
    assert not _unpack(first)["sources"]["gpuprov/node/probe/__main__.py"].endswith(b"# changed\n")


def test_a_cache_file_cut_short_is_built_again_and_replaced(cache, monkeypatch):
    first = payload.probe_script()
    (stored,) = cache.glob("probe-*.py")
    stored.write_bytes(stored.read_bytes()[:-1000])
    builds = _count_builds(monkeypatch)
    _as_new_process()
    assert payload.probe_script() == first
    _as_new_process()
    assert payload.probe_script() == first
    assert len(builds) == 1


def test_a_cache_directory_others_can_write_to_is_not_used(cache):
    real = payload.probe_script()
    (stored,) = cache.glob("probe-*.py")
    planted = b"raise SystemExit('planted')\n"
    stored.write_bytes(b"# sha256 " + hashlib.sha256(planted).hexdigest().encode() + b"\n"
                       + planted)
    _as_new_process()
    assert payload.probe_script() == planted  # the plant is well made: a private cache reads it
    cache.chmod(0o777)
    _as_new_process()
    assert payload.probe_script() == real
    assert stored.read_bytes().endswith(planted)  # nor written


def test_without_a_usable_cache_directory_the_script_is_built(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("GPUPROV_CACHE_DIR", str(tmp_path / "file" / "cache"))
    _as_new_process()
    try:
        proc = run_payload(["--root", str(ROOTS / "gpu-node")])
    finally:
        _as_new_process()
    assert payload.check_exit(proc.returncode, proc.stdout.decode(),
                              proc.stderr.decode())["summary"]["pci_gpu_count"] == 2


def test_the_cache_keeps_the_newest_scripts_only(cache):
    cache.mkdir(mode=0o700)
    older = [cache / f"probe-{i:064x}.py" for i in range(payload.CACHE_KEEP)]  # oldest first
    for i, path in enumerate(older):
        path.write_bytes(b"")
        os.utime(path, (1000 + i, 1000 + i))
    other = cache / "mig-apply-0.py"
    other.write_bytes(b"")
    os.utime(other, (1, 1))
    payload.probe_script()
    kept = {p.name for p in cache.glob("probe-*.py")}
    assert len(kept) == payload.CACHE_KEEP
    assert older[0].name not in kept and older[1].name in kept  # the oldest went
    assert other.exists()  # another entry's scripts are not this one's to count


def test_building_the_script_does_not_import_pynvml(tmp_path):
    # The controller only ships pynvml; importing it costs as much CPU as probing two nodes.
    code = ("import sys; from gpuprov import payload; payload.probe_script(); "
            "sys.exit('pynvml' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "GPUPROV_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr or "pynvml was imported"


# -- over SSH ---------------------------------------------------------------------------------
class _Server(paramiko.ServerInterface):
    def __init__(self, env: dict, hang: bool) -> None:
        self.env = env
        self.hang = hang
        self.commands: list[str] = []

    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        self.commands.append(command.decode())
        if not self.hang:
            threading.Thread(target=self._execute, args=(channel, command), daemon=True).start()
        return True

    def _execute(self, channel, command):
        proc = subprocess.Popen(
            command,
            shell=True,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        data = b""
        while chunk := channel.recv(65536):
            data += chunk
        out, err = proc.communicate(data)
        channel.sendall(out)
        channel.sendall_stderr(err)
        channel.send_exit_status(proc.returncode)
        channel.close()


@pytest.fixture(scope="module")
def host_key():
    return paramiko.RSAKey.generate(2048)


@pytest.fixture
def ssh_server(host_key):
    """Start a one-connection SSH server; returns (port, configure(env=, hang=) -> _Server)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    state = {"server": _Server({"PATH": "/usr/bin:/bin"}, hang=False)}
    transports = []

    def serve():
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        transport = paramiko.Transport(sock)
        transports.append(transport)
        transport.add_server_key(host_key)
        transport.start_server(server=state["server"])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def configure(**kwargs):
        state["server"] = _Server(**{"env": {"PATH": "/usr/bin:/bin"}, "hang": False, **kwargs})
        return state["server"]

    yield listener.getsockname()[1], configure
    listener.close()
    for transport in transports:
        transport.close()


def _connection(port):
    return fabric.Connection(
        "127.0.0.1",
        port=port,
        user="probe",
        connect_kwargs={"password": "x", "look_for_keys": False, "allow_agent": False},
    )


def test_run_probe_over_ssh(ssh_server):
    port, configure = ssh_server
    server = configure()
    with _connection(port) as conn:
        report = payload.run_probe(conn, timeout=60)
    assert server.commands == [payload.PROBE_COMMAND]  # one exec request
    assert report["schema_version"] == 1
    assert report["nvml"]["error"]["name"] == "NVML_ERROR_LIBRARY_NOT_FOUND"
    assert report["host"]["hostname"] == socket.gethostname()


def test_run_probe_without_python3_on_the_node(ssh_server, tmp_path):
    port, configure = ssh_server
    configure(env={"PATH": str(tmp_path)})
    with _connection(port) as conn, pytest.raises(payload.ProbeError, match="python3 not found"):
        payload.run_probe(conn, timeout=60)


def test_run_probe_times_out(ssh_server):
    port, configure = ssh_server
    configure(hang=True)
    with _connection(port) as conn, pytest.raises(payload.ProbeError, match="timed out"):
        payload.run_probe(conn, timeout=0.5)


def test_unreachable_node():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()  # nothing listens there now
    conn = fabric.Connection("127.0.0.1", port=port, connect_timeout=5)
    with pytest.raises(payload.ProbeUnreachable) as info:
        payload.run_probe(conn, timeout=5)
    assert info.value.code == ExitCode.UNREACHABLE
    assert info.value.message.startswith("127.0.0.1: cannot open an SSH session")
