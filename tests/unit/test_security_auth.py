"""Open clusters: `auth: none` is said loudly by up and status; an open dashboard without auth needs a yes."""

import json

import pytest

from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import ConfigError
from verl_cluster.lifecycle.up import up


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def cfg(tmp_path, security: str, head: str = "localhost") -> str:
    p = tmp_path / "c.yaml"
    p.write_text(f"cluster_name: sec{tmp_path.name[-6:].replace('_', '').replace('-', '')}\n"
                 f"head: {{host: {head}, gcs_port: 26379}}\n"
                 + ("" if head == "localhost" else "ssh: {connect_timeout_s: 1}\n") + f"security: {security}\n")
    return str(p)


def run(capsys, *argv):
    """(exit code, stdout, stderr after the 'cluster: NAME (file)' line every command starts with)."""
    rc = main(list(argv))
    cap = capsys.readouterr()
    err = cap.err.split("\n", 1)[1] if cap.err.startswith("cluster: ") else cap.err
    return rc, cap.out, err


def test_up_warns_loudly_when_auth_is_off(tmp_path, capsys):
    rc, out, err = run(capsys, "up", "-c", cfg(tmp_path, "{auth: none}"), "--dry-run")
    assert rc == 0 and err.startswith("WARNING: security.auth is none") and "WITHOUT authentication" in err
    assert "RAY_AUTH_MODE=disabled" in out
    rc, out, err = run(capsys, "up", "-c", cfg(tmp_path, "{auth: token}"), "--dry-run")
    assert rc == 0 and "WARNING" not in err


def test_status_warns_when_auth_is_off(tmp_path, capsys):
    rc, out, err = run(capsys, "status", "-c", cfg(tmp_path, "{auth: none}"), "--json")
    assert "WARNING: security.auth is none" in err
    assert any("WITHOUT authentication" in p for p in json.loads(out)["problems"])


def test_open_dashboard_without_auth_needs_an_acknowledgement(tmp_path, capsys):
    open_ = "{auth: none, dashboard_host: all}"
    rc, out, err = run(capsys, "up", "-c", cfg(tmp_path, open_), "--dry-run")
    assert rc == 2 and out == "" and "security.allow_open_dashboard: true" in err and "ShadowRay" in err
    # the library refuses too, before it reaches any node (this head does not exist)
    with pytest.raises(ConfigError, match="dashboard_host all with security.auth none"):
        up(load_cluster(cfg(tmp_path, open_, head="10.255.255.1")))
    rc, out, err = run(capsys, "up", "-c", cfg(tmp_path, "{auth: none, dashboard_host: all, "
                                                         "allow_open_dashboard: true}"), "--dry-run")
    assert rc == 0 and "--dashboard-host 0.0.0.0" in out and err.count("WARNING") == 2
    rc, out, err = run(capsys, "up", "-c", cfg(tmp_path, "{dashboard_host: all}"), "--dry-run")
    assert rc == 0 and "0.0.0.0:8265" in err and "Keep token auth on" in err
