"""SSH attacks against real OpenSSH servers in namespace hosts: host keys on a port other than 22, and host names
that would run code through ~/.ssh/config's ProxyCommand."""

import subprocess
import sys

import pytest

from verl_cluster.cli import main
from verl_cluster.errors import HostKeyError
from verl_cluster.runners import SshRunner, SshTarget

pytestmark = pytest.mark.integration
PORT = 2222


def test_changed_host_key_on_port_2222_is_refused(lab, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    host = lab.add_host("keys2222")
    first = lab.extra_sshd(host, PORT, "first")
    kh = tmp_path / "known_hosts"
    target = SshTarget(host.ip, port=PORT, user="root", key_file=str(lab.client_key), known_hosts_file=str(kh),
                       connect_timeout_s=5, accept_new_host_keys=True, use_ssh_config=False)
    r = SshRunner(target)
    assert r.run(["true"]).rc == 0
    r.close()
    line = kh.read_text().splitlines()
    assert line == [f"[{host.ip}]:{PORT} {' '.join(first.read_text().split()[:2])}"]
    # OpenSSH itself finds the line we wrote
    found = subprocess.run(["ssh-keygen", "-F", f"[{host.ip}]:{PORT}", "-f", str(kh)], capture_output=True,
                           text=True)
    assert found.returncode == 0, found.stdout + found.stderr
    r = SshRunner(target)
    assert r.run(["true"]).rc == 0  # verified, not re-added
    r.close()
    assert kh.read_text().splitlines() == line

    lab.stop_extra_sshd(host, PORT)
    lab.extra_sshd(host, PORT, "second")  # same address and port, another host key
    with pytest.raises(HostKeyError, match="does not match"):
        SshRunner(target).run(["true"])
    assert kh.read_text().splitlines() == line


def test_proxycommand_host_injection_runs_nothing(lab, tmp_path, monkeypatch, capsys):
    """A bastion setup (`Host *` / ProxyCommand with %h) and a hostile host name in cluster.yaml."""
    monkeypatch.setenv("HOME", str(tmp_path))
    host = lab.add_host("bastion")
    (tmp_path / ".ssh").mkdir(mode=0o700)
    # the bastion is the host itself: `ssh -W %h:%p` through it reaches it again
    (tmp_path / ".ssh" / "config").write_text(
        f"Host *\n  ProxyCommand ssh -F /dev/null -i {lab.client_key} -o UserKnownHostsFile={lab.known_hosts} "
        f"-o StrictHostKeyChecking=yes -o BatchMode=yes -l root -W %h:%p {host.ip}\n")
    pwned = tmp_path / "PWNED"
    # the same ProxyCommand reaches the real host (so the setup is live) ...
    ok = SshRunner(SshTarget(host.ip, user="root", key_file=str(lab.client_key), known_hosts_file=str(lab.known_hosts),
                             connect_timeout_s=5))
    assert ok.run(["echo", "via-proxy"]).stdout.strip() == "via-proxy"
    ok.close()
    # ... and a host that would break out of %h is refused where it is read, before any connection
    evil = f"x:22 -oProxyCommand=touch${{IFS}}{pwned};#"
    cfg = lab.cluster_yaml(host, [], name="inject")
    cfg.write_text(cfg.read_text().replace(f"host: {host.ip}", f"host: '{evil}'"))
    rc = main(["status", "-c", str(cfg)])
    err = capsys.readouterr().err
    assert not pwned.exists(), "the host name ran a command on this machine through ProxyCommand"
    assert rc == 2 and f"{cfg}:3" in err and "host" in err
    # the runner refuses it too, for a caller that built the target itself
    with pytest.raises(Exception, match="not a host name"):
        SshRunner(SshTarget(evil, user="root", key_file=str(lab.client_key), known_hosts_file=str(lab.known_hosts),
                            connect_timeout_s=5)).connect()
    assert not pwned.exists()
