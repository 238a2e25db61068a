"""Read-only access to a node's files below a root directory.

Every path the probe reads goes through a Root so that tests can point the probe at
a recorded tree (tests/fixtures/probe/...) instead of the machine's own "/".
"""

from __future__ import annotations

import glob
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

# A fixed search path instead of $PATH: an SSH command gets a minimal environment, and
# the binaries we look for are installed by packages into these directories.
BIN_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


@dataclass(frozen=True)
class Root:
    base: str = "/"

    def path(self, node_path: str) -> Path:
        return Path(self.base) / node_path.lstrip("/")

    def node_path(self, path: Path | str) -> str:
        """The path as the node sees it (fixture prefix removed)."""
        rel = os.path.relpath(str(path), self.base)
        return "/" + ("" if rel == "." else rel)

    def read(self, node_path: str) -> str | None:
        try:
            return self.path(node_path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def read_line(self, node_path: str) -> str | None:
        """First line, stripped; None when missing or empty."""
        text = self.read(node_path)
        if not text:
            return None
        line = text.splitlines()[0].strip() if text.strip() else ""
        return line or None

    def exists(self, node_path: str) -> bool:
        return self.path(node_path).exists()

    def glob(self, pattern: str) -> list[str]:
        """Node paths matching a glob pattern, sorted."""
        return sorted(self.node_path(p) for p in glob.glob(str(self.path(pattern))))

    def which(self, name: str) -> str | None:
        for directory in BIN_DIRS:
            candidate = self.path(f"{directory}/{name}")
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return f"{directory}/{name}"
        return None

    def file_facts(self, node_path: str) -> dict | None:
        """A regular file's mode ("0644"), owner, group and sha1, as the roles compare the
        files they write with what they would write; None when it is not a regular file."""
        path = self.path(node_path)
        try:
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                return None
            checksum = hashlib.sha1(path.read_bytes()).hexdigest()
        except OSError:
            return None
        return {"path": node_path, "checksum": checksum,
                "mode": f"{stat.S_IMODE(info.st_mode):04o}", "uid": info.st_uid,
                "gid": info.st_gid}
