"""Hostile config input: names that reach a shell or ssh, environment keys, YAML bombs and oversize files."""

import time

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import load_job
from verl_cluster.config.loader import MAX_BYTES, MAX_SCALAR, parse_yaml_text
from verl_cluster.config.names import host_problem, user_problem
from verl_cluster.errors import ConfigError
from verl_cluster.runners.ssh import SshRunner


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def cluster(tmp_path, body: str, overrides=None):
    p = tmp_path / "c.yaml"
    p.write_text("cluster_name: c\n" + body)
    return load_cluster(p, overrides)


def refused(fn, *args, match: str, **kw) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kw)
    assert "\n" not in e.value.message
    assert match in e.value.message, e.value.message
    return e.value.message


@pytest.mark.parametrize("host", ["x:22 -oProxyCommand=touch${IFS}/tmp/PWNED;#", "10.0.0.2; touch /tmp/x",
                                  "-oProxyCommand=x", "a b", "host\nnext", "[::1]", "10.0.0.2:22", "", "a..b",
                                  "$(id)", "1.2.3.999"])
def test_bad_hosts_are_refused_at_load_with_the_line(tmp_path, host):
    msg = refused(cluster, tmp_path, f"head:\n  host: {host!r}\n".replace("'", '"', 0), match="c.yaml:3")
    assert "host" in msg


@pytest.mark.parametrize("host", ["localhost", "gpu-1", "gpu-1.example.org", "10.0.0.2", "::1", "fe80::1%eth0",
                                  "node_7", "a.b.c."])
def test_good_hosts_pass(host):
    assert host_problem(host) is None


@pytest.mark.parametrize("user", ["root -oProxyCommand=x", "-x", "a;b", "a b", "é", "x" * 40])
def test_bad_users_are_refused(tmp_path, user):
    assert user_problem(user)
    refused(cluster, tmp_path, f"head: {{host: localhost}}\nssh: {{user: '{user}'}}\n", match="c.yaml:3")


def test_executables_and_paths(tmp_path):
    refused(cluster, tmp_path, "head: {host: localhost}\nray: {ray_executable: '/v/bin/ray; touch x'}\n",
            match="not a program path")
    refused(cluster, tmp_path, 'head: {host: localhost}\nsecurity: {token_file: "/tmp/a\\nb"}\n',
            match="control character")
    refused(cluster, tmp_path, 'head: {host: localhost, ssh_key_file: "/k\\x1b[2J"}\n', match="control character")
    assert cluster(tmp_path, "head: {host: localhost}\nray: {ray_executable: /opt/my env/bin/ray}\n")


def test_env_keys_must_be_names_in_files_and_overrides(tmp_path):
    refused(cluster, tmp_path, "head:\n  host: localhost\n  env: {'-S': x}\n", match="c.yaml:4")
    refused(cluster, tmp_path, "head: {host: localhost}\nray:\n  env:\n    'X=1; touch /tmp/P; Y': v\n",
            match="c.yaml:5")
    refused(cluster, tmp_path, "head: {host: localhost}\n", ["ray.env.-S=1"], match="not an environment variable")
    job = tmp_path / "j.yaml"
    job.write_text("name: j\ncommand: [echo]\nlauncher: torchrun\nenv:\n  'X=1; touch /tmp/PWNED; Y': v\n")
    refused(load_job, job, match="j.yaml:5")
    job.write_text("name: j\ncommand: [echo]\n")
    refused(load_job, job, ["env.A;B=1"], match="not an environment variable")
    job.write_text("name: j\ncommand: [echo]\nsecrets: ['HF TOKEN']\n")
    refused(load_job, job, match="j.yaml:3")
    job.write_text("name: j\ncommand: [echo]\nruntime_env: {env_vars: {'-S': x}}\n")
    refused(load_job, job, match="j.yaml:3")


def test_ssh_boundary_refuses_bad_env_names_and_hosts():
    """The runner checks again: a library caller never reaches `env` or `export` with a hostile name."""
    with pytest.raises(ConfigError):
        SshRunner.command_line(["true"], {"-S": "x"})
    with pytest.raises(ConfigError):
        SshRunner.command_line(["true"], {"X=1; touch /tmp/P; Y": "v"})
    from verl_cluster.runners.ssh import SshTarget, _resolve

    with pytest.raises(ConfigError, match="not a host name"):
        _resolve(SshTarget("x -oProxyCommand=touch${IFS}/tmp/P"))


def _fast(fn, *args, limit=2.0):
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        fn(*args)
    assert time.monotonic() - t0 < limit
    return e.value.message


def test_yaml_bombs_and_oversize_input_are_refused_fast():
    laughs = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(9))
    assert "expands to more than" in _fast(parse_yaml_text, laughs, "bomb.yaml")
    assert "recursive" in _fast(parse_yaml_text, "h: &h\n  a: 1\n  <<: *h\n", "m.yaml")
    assert "recursive" in _fast(parse_yaml_text, "h: &h [1, *h]\n", "r.yaml")
    assert "nest" in _fast(parse_yaml_text, "x: " + "[" * 5000 + "]" * 5000, "d.yaml")
    assert "expands to more than" in _fast(parse_yaml_text, "x: [" + ",".join(["1"] * 150_000) + "]", "f.yaml")
    msg = _fast(parse_yaml_text, "x: " + "a" * (MAX_SCALAR + 1), "s.yaml")
    assert "characters" in msg and len(msg) < 300
    assert "larger than" in _fast(parse_yaml_text, "x: 1\n" * (MAX_BYTES // 5 + 1), "big.yaml")


def test_oversize_file_is_not_read_whole(tmp_path):
    p = tmp_path / "c.yaml"
    with open(p, "w") as f:
        f.write("cluster_name: c\nhead: {host: localhost}\nx: ")
        f.seek(50 * MAX_BYTES)  # sparse: 50 MiB on paper
        f.write("y\n")
    assert "larger than" in _fast(load_cluster, p)


def test_duplicate_keys_name_both_lines(tmp_path):
    msg = refused(cluster, tmp_path, "head: {host: localhost}\nray:\n  temp_dir: /tmp/a\n  temp_dir: /tmp/b\n",
                  match="c.yaml:5")
    assert "line 4 and line 5" in msg
    refused(cluster, tmp_path, "head: {host: localhost, host: 10.0.0.1}\n", match="set twice")


def test_long_values_are_cut_in_messages(tmp_path):
    msg = refused(cluster, tmp_path, f"head: {{host: localhost}}\nnetwork: {{backend: {'u' * 60000}}}\n",
                  match="must be one of")
    assert len(msg) < 400
    msg = refused(cluster, tmp_path, f"head: {{host: localhost}}\n? {'k' * 1000}\n: 1\n", match="unknown key")
    assert len(msg) < 400
    refused(cluster, tmp_path, f"head: {{host: localhost}}\n? {'k' * 60000}\n: 1\n", match="a key of 60000")


def test_plan_facts_file_is_bounded_too(tmp_path, capsys):
    from verl_cluster.cli import main

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    deep, big = tmp_path / "deep.json", tmp_path / "big.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    big.write_text("[" + " " * (MAX_BYTES + 10) + "]")
    for facts, why in ((deep, "nested too deep"), (big, "larger than")):
        t0 = time.monotonic()
        assert main(["plan", str(root / "launch/gsm8k.yaml"), "--facts", str(facts)]) == 2
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err and time.monotonic() - t0 < 2
