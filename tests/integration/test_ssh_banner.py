"""A host that accepts TCP and closes before the SSH banner (a port forward with nothing behind it, a half-started
sshd): `status` and `check` say it in one line per host, no paramiko traceback around the tables (issue 32
item 4) - also when the program running us set up logging, as a script embedding the CLI does."""

import os
import socket
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.integration

EMBEDDED = "import logging, sys; logging.basicConfig(); from verl_cluster.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture
def closing_listeners():
    """Two loopback addresses whose port accepts every connection and closes it at once."""
    socks, stop = [], threading.Event()
    for ip in ("127.0.0.71", "127.0.0.72"):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((ip, 0 if not socks else socks[0].getsockname()[1]))
        s.listen(64)
        s.settimeout(0.2)
        socks.append(s)

    def serve(s):
        while not stop.is_set():
            try:
                c, _ = s.accept()
                c.close()
            except OSError:
                continue

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in socks]
    for t in threads:
        t.start()
    yield [s.getsockname() for s in socks]
    stop.set()
    for t in threads:
        t.join(2)
    for s in socks:
        s.close()


@pytest.mark.parametrize("command", ["status", "check"])
def test_banner_failure_is_one_line_per_host(closing_listeners, tmp_path, command):
    (ip1, port), (ip2, _) = closing_listeners
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"cluster_name: banner\nhead: {{host: {ip1}}}\nworkers: [{{host: {ip2}}}]\n"
                   f"ssh: {{port: {port}, connect_timeout_s: 3, known_hosts_file: {tmp_path}/kh}}\n")
    argv = [command, "-c", str(cfg)] + (["--quick"] if command == "check" else [])
    for runner in (["-m", "verl_cluster"], ["-c", EMBEDDED]):
        r = subprocess.run([sys.executable, *runner, *argv], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "HOME": str(tmp_path), "COLUMNS": "400"})
        text = r.stdout + r.stderr
        assert r.returncode == 1, text
        assert "Traceback" not in text and "EOFError" not in text and "Exception (client)" not in text, text
        for ip in (ip1, ip2):  # each host once, with the cause
            lines = [x for x in text.splitlines() if ip in x and "banner" in x]
            assert lines, text
