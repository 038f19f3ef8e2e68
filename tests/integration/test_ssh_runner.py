"""The SSH runner against a real sshd in a namespace host: quoting, timeouts, secrets, files, tunnels."""

import socket
import time

import pytest

from tests.harness.wait import wait_for

from verl_cluster.errors import RunnerError
from verl_cluster.runners import SshRunner, SshTarget
from verl_cluster.runners.base import CommandTimeout

pytestmark = pytest.mark.integration


@pytest.fixture
def host_and_runner(lab):
    h = lab.add_host("a")
    r = SshRunner(SshTarget(h.ip, user="root", key_file=str(lab.client_key), known_hosts_file=str(lab.known_hosts),
                            connect_timeout_s=5))
    yield h, r
    r.close()


def test_hostile_arguments_arrive_verbatim(host_and_runner, tmp_path):
    h, r = host_and_runner
    evil = "a b; touch /tmp/pwned $(touch /tmp/pwned2) `touch /tmp/pwned3` 'q' \"d\" \\ *"
    res = r.run(["printf", "%s", evil], env={"V": "$(touch /tmp/pwned4)"})
    assert res.rc == 0 and res.stdout == evil
    assert h.run(["sh", "-c", "ls /tmp/pwned* 2>/dev/null | wc -l"]).stdout.strip() == "0"


def test_remote_timeout_stops_the_command(host_and_runner):
    h, r = host_and_runner
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout):
        r.run(["sleep", "300"], timeout=2)
    assert time.monotonic() - t0 < 15
    wait_for(lambda: h.pids("sleep 300") == [], 10, "the remote sleep to be stopped")


def test_popen_env_never_on_a_command_line(host_and_runner):
    h, r = host_and_runner
    secret = "hf_" + "x7Qz9" * 4
    p = r.popen(["sh", "-c", 'echo "got=$HF_TOKEN"; sleep 30'], env={"HF_TOKEN": secret})
    lines = p.lines()
    assert next(lines) == f"got={secret}"
    ps = h.run(["ps", "-eo", "args"]).stdout
    assert secret not in ps
    assert h.run(["sh", "-c", "ls ~/.verl-cluster/env-* 2>/dev/null | wc -l"]).stdout.strip() == "0"
    p.terminate()
    wait_for(lambda: h.pids("sleep 30") == [], 10, "the remote sleep to be stopped")


def test_put_text_mode_and_tunnel(host_and_runner):
    h, r = host_and_runner
    path = r.put_text("s3cret\n", "~/.verl-cluster/t/tok", 0o600)
    assert path.startswith("/") and h.run(["stat", "-c", "%a", path]).stdout.strip() == "600"
    # a service on the host's loopback, reached through the tunnel
    h.run(["sh", "-c", "nohup python3 -m http.server 18080 --bind 127.0.0.1 >/dev/null 2>&1 &"])
    deadline = time.monotonic() + 10
    body = b""
    with r.open_tunnel("127.0.0.1", 18080) as tunnel:
        while time.monotonic() < deadline and b"HTTP/1" not in body:
            try:
                with socket.create_connection(("127.0.0.1", tunnel.local_port), timeout=3) as s:
                    s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                    body = s.recv(100)
            except OSError:
                time.sleep(0.2)
    assert body.startswith(b"HTTP/1")


def test_refused_and_unroutable(lab):
    h = lab.add_host("nossh", sshd=False)
    r = SshRunner(SshTarget(h.ip, user="root", key_file=str(lab.client_key), known_hosts_file=str(lab.known_hosts),
                            connect_timeout_s=2))
    with pytest.raises(RunnerError, match="refused"):
        r.run(["true"])
    lab.stop(h)  # the address now answers nothing: a timeout, bounded by connect_timeout_s
    t0 = time.monotonic()
    with pytest.raises(RunnerError):
        r.run(["true"])
    assert time.monotonic() - t0 < 10


def test_parallel_copies_to_one_path_never_tear(lab):
    """Nodes that share a home (NFS) receive the token at the same path at once: every copy must land whole."""
    from verl_cluster.runners import fan_out

    h = lab.add_host("shared")
    runners = [SshRunner(SshTarget(h.ip, user="root", key_file=str(lab.client_key),
                                   known_hosts_file=str(lab.known_hosts))) for _ in range(8)]
    token = "t" * 64 + "\n"
    results = fan_out(list(range(8)), lambda i: runners[i].put_text(token, "~/.verl-cluster/shared/tok", 0o600))
    assert all(r.ok for r in results), [r.reason for r in results if not r.ok]
    assert h.run(["cat", "/root/.verl-cluster/shared/tok"]).stdout == token
    assert h.run(["sh", "-c", "ls /root/.verl-cluster/shared/ | wc -l"]).stdout.strip() == "1"
    for r in runners:
        r.close()
    h.run(["rm", "-rf", "/root/.verl-cluster/shared"])


def test_popen_that_cannot_start_leaves_no_secret_file(host_and_runner, monkeypatch):
    h, r = host_and_runner
    import paramiko

    def refuse(self, *a, **kw):
        raise paramiko.SSHException("pty request denied")

    monkeypatch.setattr(paramiko.Channel, "get_pty", refuse)
    with pytest.raises(RunnerError, match="could not start"):
        r.popen(["true"], env={"HF_TOKEN": "hf_x"})
    assert h.run(["sh", "-c", "ls ~/.verl-cluster/env-* 2>/dev/null | wc -l"]).stdout.strip() == "0"
