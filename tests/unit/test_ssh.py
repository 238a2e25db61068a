"""gpuprov.ssh against an in-process paramiko server on 127.0.0.1: host keys checked against
known_hosts (the user's and the inventory's), public key authentication, the cipher chosen,
and what is read once per process instead of once per connection."""

from __future__ import annotations

import contextlib
import socket
import threading

import fabric
import paramiko
import pytest

from gpuprov import ssh

AEAD = "aes128-gcm@openssh.com"


class _Server(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey) -> None:
        self.client_key = client_key

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL if key == self.client_key else paramiko.AUTH_FAILED


@pytest.fixture(scope="module")
def keys():
    """(host key, another host key, client key): ECDSA, which paramiko generates at once; the
    other host key is longer, so that a known_hosts file changed from one to the other changes
    size (a file's mtime may not change within a few milliseconds)."""
    return (paramiko.ECDSAKey.generate(), paramiko.ECDSAKey.generate(bits=384),
            paramiko.ECDSAKey.generate())


@pytest.fixture(autouse=True)
def nothing_shared_yet(monkeypatch):
    """Each test starts as a new process would: nothing read yet."""
    monkeypatch.setattr(ssh, "_shared", {})


@pytest.fixture
def server(keys):
    """An SSH server on 127.0.0.1 serving every connection with the first host key; returns
    (port, options): options["disabled_algorithms"] applies to the connections after."""
    host_key, _, client_key = keys
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    options: dict = {"disabled_algorithms": None}
    transports = []

    def serve():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock, disabled_algorithms=options["disabled_algorithms"])
            transports.append(transport)
            transport.add_server_key(host_key)
            # A client that refuses the host key ends the negotiation: the next one comes.
            with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
                transport.start_server(server=_Server(client_key))

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], options
    listener.close()
    for transport in transports:
        transport.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME of the test's own: the user's known_hosts is tmp_path/.ssh/known_hosts."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    return tmp_path


@pytest.fixture
def client_key_file(keys, tmp_path):
    path = tmp_path / "id_ecdsa"
    keys[2].write_private_key_file(str(path))
    return str(path)


def _known_hosts(path, port, key) -> str:
    hosts = paramiko.HostKeys()
    hosts.add(f"[127.0.0.1]:{port}", key.get_name(), key)
    hosts.save(str(path))
    return str(path)


def _target(port, key_file, known_hosts=None, check=True) -> ssh.SshTarget:
    return ssh.SshTarget("node", "127.0.0.1", port=port, user="root", key_file=key_file,
                         known_hosts=known_hosts, check_host_keys=check)


def _open(target) -> fabric.Connection:
    conn = ssh.connect(target, timeout=5)
    conn.open()
    return conn


def test_the_inventory_known_hosts_admits_the_right_key_only(server, keys, home, tmp_path,
                                                             client_key_file):
    port, _ = server
    right = _known_hosts(tmp_path / "right", port, keys[0])
    wrong = _known_hosts(tmp_path / "wrong", port, keys[1])
    with _open(_target(port, client_key_file, right)) as conn:
        assert conn.is_connected
    with pytest.raises(paramiko.BadHostKeyException):
        _open(_target(port, client_key_file, wrong))
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _open(_target(port, client_key_file, str(tmp_path / "none")))


def test_the_users_known_hosts_counts_and_is_read_again_when_it_changes(server, keys, home,
                                                                        client_key_file):
    port, _ = server
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _open(_target(port, client_key_file))
    _known_hosts(home / ".ssh" / "known_hosts", port, keys[1])
    with pytest.raises(paramiko.BadHostKeyException):
        _open(_target(port, client_key_file))
    _known_hosts(home / ".ssh" / "known_hosts", port, keys[0])
    with _open(_target(port, client_key_file)) as conn:
        assert conn.is_connected
    # Each version replaced the one before: a long-lived process keeps one per file.
    assert [what for what in ssh._shared if what[0] == "known_hosts"] == [
        ("known_hosts", str(home / ".ssh" / "known_hosts"))]


def test_without_host_key_checking_an_unknown_key_is_accepted_but_a_changed_one_is_not(
        server, keys, home, tmp_path, client_key_file):
    # As fabric does it (AutoAddPolicy), and as before: only the inventory can turn this on.
    port, _ = server
    with _open(_target(port, client_key_file, check=False)) as conn:
        assert conn.is_connected
    wrong = _known_hosts(tmp_path / "wrong", port, keys[1])
    with pytest.raises(paramiko.BadHostKeyException):
        _open(_target(port, client_key_file, wrong, check=False))
    # What the first connection added stays its own: a checked connection still refuses.
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        _open(_target(port, client_key_file))


def test_files_are_read_once_for_all_connections(server, keys, home, tmp_path, client_key_file,
                                                 monkeypatch):
    port, _ = server
    known = _known_hosts(tmp_path / "known", port, keys[0])
    _known_hosts(home / ".ssh" / "known_hosts", port, keys[0])
    reads = {"key": 0, "known_hosts": 0, "config": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            reads[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(paramiko.PKey, "from_path",
                        staticmethod(counted("key", paramiko.PKey.from_path)))
    monkeypatch.setattr(paramiko, "HostKeys", counted("known_hosts", paramiko.HostKeys))
    monkeypatch.setattr(fabric, "Config", counted("config", fabric.Config))
    for _ in range(3):
        with _open(_target(port, client_key_file, known)) as conn:
            assert conn.is_connected
    # The key, the user's and the inventory's known_hosts, and fabric's settings.
    assert reads == {"key": 1, "known_hosts": 2, "config": 1}


def test_a_key_that_cannot_be_read_ahead_is_left_to_paramiko(tmp_path, home, client_key_file):
    encrypted = tmp_path / "id_encrypted"
    paramiko.ECDSAKey.generate().write_private_key_file(str(encrypted), password="secret")
    for path in (str(encrypted), str(tmp_path / "missing")):
        conn = ssh.connect(_target(22, path))
        assert conn.connect_kwargs["key_filename"][0] == path
        assert "pkey" not in conn.connect_kwargs
    # The precondition: a key that can be read is passed read.
    assert "pkey" in ssh.connect(_target(22, client_key_file)).connect_kwargs


def test_an_aead_cipher_is_chosen_where_the_server_has_one(server, keys, tmp_path,
                                                           client_key_file, home):
    port, options = server
    known = _known_hosts(tmp_path / "known", port, keys[0])
    with _open(_target(port, client_key_file, known)) as conn:
        assert conn.transport.remote_cipher == AEAD
        assert conn.transport.local_cipher == AEAD
    options["disabled_algorithms"] = {"ciphers": list(ssh.AEAD_CIPHERS)}
    with _open(_target(port, client_key_file, known)) as conn:
        assert conn.transport.remote_cipher == paramiko.Transport._preferred_ciphers[0]


def test_an_idle_connection_wakes_once_a_second_and_ends_after_close(server, keys, tmp_path,
                                                                      client_key_file, home):
    port, _ = server
    known = _known_hosts(tmp_path / "known", port, keys[0])
    conn = _open(_target(port, client_key_file, known))
    transport = conn.transport
    # paramiko's own transport wakes ten times a second while it waits for the node.
    assert transport.sock.gettimeout() == 1.0
    conn.close()
    transport.join(timeout=10)
    assert not transport.is_alive()
