"""Run commands on a remote host over SSH (paramiko).

Argv lists are quoted exactly once, here, with shlex.join. Host keys are verified against known_hosts
(RejectPolicy) unless the config says `accept_new_host_keys`, in which case a new key is appended (never a
changed one). Every network step has a timeout.
"""

from __future__ import annotations

import getpass
import logging
import os
import secrets
import select
import shlex
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import paramiko

from verl_cluster.config.names import env_name_problem, host_problem, user_problem
from verl_cluster.errors import ConfigError, ConnectError, HostKeyError, KeyFileError, RunnerError
from verl_cluster.runners.base import CommandTimeout, Result

# paramiko's transport thread logs every failed connection with its traceback (a ProxyCommand that exits, a port
# that accepts and closes before the banner: "Error reading SSH protocol banner ... EOFError"); the same failure
# reaches the caller as an exception, said in one line per host. Not propagated either: a program that set up
# logging (a root handler) would print those tracebacks around our tables
_PARAMIKO_LOG = logging.getLogger("paramiko")
_PARAMIKO_LOG.addHandler(logging.NullHandler())
_PARAMIKO_LOG.propagate = False


@dataclass(frozen=True)
class SshTarget:
    host: str
    port: int = 22
    user: Optional[str] = None
    key_file: Optional[str] = None
    known_hosts_file: str = "~/.ssh/known_hosts"
    connect_timeout_s: float = 10.0
    keepalive_s: int = 15
    accept_new_host_keys: bool = False
    use_ssh_config: bool = True


def host_key_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class _RememberNewKey(paramiko.MissingHostKeyPolicy):
    """Accept a host never seen before and append it to known_hosts (trust on first use)."""

    def __init__(self, path: Path):
        self.path = path

    def missing_host_key(self, client, hostname, key):
        # paramiko passes the name it looked up: already `[host]:port` for a port other than 22, so it is written
        # as given (wrapped again it would never match, and every later key, a changed one too, would be "new")
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)


def _resolve(target: SshTarget) -> tuple[str, int, str, list[str], Optional[str]]:
    """Apply ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyCommand) under explicit settings."""
    # the host and user are substituted (%h, %r) into a ProxyCommand that paramiko splits into words and runs here
    for value, problem in ((target.host, host_problem), (target.user, user_problem)):
        if value is not None and problem(value):
            raise ConfigError(f"SSH target {value!r} {problem(value)}", "fix the host/user in the cluster config")
    hostname, port, user, keys, proxy = target.host, target.port, target.user, [], None
    cfg_path = Path("~/.ssh/config").expanduser()
    if target.use_ssh_config and cfg_path.is_file():
        try:
            cfg = paramiko.SSHConfig.from_path(str(cfg_path)).lookup(target.host)
        except Exception:  # a config paramiko cannot parse must not stop us
            cfg = {}
        hostname = cfg.get("hostname", hostname)
        if target.port == 22 and "port" in cfg:
            port = int(cfg["port"])
        user = user or cfg.get("user")
        # as ssh does, an IdentityFile that is not there is passed over (paramiko would fail the whole connection)
        keys = [k for k in (os.path.expanduser(k) for k in cfg.get("identityfile", [])) if os.path.isfile(k)]
        proxy = cfg.get("proxycommand")
    if target.key_file:
        keys = [_key_file(target.host, target.key_file)]
    return hostname, port, user or getpass.getuser(), keys, proxy


KEY_HINT = ("point ssh.key_file (or the node's ssh_key_file) at the private key that logs in there, e.g. "
            "~/.ssh/id_ed25519, or leave it out to use ~/.ssh/config, the agent and ~/.ssh/id_*")


def _key_file(host: str, key_file: str) -> str:
    """The configured private key, which must be a file we can read: a missing one is named as such (paramiko's
    "No such file or directory" read as a host that cannot be reached)."""
    path = os.path.expanduser(key_file)
    if not os.path.exists(path):
        raise KeyFileError(host, f"SSH key file {path} (ssh.key_file / the node's ssh_key_file) does not exist",
                           KEY_HINT)
    if not os.path.isfile(path):
        raise KeyFileError(host, f"SSH key file {path} (ssh.key_file / the node's ssh_key_file) is not a file",
                           KEY_HINT)
    if not os.access(path, os.R_OK):
        raise KeyFileError(host, f"SSH key file {path} (ssh.key_file / the node's ssh_key_file) cannot be read "
                                 "by this user", f"fix its owner/permissions (chmod 600), or {KEY_HINT}")
    return path


PROXY_HINT = "run the ProxyCommand by hand to see why, or fix or remove its line for this host in ~/.ssh/config"


class _Proxy(paramiko.ProxyCommand):
    """paramiko's ProxyCommand, closed by its Popen: paramiko's close() signals the bare pid, which once the command
    has exited and been reaped (_proxy_gone waits on it) fails in paramiko's transport thread with a traceback on
    the terminal, or, the pid taken by another process since, would signal that one."""

    def close(self) -> None:
        self.process.terminate()  # nothing once reaped; a pid gone meanwhile is let be


def _start_proxy(host: str, proxy: str) -> paramiko.ProxyCommand:
    try:
        return _Proxy(proxy)
    except (OSError, ValueError) as e:
        raise ConnectError(host, f"the ProxyCommand for {host} in ~/.ssh/config (`{proxy[:120]}`) could not start: "
                                 f"{getattr(e, 'strerror', None) or e}", PROXY_HINT)


def _proxy_gone(sock: paramiko.ProxyCommand, wait_s: float = 2.0) -> bool:
    """Whether the ProxyCommand has exited. Its closed output can reach paramiko (EOF) before its exit status is there
    to read on a loaded machine: wait a little on the error path rather than blame the SSH server."""
    try:
        sock.process.wait(timeout=wait_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def _proxy_exited(host: str, proxy: str, sock: paramiko.ProxyCommand) -> ConnectError:
    said = ""
    try:
        said = sock.process.stderr.read(4000).decode(errors="replace").strip().splitlines()[-1:]
        said = f": {said[0][:200]}" if said else ""
    except (OSError, ValueError, AttributeError):
        pass
    return ConnectError(host, f"the ProxyCommand for {host} in ~/.ssh/config (`{proxy[:120]}`) exited with status "
                              f"{sock.process.returncode} before SSH started{said}", PROXY_HINT)


def _check_env_names(env: Mapping[str, str]) -> None:
    """`env` would take a `-S...` name as an option and a shell runs what follows `export X=1;`: names only."""
    bad = next((k for k in env if env_name_problem(str(k))), None)
    if bad is not None:
        raise ConfigError(f"environment variable name {bad!r} {env_name_problem(str(bad))}")


class SshProcess:
    """A remote command with a pty: closing it hangs up the remote process group."""

    def __init__(self, chan: paramiko.Channel, host: str):
        self._chan, self.host = chan, host

    def lines(self) -> Iterator[str]:
        buf = b""
        while True:
            data = self._chan.recv(65536)
            if not data:
                break
            buf += data
            *done, buf = buf.split(b"\n")
            for line in done:
                yield line.decode(errors="replace").rstrip("\r")
        if buf:
            yield buf.decode(errors="replace").rstrip("\r")

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._chan.exit_status_ready():
            if deadline is not None and time.monotonic() > deadline:
                raise CommandTimeout(self.host, f"still running after {timeout:.0f}s")
            time.sleep(0.05)
        return self._chan.recv_exit_status()

    def terminate(self) -> None:
        try:
            self._chan.send(b"\x03")  # Ctrl-C through the pty, then hang up
            time.sleep(0.2)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        self._chan.close()


class SshRunner:
    def __init__(self, target: SshTarget):
        self.target = target
        self.host = target.host
        self._client: Optional[paramiko.SSHClient] = None
        self._lock = threading.Lock()

    # ---- connection ----
    def _connect(self) -> paramiko.SSHClient:
        with self._lock:
            if self._client is not None and self._client.get_transport() and self._client.get_transport().is_active():
                return self._client
            t = self.target
            hostname, port, user, keys, proxy = _resolve(t)
            known = Path(t.known_hosts_file).expanduser()
            client = paramiko.SSHClient()
            if known.is_file():
                try:
                    client.load_host_keys(str(known))
                except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey) as e:
                    raise ConnectError(t.host, f"cannot read known_hosts {known}: {str(e)[:200]}",
                                      "fix or remove the broken line")
            client.set_missing_host_key_policy(
                _RememberNewKey(known) if t.accept_new_host_keys else paramiko.RejectPolicy())
            sock = _start_proxy(t.host, proxy) if proxy else None
            where = f"{user}@{hostname}:{port}"
            try:
                try:
                    client.connect(hostname, port=port, username=user, key_filename=keys or None,
                                   look_for_keys=not keys, allow_agent=True, timeout=t.connect_timeout_s,
                                   banner_timeout=t.connect_timeout_s, auth_timeout=t.connect_timeout_s,
                                   channel_timeout=t.connect_timeout_s, sock=sock)
                except (paramiko.SSHException, EOFError, OSError):
                    gave_up = _proxy_exited(t.host, proxy, sock) if sock is not None and _proxy_gone(sock) else None
                    # closed here, its transport thread ends now, not at interpreter exit (where, on a loaded
                    # machine, it could still print to the terminal)
                    client.close()
                    if gave_up:  # the ProxyCommand gave up: say why
                        raise gave_up from None
                    raise
            except paramiko.BadHostKeyException:
                raise HostKeyError(t.host, f"host key for {hostname}:{port} does not match {known} — refusing",
                                   f"if the host was reinstalled, remove its line: ssh-keygen -R "
                                   f"'{host_key_name(hostname, port)}' -f {known}")
            except paramiko.AuthenticationException as e:
                raise ConnectError(t.host, f"SSH authentication failed for {where}: {e}",
                                  "set ssh.key_file (or the node's ssh_key_file) and ssh.user")
            except paramiko.SSHException as e:
                if "not found in known_hosts" in str(e):
                    raise HostKeyError(
                        t.host, f"host key of {hostname}:{port} is not in {known} — refusing to connect",
                        f"verify and add it: ssh-keyscan -p {port} {hostname} >> {known}"
                        " (or set ssh.accept_new_host_keys: true to trust on first use)")
                raise ConnectError(t.host, f"SSH to {where} failed: {e}")
            except socket.timeout:
                raise ConnectError(t.host, f"SSH to {where} timed out after {t.connect_timeout_s:.0f}s",
                                  "is the host up and port open? raise ssh.connect_timeout_s for slow links")
            except (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError):
                raise ConnectError(t.host, f"SSH connection to {hostname}:{port} refused",
                                  "is sshd running there, and is the port right?")
            except OSError as e:
                raise ConnectError(t.host, f"cannot reach {hostname}:{port}: {e.strerror or e}")
            transport = client.get_transport()
            if t.keepalive_s:
                transport.set_keepalive(t.keepalive_s)
            self._client = client
            return client

    def connect(self) -> None:
        self._connect()

    def _channel(self) -> paramiko.Channel:
        try:
            return self._connect().get_transport().open_session(timeout=self.target.connect_timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host, f"SSH session failed: {e}")

    # ---- commands ----
    @staticmethod
    def command_line(argv: Sequence[str], env: Mapping[str, str] | None = None,
                     timeout: float | None = None) -> str:
        """The single shell string sent over SSH: `timeout` stops it remotely, `env` sets variables."""
        full: list[str] = []
        if timeout:
            full += ["timeout", "-k", "5", f"{max(1, int(timeout))}"]
        if env:
            _check_env_names(env)
            full += ["env"] + [f"{k}={v}" for k, v in env.items()]
        return shlex.join(full + list(argv))

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            timeout: float = 60.0, stdin: str | None = None) -> Result:
        chan = self._channel()
        deadline = time.monotonic() + timeout + 10  # remote `timeout` fires first; this is the backstop
        out, err = bytearray(), bytearray()
        try:
            chan.exec_command(self.command_line(argv, env, timeout))
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            while True:
                r, _, _ = select.select([chan], [], [], 0.2)
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if time.monotonic() > deadline:
                    raise CommandTimeout(self.host, f"`{argv[0]}` did not finish within {timeout:.0f}s")
            rc = chan.recv_exit_status()
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise RunnerError(self.host, f"SSH command failed: {e}")
        finally:
            chan.close()
        if rc == 124 and timeout:
            raise CommandTimeout(self.host, f"`{argv[0]}` did not finish within {timeout:.0f}s")
        return Result(rc, out.decode(errors="replace"), err.decode(errors="replace"))

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> SshProcess:
        """Start argv with a pty. The environment travels in a 0600 file that the remote shell reads and
        deletes before exec, so values (a job's secrets) never appear on a command line or in `ps`."""
        full, path = list(argv), None
        if env:
            _check_env_names(env)
            text = "".join(f"export {k}={shlex.quote(str(v))}\n" for k, v in env.items())
            path = self.put_text(text, f"~/.verl-cluster/env-{secrets.token_hex(8)}.sh", 0o600)
            full = ["sh", "-c", '. "$1" && rm -f "$1" && shift && exec "$@"', "sh", path, *full]
        chan = self._channel()
        try:
            chan.get_pty(width=250)
            chan.exec_command(shlex.join(full))
        except (paramiko.SSHException, EOFError, OSError) as e:
            chan.close()
            if path:  # the command never ran, so nothing read and removed the file with the secrets
                try:
                    self.run(["rm", "-f", path], timeout=10)
                except RunnerError:
                    pass
            raise RunnerError(self.host, f"could not start `{argv[0]}` over SSH: {e}")
        return SshProcess(chan, self.host)

    # ---- files ----
    def put_text(self, text: str, remote_path: str, mode: int = 0o600) -> str:
        return self._put(lambda sftp, path: sftp.putfo(_BytesReader(text.encode()), path), remote_path, mode)

    def put_file(self, local_path: str, remote_path: str, mode: int = 0o600) -> str:
        return self._put(lambda sftp, path: sftp.put(local_path, path), remote_path, mode)

    def _put(self, send, remote_path: str, mode: int) -> str:
        """Copy with sftp; returns the absolute remote path (`~/` resolved)."""
        try:
            sftp = self._connect().open_sftp()
            sftp.get_channel().settimeout(self.target.connect_timeout_s * 3)
            path = remote_path
            if path.startswith("~/"):
                path = sftp.normalize(".") + path[1:]
            parent = path.rsplit("/", 1)[0]
            self._mkdirs(sftp, parent)
            # write a private temporary file, then rename it into place: never world-readable, and several
            # writers of one path (nodes sharing an NFS home) never see each other's half-written file
            tmp = f"{path}.tmp-{secrets.token_hex(6)}"
            with sftp.open(tmp, "w") as f:
                f.chmod(mode)
            try:
                send(sftp, tmp)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
            except BaseException:
                try:
                    sftp.remove(tmp)
                except OSError:
                    pass
                raise
            sftp.close()
            return path
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise RunnerError(self.host, f"copying to {remote_path} failed: {e}")

    @staticmethod
    def _mkdirs(sftp: paramiko.SFTPClient, path: str) -> None:
        parts, cur = [p for p in path.split("/") if p], ""
        for p in parts:
            cur += "/" + p
            try:
                sftp.stat(cur)
            except FileNotFoundError:
                try:
                    sftp.mkdir(cur, 0o700)
                except OSError:
                    sftp.stat(cur)  # another writer made it meanwhile (nodes sharing a home); else re-raise

    # ---- port forwarding ----
    def open_tunnel(self, remote_host: str, remote_port: int, local_port: int = 0) -> "Tunnel":
        """local_port 0: any free one. OSError when the local port is taken."""
        return Tunnel(self._connect().get_transport(), remote_host, remote_port, self.target.connect_timeout_s,
                      local_port)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


class _BytesReader:
    def __init__(self, data: bytes):
        self._data, self._pos = data, 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n < 0 else self._pos + n
        chunk, self._pos = self._data[self._pos:end], min(end, len(self._data))
        return chunk


class Tunnel:
    """127.0.0.1:local_port on this machine -> remote_host:remote_port as seen from the SSH host."""

    def __init__(self, transport: paramiko.Transport, remote_host: str, remote_port: int, timeout: float,
                 local_port: int = 0):
        self._transport, self._dest, self._timeout = transport, (remote_host, remote_port), timeout
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._server.bind(("127.0.0.1", local_port))
        except OSError:
            self._server.close()
            raise
        self._server.listen(16)
        self._server.settimeout(0.5)
        self.local_port = self._server.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, addr = self._server.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._pump, args=(conn, addr), daemon=True).start()

    def _pump(self, conn: socket.socket, addr) -> None:
        try:
            chan = self._transport.open_channel("direct-tcpip", self._dest, addr, timeout=self._timeout)
        except (paramiko.SSHException, OSError, EOFError):
            conn.close()
            return
        try:
            while not self._closed.is_set():
                r, _, _ = select.select([conn, chan], [], [], 0.5)
                if conn in r:
                    data = conn.recv(65536)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in r:
                    data = chan.recv(65536)
                    if not data:
                        break
                    conn.sendall(data)
        except Exception:  # noqa: BLE001 - a peer or the transport went away (closing races raise ValueError,
            pass  # EOFError, SSHException as well as OSError): this connection ends, the tunnel goes on
        finally:
            for end in (chan, conn):
                try:
                    end.close()
                except Exception:  # noqa: BLE001 - already torn down with the transport
                    pass

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.local_port}"

    @property
    def alive(self) -> bool:
        """False once closed or once the SSH connection under it is gone."""
        return not self._closed.is_set() and self._transport.is_active()

    def close(self) -> None:
        self._closed.set()
        self._server.close()

    def __enter__(self) -> "Tunnel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
