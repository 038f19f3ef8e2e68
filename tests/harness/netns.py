"""Hosts made of Linux namespaces, for integration tests with real sshd and real Ray.

Layout: a bridge `vcbr<N>` in the root namespace holding 10.213.N.1/24 (so the test process can reach
the hosts), one veth per host namespace, host addresses 10.213.N.(10+i) that exist only inside the
namespaces this lab creates. Each host runs under
    ip netns exec NS unshare --pid --fork --mount-proc --kill-child ...
so `ray stop` or a killall inside one host cannot touch another, and SIGKILL on the wrapper ends the
whole host. /tmp is a private tmpfs per host, as on separate machines, and so is the home folder: nothing a
host writes under ~ reaches the real one, and the login shell finds no ~/.bashrc (a shell profile that runs
`pyenv rehash` waits on a lock that a host killed mid-rehash leaves behind, for every later command).
The folders under /tmp and ~ that hold this Python and this checkout are bound back in.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

BASE = Path("/var/tmp/vc-lab")  # host-side files: outside /tmp, which each host mounts privately
# The GPU machine has no openssh-server: scripts/gpu/gpu_sys_stage.sh stages one and names it here
SSHD = os.environ.get("VC_LAB_SSHD", "/usr/sbin/sshd")
TMP_SIZE = os.environ.get("VC_LAB_TMP_SIZE", "2g")  # each host's private /tmp (a verl run's Ray logs need more)


def integration_ready() -> str | None:
    """None when this machine can run namespace hosts, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "unshare", "nsenter", "ssh-keygen"):
        if not shutil.which(tool):
            return f"`{tool}` not installed"
    if not Path(SSHD).exists():
        return "openssh-server not installed"
    return None


def _tmp_folders_to_keep() -> list[str]:
    """Top-level /tmp folders holding the Python environment or the repository, if any."""
    keep = set()
    for p in (sys.prefix, str(Path(__file__).resolve().parents[2])):
        parts = Path(p).resolve().parts
        if len(parts) > 2 and parts[1] == "tmp":
            keep.add(parts[2])
    return sorted(keep)


def _home_folders_to_keep(home: str) -> list[str]:
    """Top-level folders of `home` holding a Python environment in use (this one, its base, the other Ray's
    venv) or the repository, if any."""
    keep = set()
    other = os.environ.get("VC_OTHER_RAY_PYTHON")
    paths = [sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parents[2])]
    if other:
        paths += [str(Path(other).resolve().parents[1]), str(Path(other).parents[1])]
    top = Path(home).resolve()
    for p in paths:
        rel = Path(p).resolve()
        if rel != top and top in rel.parents:
            keep.add(rel.relative_to(top).parts[0])
    return sorted(keep)


def _sh(*argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout)


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    home: Path  # host-side folder with its sshd config and keys
    wrapper: subprocess.Popen | None = None
    sshd: bool = False
    extra_ips: list[str] = field(default_factory=list)

    @property
    def init_pid(self) -> int:
        """PID (in the root namespace) of the host's PID-namespace init, for nsenter."""
        assert self.wrapper is not None, f"{self.name} is not running"
        for _ in range(100):
            kids = Path(f"/proc/{self.wrapper.pid}/task/{self.wrapper.pid}/children").read_text().split()
            if kids:
                return int(kids[0])
            time.sleep(0.02)
        raise RuntimeError(f"{self.name}: host init did not start")

    @property
    def alive(self) -> bool:
        return self.wrapper is not None and self.wrapper.poll() is None

    def run(self, argv: list[str], timeout: float = 60, check: bool = False,
            env: dict | None = None) -> subprocess.CompletedProcess:
        """Run argv inside this host (its network, PID and mount namespaces)."""
        full = ["nsenter", "-t", str(self.init_pid), "-n", "-p", "-m", "--"] + argv
        home = pwd.getpwuid(os.getuid()).pw_dir  # the host's own (private) home, as an SSH login there sees it
        return subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=check,
                              env={**os.environ, "HOME": home, **(env or {})})

    def pids(self, pattern: str) -> list[int]:
        r = self.run(["pgrep", "-f", pattern])
        return [int(p) for p in r.stdout.split()]


class NetnsLab:
    """Creates and tears down namespace hosts. Use as a context manager or via the pytest fixture."""

    def __init__(self, tag: str = "t"):
        BASE.mkdir(parents=True, exist_ok=True)
        self.n = self._claim_subnet()
        self.bridge = f"vcbr{self.n}"
        self.prefix = f"vc{self.n}"
        self.subnet = f"10.213.{self.n}"
        self.dir = BASE / f"lab{self.n}"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        self.hosts: list[Host] = []
        self.tag = tag
        self._make_keys()
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        _sh("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")

    # ---- subnet bookkeeping: one lab per /24, locked so parallel test runs never collide ----
    def _claim_subnet(self) -> int:
        for n in range(20, 250):
            lock = open(BASE / f"subnet{n}.lock", "w")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            self._lock = lock
            self._remove_leftovers(n)
            return n
        raise RuntimeError("no free lab subnet")

    @staticmethod
    def _remove_leftovers(n: int) -> None:
        """A lab that crashed on this subnet may have left hosts (with processes) and links: remove them."""
        for line in _sh("ip", "netns", "list", check=False).stdout.splitlines():
            ns = line.split()[0] if line.strip() else ""
            if ns.startswith(f"vc{n}-"):
                for pid in _sh("ip", "netns", "pids", ns, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _sh("ip", "netns", "del", ns, check=False)
        for line in _sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(": ")[1].split("@")[0] if ": " in line else ""
            if name == f"vcbr{n}" or name.startswith(f"vc{n}v"):
                _sh("ip", "link", "del", name, check=False)

    def _make_keys(self) -> None:
        self.client_key = self.dir / "id_ed25519"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key))
        self.known_hosts = self.dir / "known_hosts"
        self.known_hosts.write_text("")
        os.chmod(self.client_key, 0o600)

    # ---- hosts ----
    def add_host(self, name: str, sshd: bool = True, known: bool = True) -> Host:
        i = len(self.hosts)
        ns = f"{self.prefix}-{name}"
        ip = f"{self.subnet}.{10 + i}"
        veth = f"{self.prefix}v{i}"
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _sh("ip", "link", "set", veth, "master", self.bridge)
        _sh("ip", "link", "set", veth, "up")
        for argv in (["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                     ["ip", "link", "set", "lo", "up"]):
            _sh("ip", "netns", "exec", ns, *argv)
        home = self.dir / name
        home.mkdir()
        host = Host(name, ns, ip, home)
        self._write_sshd_files(host, known)
        self.hosts.append(host)
        self.start(host, sshd=sshd)
        return host

    def _write_sshd_files(self, host: Host, known: bool) -> None:
        key = host.home / "host_ed25519"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        shutil.copy(f"{self.client_key}.pub", host.home / "authorized_keys")
        (host.home / "sshd_config").write_text(
            f"ListenAddress {host.ip}\nPort 22\nHostKey {key}\nAuthorizedKeysFile {host.home}/authorized_keys\n"
            f"PidFile {host.home}/sshd.pid\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PubkeyAuthentication yes\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n"
            "Subsystem sftp internal-sftp\nMaxSessions 64\nMaxStartups 64\nLogLevel VERBOSE\n")
        if known:
            pub = Path(f"{key}.pub").read_text().split()
            with open(self.known_hosts, "a") as f:
                f.write(f"{host.ip} {pub[0]} {pub[1]}\n")

    def start(self, host: Host, sshd: bool = True) -> None:
        """Boot the host: a PID namespace with a private /tmp and home, running sshd (or just sleeping)."""
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        main = (f"exec {SSHD} -D -f {host.home}/sshd_config -E {host.home}/sshd.log" if sshd
                else "exec sleep infinity")
        # a private /tmp, but with the folders that hold this Python and this checkout (a CI clone may
        # live under /tmp) bound back in from the real /tmp
        orig = host.home / "realtmp"
        orig.mkdir(exist_ok=True)
        # the host's mount namespace copied /run/netns: drop those mounts, or they keep other labs' deleted
        # namespaces (and their veths) alive for as long as this host lives
        boot = "for m in /run/netns/*; do umount -l \"$m\" 2>/dev/null; done; "
        boot += f"mount --bind /tmp {orig} && mount -t tmpfs -o size={TMP_SIZE} tmpfs /tmp && "
        for top in _tmp_folders_to_keep():
            boot += f"mkdir -p /tmp/{top} && mount --bind {orig}/{top} /tmp/{top} && "
        real_home = pwd.getpwuid(os.getuid()).pw_dir
        private = host.home / "home"
        private.mkdir(exist_ok=True)
        for top in _home_folders_to_keep(real_home):
            (private / top).mkdir(exist_ok=True)
            boot += f"mount --bind {shlex.quote(real_home + '/' + top)} {private / top} && "
        boot += f"mount --rbind {private} {shlex.quote(real_home)} && "
        boot += main
        host.wrapper = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
             "sh", "-c", boot], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        host.sshd = sshd
        if sshd:
            self._wait_port(host, 22)

    def extra_sshd(self, host: Host, port: int, key_name: str = "extra") -> Path:
        """A second sshd in `host` on `port` with a host key of its own (new each call with a new key_name);
        returns the key's .pub. It stops with the host, or with stop_extra_sshd."""
        key = host.home / f"host_{key_name}"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        conf = host.home / f"sshd_{port}_config"
        base = (host.home / "sshd_config").read_text()
        conf.write_text(base.replace("Port 22\n", f"Port {port}\n")
                        .replace(f"HostKey {host.home}/host_ed25519\n", f"HostKey {key}\n")
                        .replace(f"PidFile {host.home}/sshd.pid\n", f"PidFile {host.home}/sshd_{port}.pid\n"))
        host.run([SSHD, "-f", str(conf), "-E", str(host.home / f"sshd_{port}.log")], check=True)
        self._wait_port(host, port)
        return Path(f"{key}.pub")

    def stop_extra_sshd(self, host: Host, port: int) -> None:
        pidfile = host.home / f"sshd_{port}.pid"
        pid = pidfile.read_text().split()[0]
        host.run(["kill", pid], check=True)
        for _ in range(100):
            if host.run(["kill", "-0", pid]).returncode != 0:
                break
            time.sleep(0.05)
        pidfile.unlink(missing_ok=True)

    def _wait_port(self, host: Host, port: int, timeout: float = 10) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if host.wrapper.poll() is not None:
                raise RuntimeError(f"{host.name} died: {host.wrapper.stderr.read().decode()[-500:]}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((host.ip, port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{host.name}: port {port} not open after {timeout}s")

    def stop(self, host: Host) -> None:
        """Power the host off: every process in it dies."""
        if host.wrapper and host.wrapper.poll() is None:
            host.wrapper.send_signal(signal.SIGKILL)
            host.wrapper.wait(10)
        host.wrapper = None

    def stop_sshd(self, host: Host) -> None:
        """Keep the host up but with no SSH server (`unreachable` for our CLI)."""
        self.stop(host)
        self.start(host, sshd=False)

    def add_interface(self, host: Host, name: str, ip_cidr: str) -> None:
        """A second interface (a dummy link) that does not reach the bridge."""
        _sh("ip", "netns", "exec", host.ns, "ip", "link", "add", name, "type", "dummy")
        _sh("ip", "netns", "exec", host.ns, "ip", "addr", "add", ip_cidr, "dev", name)
        _sh("ip", "netns", "exec", host.ns, "ip", "link", "set", name, "up")
        host.extra_ips.append(ip_cidr)

    # ---- cluster files for the product ----
    def cluster_yaml(self, head: Host | str, workers: list[Host], name: str | None = None,
                     extra: str = "", path: Path | None = None, ray: str | None = None,
                     node_ray: dict[str, str] | None = None) -> Path:
        """Write a cluster.yaml for these hosts (head may be 'localhost'). The nodes run `ray` (default: the one
        beside this Python, so the hosts run the Ray of the venv that runs pytest); node_ray: host name -> `ray`."""
        name = name or f"lab{self.n}"
        ray = ray or str(Path(sys.executable).with_name("ray"))
        node_ray = node_ray or {}
        head_host = head if isinstance(head, str) else head.ip
        lines = [f"cluster_name: {name}", "head:", f"  host: {head_host}"]
        if not isinstance(head, str) and head.name in node_ray:
            lines.append(f"  ray_executable: {node_ray[head.name]}")
        lines.append("workers:" if workers else "workers: []")
        for w in workers:
            lines.append(f"  - host: {w.ip}")
            if w.name in node_ray:
                lines.append(f"    ray_executable: {node_ray[w.name]}")
        lines += ["ssh:", "  user: root", f"  key_file: {self.client_key}", f"  known_hosts_file: {self.known_hosts}",
                  "  connect_timeout_s: 5",
                  "ray:", f"  ray_executable: {ray}",  # temp_dir: the default, /tmp/vc-<uid>/<name>
                  "  object_store_memory: 209715200",
                  "security:", f"  token_file: {self.dir}/{name}-token"]
        text = "\n".join(lines) + "\n" + extra
        path = path or self.dir / f"{name}.yaml"
        path.write_text(text)
        return path

    # ---- teardown ----
    def close(self) -> None:
        for h in self.hosts:
            self.stop(h)
        self._remove_leftovers(self.n)
        shutil.rmtree(self.dir, ignore_errors=True)
        self._lock.close()

    def __enter__(self) -> "NetnsLab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
