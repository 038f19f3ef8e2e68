"""SSH host keys on a port other than 22, against a real paramiko SSH server on a random local port."""

import socket
import threading

import paramiko
import pytest

from verl_cluster.errors import HostKeyError
from verl_cluster.runners.ssh import SshRunner, SshTarget


class _AcceptAll(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL


class KeySwappingServer:
    """An SSH server on 127.0.0.1:<random>; `host_key` can be changed between connections."""

    def __init__(self):
        self.host_key = paramiko.ECDSAKey.generate()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.transports: list[paramiko.Transport] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(self.host_key)
            try:
                t.start_server(server=_AcceptAll())
            except (paramiko.SSHException, EOFError, OSError):
                continue
            self.transports.append(t)

    def close(self):
        self.stop.set()
        self.thread.join(2)
        for t in self.transports:
            t.close()
        self.sock.close()


@pytest.fixture
def server():
    s = KeySwappingServer()
    yield s
    s.close()


def _target(server, tmp_path, **kw):
    client_key = tmp_path / "id_ecdsa"
    if not client_key.exists():
        paramiko.ECDSAKey.generate().write_private_key_file(str(client_key))
    return SshTarget("127.0.0.1", port=server.port, user="me", key_file=str(client_key),
                     known_hosts_file=str(tmp_path / "known_hosts"), connect_timeout_s=5, use_ssh_config=False,
                     **kw)


def test_changed_key_on_a_non_22_port_is_refused_with_accept_new(server, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    target = _target(server, tmp_path, accept_new_host_keys=True)
    r = SshRunner(target)
    r.connect()  # first contact: trusted and recorded under the name ssh itself uses
    r.close()
    kh = tmp_path / "known_hosts"
    recorded = kh.read_text().splitlines()
    assert recorded == [f"[127.0.0.1]:{server.port} ecdsa-sha2-nistp256 {server.host_key.get_base64()}"]
    assert oct(kh.stat().st_mode & 0o777) == "0o600"

    r = SshRunner(target)
    r.connect()  # same key: verified, nothing added
    r.close()
    assert kh.read_text().splitlines() == recorded

    server.host_key = paramiko.ECDSAKey.generate()  # the server was replaced (or is an impostor)
    with pytest.raises(HostKeyError, match="does not match"):
        SshRunner(target).connect()
    assert kh.read_text().splitlines() == recorded  # the new key was not appended


def test_recorded_key_is_what_ssh_keygen_looks_up(server, tmp_path, monkeypatch):
    """The line we write is found by paramiko's own lookup for [host]:port, as OpenSSH would find it."""
    monkeypatch.setenv("HOME", str(tmp_path))
    r = SshRunner(_target(server, tmp_path, accept_new_host_keys=True))
    r.connect()
    r.close()
    keys = paramiko.HostKeys(str(tmp_path / "known_hosts"))
    assert keys.lookup(f"[127.0.0.1]:{server.port}") is not None
    # without accept_new_host_keys the recorded key is accepted, and a new one refused
    SshRunner(_target(server, tmp_path)).connect()
    server.host_key = paramiko.ECDSAKey.generate()
    with pytest.raises(HostKeyError, match="does not match"):
        SshRunner(_target(server, tmp_path)).connect()


def test_a_proxycommand_reaped_before_close_is_closed_quietly():
    """The error path waits on a ProxyCommand that exited (_proxy_gone reaps it); paramiko then closes the socket,
    and its own close() signals the bare pid: ProcessLookupError in its transport thread (a traceback on a loaded
    machine), or another process's pid by then. Ours is closed through its Popen."""
    from verl_cluster.runners import ssh

    sock = ssh._start_proxy("jumpy", 'sh -c "exit 3"')
    assert ssh._proxy_gone(sock) and sock.process.returncode == 3
    sock.close()  # paramiko.ProxyCommand.close would raise ProcessLookupError here
    assert sock.closed


@pytest.mark.parametrize("proxy, why", [
    ('sh -c "echo no route >&2; exit 1"', "exited"),  # starts, then fails: paramiko's thread printed a traceback
    ("/nonexistent/proxy %h", "could not start"),
])
def test_a_failing_proxycommand_is_one_line_naming_it(tmp_path, proxy, why):
    import os
    import subprocess
    import sys

    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(f"Host jumpy\n  ProxyCommand {proxy}\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cluster_name: pc\nhead: {host: jumpy}\nssh: {connect_timeout_s: 3}\n")
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "status", "-c", str(cfg), "--json"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})
    assert "Traceback" not in r.stderr and "Exception (client)" not in r.stderr, r.stderr
    import json

    reason = json.loads(r.stdout)["nodes"][0]["reason"]
    assert "ProxyCommand" in reason and why in reason and "~/.ssh/config" in reason, reason
