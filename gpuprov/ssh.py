"""SSH connections to nodes (fabric), with host keys checked by default.

fabric's Connection trusts any unknown host key (paramiko's AutoAddPolicy); gpuprov
refuses them instead, unless the caller turns checking off explicitly.

verify opens a connection to every node of the inventory, hundreds in one run, each in its
own thread; what every connection would read and parse again is done once per process and
shared: fabric's configuration (its files and ssh_config), the known_hosts files and the
private key. Their CPU was a fifth of the controller's per node.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

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


# The user's own known_hosts, which paramiko's load_system_host_keys() reads, as ssh does.
SYSTEM_KNOWN_HOSTS = os.path.join("~", ".ssh", "known_hosts")

# Ciphers tried first: AES-GCM (an AEAD; OpenSSH offers it by default) has its tag checked
# inside cryptography, where paramiko checks the HMAC of an aes-ctr packet byte by byte in
# Python. paramiko lists them last; the others stay, after them, for servers without GCM.
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")

_lock = threading.Lock()
_shared: dict[tuple, tuple[Any, Any]] = {}  # what -> (the version made from, the value made)


def _once(what: tuple, version: Any, make: Any) -> Any:
    """make(), once per process for each version of `what` (a file: its _file_identity),
    whichever thread asks first (the others wait); a new version replaces the old one."""
    with _lock:
        made = _shared.get(what)
        if made is None or made[0] != version:
            made = _shared[what] = (version, make())
        return made[1]


def _file_identity(path: str) -> tuple | None:
    """What changes when the file is replaced or edited; None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _known_hosts(path: str) -> paramiko.HostKeys:
    """A known_hosts file parsed once per process (every line a key object: a site's file of
    a few hundred lines costs more than the SSH handshake); empty where it does not exist, as
    load_system_host_keys() leaves it. Shared read-only: the connections that use it refuse
    unknown keys (RejectPolicy), so paramiko adds nothing to it."""
    identity = _file_identity(path)
    if identity is None:
        return _once(("known_hosts", path), None, paramiko.HostKeys)
    return _once(("known_hosts", path), identity, lambda: paramiko.HostKeys(path))


def _private_key(path: str) -> paramiko.PKey | None:
    """The private key in `path`, read once per process; None where it cannot be read without
    help (missing, encrypted, a type paramiko does not know): the caller then passes the file
    name, and paramiko's own search goes on as without this."""
    identity = _file_identity(path)
    if identity is None:
        return None

    def load() -> paramiko.PKey | None:
        try:
            return paramiko.PKey.from_path(path)
        except Exception:  # any reason: paramiko's own attempt reports it, as before
            return None

    return _once(("key", path), identity, load)


def _config() -> fabric.Config:
    """fabric's configuration: its files and ssh_config (Hostname, Port, User, IdentityFile,
    ProxyJump...) read once per process. Connections only read it: shared."""
    return _once(("fabric-config",), None, fabric.Config)


class _Transport(paramiko.Transport):
    # paramiko's transport thread wakes every _active_check_timeout (0.1 s) while it waits for
    # the node, to see whether close() was called and its own timeouts passed: ten wakeups a
    # second for every node whose probe runs (seconds, on a loaded node), each taking the GIL
    # from the threads that have work: 1.4 of 17 ms of controller CPU per node, 64 nodes at
    # once. Once a second is enough for both: close() does not wait for the thread, which ends
    # within that second; data wakes it at once, as before.
    _active_check_timeout = 1.0


def _transport(sock: Any, disabled_algorithms: dict | None = None) -> paramiko.Transport:
    """paramiko's Transport with AEAD_CIPHERS first and the idle check above
    (SSHClient.connect's transport_factory)."""
    transport = _Transport(sock, disabled_algorithms=disabled_algorithms)
    options = transport.get_security_options()
    first = [c for c in AEAD_CIPHERS if c in options.ciphers]
    options.ciphers = (*first, *(c for c in options.ciphers if c not in first))
    return transport


def connect(target: SshTarget, timeout: float = 10.0) -> fabric.Connection:
    connect_kwargs: dict = {"banner_timeout": timeout,
                            "auth_timeout": timeout,
                            "transport_factory": _transport}
    if target.key_file:
        key = _private_key(target.key_file)
        if key is not None:
            connect_kwargs["pkey"] = key
        else:
            connect_kwargs["key_filename"] = target.key_file
    conn = fabric.Connection(
        host=target.host, port=target.port, user=target.user, connect_kwargs=connect_kwargs,
        connect_timeout=timeout, config=_config(),
    )
    if target.check_host_keys:
        # The files parsed once, in the places load_system_host_keys() and load_host_keys()
        # put them, so that paramiko's own check (the known key type asked for, a changed key
        # refused) runs unchanged.
        conn.client._system_host_keys = _known_hosts(os.path.expanduser(SYSTEM_KNOWN_HOSTS))
        if target.known_hosts:
            conn.client._host_keys = _known_hosts(target.known_hosts)
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    else:
        # AutoAddPolicy (fabric's) adds every new key to the client's own HostKeys: not shared.
        conn.client.load_system_host_keys()
        if target.known_hosts and os.path.exists(target.known_hosts):
            conn.client.load_host_keys(target.known_hosts)
    return conn
