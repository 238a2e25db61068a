"""Python modules generated from a `.proto` file with grpcio-tools, once per version of the file.

Test infrastructure. The emulator speaks two protobuf formats it does not own: the CRI (cri.py,
`api.proto` from Debian's golang-k8s-cri-api-dev) and the OpenAPI v2 document client-go asks
for (openapi.py, gnostic's `OpenAPIv2.proto` from Debian's golang-github-google-gnostic-models-dev).
scripts/fetch-containerd.sh fetches both files into the machine's cache (gpuprov/lab/cache.py);
the generated code goes to <cache>/proto-stubs/<name>-<hash of the proto>/, never into git.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType

from gpuprov.errors import GpuprovError
from gpuprov.lab.cache import CACHE

STUB_CACHE = CACHE / "proto-stubs"

_lock = threading.Lock()
_loaded: dict[Path, tuple[ModuleType, ...]] = {}


def load(proto: Path, *modules: str, grpc: bool = False) -> tuple[ModuleType, ...]:
    """The generated modules (e.g. "api_pb2", "api_pb2_grpc") of `proto`, generated on first
    use; protobuf's well-known types (google/protobuf/any.proto) come from grpcio-tools."""
    with _lock:
        if proto not in _loaded:
            _loaded[proto] = _generate(proto, modules, grpc)
        return _loaded[proto]


def _generate(proto: Path, modules: tuple[str, ...], grpc: bool) -> tuple[ModuleType, ...]:
    if not proto.is_file():
        raise GpuprovError(f"{proto.name} is missing ({proto}): run `make containerd-bins`")
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    digest = hashlib.sha256(proto.read_bytes()).hexdigest()[:12]
    out = STUB_CACHE / f"{proto.stem}-{digest}"
    if not all((out / f"{m}.py").is_file() for m in modules):
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                f"-I{well_known}", f"--python_out={tmp}", str(proto)]
        if grpc:
            argv.insert(-1, f"--grpc_python_out={tmp}")
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise GpuprovError(f"generating stubs from {proto.name} failed: "
                               f"{proc.stderr.strip()[-300:]}")
        if out.exists():  # another process was quicker
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(out)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return tuple(importlib.import_module(m) for m in modules)
