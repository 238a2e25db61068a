"""SSH connections to nodes (fabric), with host keys checked by default.

fabric's Connection trusts any unknown host key (paramiko's AutoAddPolicy); gpuprov
refuses them instead, unless the caller turns checking off explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import fabric
import paramiko


@dataclass(frozen=True)
class SshTarget:
    name: str  # the inventory name, used in reports
    host: str
    port: int = 22
    user: str = "root"
    key_file: str | None = None
    known_hosts: str | None = None  # extra known_hosts file, e.g. the lab's
    check_host_keys: bool = True


def connect(target: SshTarget, timeout: float = 10.0) -> fabric.Connection:
    connect_kwargs: dict = {"banner_timeout": timeout,
                            "auth_timeout": timeout}
    if target.key_file:
        connect_kwargs["key_filename"] = target.key_file
    conn = fabric.Connection(
        host=target.host, port=target.port, user=target.user, connect_kwargs=connect_kwargs,
        connect_timeout=timeout,
    )
    conn.client.load_system_host_keys()
    if target.known_hosts and Path(target.known_hosts).exists():
        conn.client.load_host_keys(target.known_hosts)
    if target.check_host_keys:
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    return conn
