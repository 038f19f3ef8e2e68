"""`verl-cluster env`: the exports that point Ray's own CLI at a cluster with its token (issue 32 item 7). What it
prints for each way the head is reached, that the shell reads it back exactly (quoting), and that only exports
reach stdout. Ray's CLI against a real cluster: tests/integration/test_ray_env.py."""

import subprocess
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.cli.env_cmd import ray_env
from verl_cluster.config.cluster import load_cluster
from verl_cluster.nodes.auth import ensure_token


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VERL_CLUSTER", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def spec_of(tmp_path, text: str):
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: prod\n" + text)
    return load_cluster(p)


def test_a_remote_head_with_its_dashboard_on_loopback_needs_the_tunnel(tmp_path):
    spec = spec_of(tmp_path, "head:\n  host: 10.0.0.5\n")
    env = ray_env(spec, "prod", gcs_answers=False, local_port=18265, token_path="/t/auth_token")
    assert env.exports == {"RAY_ADDRESS": "http://127.0.0.1:18265", "RAY_API_SERVER_ADDRESS": "http://127.0.0.1:18265",
                           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/t/auth_token"}
    # the URL comes with the command that keeps it open
    assert env.tunnel == ["verl-cluster", "dashboard", "-c", "prod", "--port", "18265"] and not env.gcs_direct
    env = ray_env(spec, "prod", gcs_answers=True, local_port=18265, token_path="/t/auth_token")
    assert env.exports["RAY_ADDRESS"] == "10.0.0.5:6379" and env.gcs_direct  # `ray status` reads the GCS
    assert env.exports["RAY_API_SERVER_ADDRESS"] == "http://127.0.0.1:18265" and env.tunnel


def test_a_dashboard_on_the_private_address_needs_no_tunnel(tmp_path):
    spec = spec_of(tmp_path, "head:\n  host: 10.0.0.5\n  dashboard_port: 8300\nsecurity:\n  dashboard_host: private\n")
    env = ray_env(spec, "prod", gcs_answers=True, local_port=1, token_path="/t/auth_token")
    assert env.exports["RAY_API_SERVER_ADDRESS"] == "http://10.0.0.5:8300" and env.tunnel is None


def test_auth_none_unsets_an_earlier_token(tmp_path):
    spec = spec_of(tmp_path, "head:\n  host: localhost\nsecurity:\n  auth: none\n")
    env = ray_env(spec, "prod", gcs_answers=True, local_port=1, token_path=None)
    assert "RAY_AUTH_MODE" not in env.exports and env.unset == ["RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"]
    assert env.shell().endswith("unset RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH\n")


def test_the_shell_reads_back_exactly_what_was_printed(tmp_path):
    """A token path with a space, a quote and `$(...)` stays one word and runs nothing when eval'd."""
    spec = spec_of(tmp_path, "head:\n  host: localhost\n")
    marker = tmp_path / "ran"
    path = f"/tmp/a b'c/$(touch {marker})/auth_token"
    env = ray_env(spec, "prod", gcs_answers=True, local_port=1, token_path=path)
    r = subprocess.run(["bash", "-c", 'eval "$1"; printf "%s\\n%s" "$RAY_AUTH_TOKEN_PATH" "$RAY_ADDRESS"', "_",
                        env.shell()], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout == f"{path}\n127.0.0.1:6379", r
    assert not marker.exists()


def test_env_prints_only_exports_on_stdout_and_never_the_token(home, tmp_path, capsys):
    p = tmp_path / "mine.yaml"
    p.write_text(f"cluster_name: mine\nhead:\n  host: localhost\n  gcs_port: {_closed_port()}\n")
    spec = load_cluster(p)
    assert main(["env", "-c", str(p)]) == 1  # never brought up: no token yet, and it says how to get one
    err = capsys.readouterr().err
    assert "no auth token for cluster `mine`" in err and "verl-cluster up" in err
    ensure_token(spec)  # as `up` does
    assert main(["env", "-c", str(p)]) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    assert all(x.startswith("export ") for x in lines) and len(lines) == 4, cap.out
    assert f"export RAY_AUTH_TOKEN_PATH={spec.token_file.resolve()}" in lines
    assert "export RAY_AUTH_MODE=token" in lines
    assert "export RAY_API_SERVER_ADDRESS=http://127.0.0.1:8265" in lines
    token = spec.token_file.read_text().strip()
    assert token not in cap.out and token not in cap.err
    assert f"cluster: mine ({p})" in cap.err
    # nothing answers at its GCS port: RAY_ADDRESS is the Jobs API, and stderr says `ray status` cannot run here
    assert "export RAY_ADDRESS=http://127.0.0.1:8265" in lines and "`ray status` cannot run here" in cap.err


def test_env_never_points_rays_cli_with_the_token_at_another_head(home, tmp_path, capsys):
    """A cluster file that names a cluster's token with a head of its own (planted, or a record that led there):
    the exports would make Ray's CLI send the token there; nothing goes to stdout."""
    prod = tmp_path / "prod.yaml"
    prod.write_text("cluster_name: prod\nhead:\n  host: localhost\n")
    ensure_token(load_cluster(prod))
    evil = tmp_path / "evil.yaml"
    evil.write_text("cluster_name: prod\nhead:\n  host: 127.0.0.1\n  dashboard_port: 28765\n"
                    "security:\n  dashboard_host: all\n")
    rc = main(["env", "-c", str(evil)])
    cap = capsys.readouterr()
    assert rc in (1, 2) and "refusing to send it there" in cap.err and cap.out == "", cap


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there for the test's few seconds


def test_readme_says_how_to_use_rays_cli():
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert 'eval "$(verl-cluster env' in text and "ray status" in text and "ray job list" in text
