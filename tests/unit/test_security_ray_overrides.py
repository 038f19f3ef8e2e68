"""Configuration that would undo security.* behind its back is refused at load (Ray's auth variables in an env, the
flags the config owns in ray.start_args); paths fill {cluster_name} literally; `dashboard` quotes the token path."""

import argparse
import shlex
import time

import pytest

from verl_cluster.cli import main
from verl_cluster.cli.dashboard_cmd import _describe
from verl_cluster.config.cluster import load_cluster


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def write(tmp_path, body: str) -> str:
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: c\nhead: {host: 10.9.0.1}\nworkers: [{host: 10.9.0.2}]\n" + body)
    return str(p)


def up_dry_run(capsys, path: str, *overrides: str):
    rc = main(["up", path, *overrides, "--dry-run"])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("body,where", [
    ("ray: {env: {RAY_AUTH_MODE: disabled}}\n", "ray.env"),
    ("ray: {env: {RAY_AUTH_TOKEN_PATH: /tmp/t}}\n", "ray.env"),
    ("head: {host: 10.9.0.1, env: {RAY_AUTH_MODE: disabled}}\n", "head `10.9.0.1` env"),
    ("workers: [{host: 10.9.0.2, env: {RAY_AUTH_TOKEN: x}}]\n", "worker `10.9.0.2` env"),
])
def test_ray_auth_variables_in_an_env_are_refused(tmp_path, capsys, body, where):
    p = tmp_path / "c.yaml"
    base = "cluster_name: c\n" + ("" if body.startswith("head") else "head: {host: 10.9.0.1}\n")
    p.write_text(base + ("" if body.startswith("workers") else "workers: [{host: 10.9.0.2}]\n") + body)
    rc, out, err = up_dry_run(capsys, str(p))
    key = body.split("{")[-1].split(":")[0]
    assert rc == 2 and out == "", err
    assert f"{p}: {where} sets {key}" in err and "security.auth" in err
    assert err.count("\n") == 2  # one line and its hint


@pytest.mark.parametrize("args,flag,setting", [
    ("[--dashboard-host, 0.0.0.0]", "--dashboard-host", "security.dashboard_host"),
    ("[--dashboard-host=0.0.0.0]", "--dashboard-host", "security.dashboard_host"),
    ("[--ray-client-server-port, '10002']", "--ray-client-server-port", "head.ray_client_port"),
    ("[--ray-client-server-port=10002]", "--ray-client-server-port", "head.ray_client_port"),
    ("[--temp-dir, /tmp/shared]", "--temp-dir", "ray.temp_dir"),
    ("['--temp-dir=/tmp/shared']", "--temp-dir", "ray.temp_dir"),
    ("[--num-gpus, '1', --node-ip-address, 10.0.0.9]", "--node-ip-address", "node_ip"),
    ("['--node-ip-address=10.0.0.9']", "--node-ip-address", "node_ip"),
    ("['--dashboard-host 0.0.0.0']", "--dashboard-host", "security.dashboard_host"),
])
def test_flags_the_config_owns_are_refused_in_start_args(tmp_path, capsys, args, flag, setting):
    path = write(tmp_path, f"ray: {{start_args: {args}}}\n")
    rc, out, err = up_dry_run(capsys, path)
    assert rc == 2 and out == ""
    assert f"{path}: ray.start_args holds {flag}" in err and f"set {setting}" in err
    # the same through a command-line override
    rc, out, err = up_dry_run(capsys, write(tmp_path, ""), f"ray.start_args={args}")
    assert rc == 2 and f"ray.start_args holds {flag}" in err


def test_the_audit_case_and_allowed_args(tmp_path, capsys):
    """The audit's bypass: auth disabled through ray.env and an open dashboard through start_args, silently."""
    rc, _, err = up_dry_run(capsys, write(tmp_path, "ray:\n  env: {RAY_AUTH_MODE: disabled}\n"
                                                    "  start_args: [--dashboard-host, 0.0.0.0]\n"))
    assert rc == 2 and "RAY_AUTH_MODE" in err
    rc, out, err = up_dry_run(capsys, write(tmp_path, "ray:\n  env: {RAY_DEDUP_LOGS: '0'}\n"
                                                      "  start_args: [--system-config, '{}', --dashboard-port-x]\n"))
    assert rc == 0 and "--system-config" in out and "RAY_DEDUP_LOGS=0" in out


def test_paths_fill_cluster_name_literally(tmp_path):
    spec = load_cluster(write(tmp_path, "ray: {temp_dir: '/tmp/{0}/{cluster_name}'}\n"
                                        "security: {token_file: '~/t/{0}-{cluster_name}'}\n"))
    assert spec.temp_dir == "/tmp/{0}/c"
    assert str(spec.token_file) == f"{tmp_path}/t/{{0}}-c"
    t0 = time.monotonic()
    spec = load_cluster(write(tmp_path, "ray: {temp_dir: '/tmp/v/{cluster_name:>999999999}'}\n"
                                        "security: {token_file: '/t/{cluster_name:>999999999}'}\n"))
    assert spec.temp_dir == "/tmp/v/{cluster_name:>999999999}" and spec.token_file.name == "{cluster_name:>999999999}"
    assert time.monotonic() - t0 < 1.0


def test_dashboard_quotes_the_token_path_it_prints(tmp_path, capsys):
    crafted = "/t/a b$(touch /tmp/PWNED)`id`'q/tok"  # short: the line stays within the console's width
    spec = load_cluster(write(tmp_path, f"security: {{token_file: \"{crafted}\"}}\n"))

    class Link:
        url, where, tunnel = "http://127.0.0.1:5000", "ssh tunnel", None

    args = argparse.Namespace(json=False, show_token=False)
    _describe(args, spec, Link(), "2.60.0", True, {"Authorization": "Bearer t"})
    out = capsys.readouterr().out
    api = next(line for line in out.splitlines() if line.startswith("API: curl"))
    inner = api.split("$(cat ", 1)[1].rsplit(")", 1)[0]
    assert shlex.split(inner) == [crafted]  # one shell word: pasted, it runs nothing
    cat = out.split("(`cat ", 1)[1].split("`); ", 1)[0]
    assert shlex.split(cat) == [crafted]
