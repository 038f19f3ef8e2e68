"""cluster.yaml parsing: valid files, every bad-input path, and fuzzed YAML (never a traceback)."""

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", ["local.yaml", "two-nodes-ssh.yaml", "reference.yaml"])
def test_shipped_configs_parse(name):
    spec = load_cluster(ROOT / "cluster_configs" / name)
    assert spec.cluster_name
    assert spec.nodes()[0][0] == "head"


def test_local_defaults():
    spec = load_cluster(ROOT / "cluster_configs/local.yaml")
    assert spec.head.is_local and spec.workers == []
    assert spec.head_ip == "127.0.0.1"
    assert spec.gcs_address == "127.0.0.1:6379"
    assert spec.security.auth == "token" and spec.dashboard_bind_host() == "127.0.0.1"
    assert spec.temp_dir == f"/tmp/vc-{os.getuid()}/local"  # per user: its parent is made 0700 on each node
    assert spec.token_file.name == "auth_token" and "local" in str(spec.token_file)


def test_full_values_and_types(tmp_path):
    p = write(tmp_path, """
cluster_name: c1
head: {host: 10.1.0.1, gcs_port: 7000, gpus: 2}
workers:
  - {host: 10.1.0.2, ssh_port: 2222, resources: {nvme: 1}, labels: {rack: a}}
ssh: {user: bob, connect_timeout_s: 3}
ray: {object_store_memory: 209715200, start_args: [--foo], env: {A: 1}}
network: {backend: tcp, interface: eth1}
security: {dashboard_host: private}
""")
    spec = load_cluster(p)
    assert spec.head.gcs_port == 7000 and spec.head.gpus == 2
    assert spec.workers[0].ssh_port == 2222 and spec.workers[0].resources == {"nvme": 1.0}
    assert spec.ssh.connect_timeout_s == 3.0 and isinstance(spec.ssh.connect_timeout_s, float)
    assert spec.ray.env == {"A": "1"}  # scalars become strings where strings are expected
    assert spec.dashboard_bind_host() == "10.1.0.1"
    with pytest.raises(Exception):
        spec.cluster_name = "x"  # frozen


def test_overrides(tmp_path):
    p = write(tmp_path, "cluster_name: c\nhead: {host: localhost}\n")
    spec = load_cluster(p, ["ray.object_store_memory=1000", "head.gcs_port=7001"])
    assert spec.ray.object_store_memory == 1000 and spec.head.gcs_port == 7001


@pytest.mark.parametrize("text, expect", [
    ("cluster_name: c\nhead: {host: localhost}\nwrokers: []\n", ["c.yaml:3", "wrokers", "did you mean `workers`"]),
    ("cluster_name: c\nhead:\n  host: localhost\n  gsc_port: 1\n", ["c.yaml:4", "head.gsc_port", "gcs_port"]),
    ("cluster_name: c\nhead: {host: localhost}\nray: {object_store_memory: lots}\n",
     ["ray.object_store_memory", "an integer", "lots"]),
    ("head: {host: localhost}\n", ["missing required field `cluster_name`"]),
    ("cluster_name: c\n", ["missing required field `head`"]),
    ("cluster_name: c\nhead: {}\n", ["head.host"]),
    ("cluster_name: c\nhead: {host: localhost}\nnetwork: {backend: ucz}\n", ["network.backend", "did you mean `ucx`"]),
    ("cluster_name: c\nhead: {host: localhost}\nworkers: {host: a}\n", ["workers", "a list"]),
    ("cluster_name: c\nhead: {host: localhost}\nworkers: [{host: a, gpus: two}]\n", ["workers[0].gpus", "c.yaml:3"]),
    ("cluster_name: c\nhead: [1, 2\n", ["invalid YAML", "c.yaml:"]),
    ("cluster_name: c\nhead:\n\thost: localhost\n", ["c.yaml:3", "invalid YAML", "tab at column 1", "spaces"]),
    ("- a\n- b\n", ["expected a mapping"]),
    ("cluster_name: 'bad name!'\nhead: {host: localhost}\n", ["cluster_name", "letters"]),
    ("cluster_name: c\nhead: {host: localhost}\nworkers: [{host: a}]\n", ["node_ip", "127.0.0.1"]),
    ("cluster_name: c\nhead: {host: 10.0.0.1}\nworkers: [{host: 10.0.0.1}]\n", ["same address"]),
    ("cluster_name: c\nhead: {host: localhost}\nray: {temp_dir: tmp/x}\n", ["absolute"]),
    ("cluster_name: c\nhead: {host: localhost}\nssh: {accept_new_host_keys: maybe}\n", ["true or false"]),
    ("cluster_name: c\nhead: {host: localhost}\nssh: {connect_timeout_s: 0}\n", ["ssh.connect_timeout_s", "above 0"]),
    ("cluster_name: c\nhead: {host: localhost}\nssh: {keepalive_s: -5}\n", ["ssh.keepalive_s", "at least 0"]),
])
def test_bad_input_names_field_and_line(tmp_path, text, expect):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load_cluster(p)
    msg = str(e.value) + " " + (e.value.hint or "")
    for part in expect:
        assert part in msg, (part, msg)
    assert "\n" not in str(e.value)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_cluster(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_cluster(tmp_path)


def test_bad_override():
    with pytest.raises(ConfigError, match="key=value"):
        load_cluster(ROOT / "cluster_configs/local.yaml", ["justakey"])


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    p = write(tmp_path, "cluster_name: c\nhead: {host: localhost}\nwrokers: []\n")
    assert main(["status", str(p)]) == 2
    errout = capsys.readouterr().err
    assert "Traceback" not in errout and "did you mean" in errout
    assert main(["up", str(tmp_path / "missing.yaml"), "--dry-run"]) == 2
    assert main(["up", "--no-such-flag"]) == 2


yaml_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                         st.text(max_size=12))
keys = st.sampled_from(["cluster_name", "head", "workers", "host", "ssh", "ray", "gpus", "port", "network",
                        "security", "auth", "x", "temp_dir", "ports", "env", "labels"])
trees = st.recursive(yaml_scalars, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                          st.dictionaries(keys, kids, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
def test_fuzzed_structures_never_traceback(tmp_path, tree):
    import yaml

    p = write(tmp_path, yaml.safe_dump(tree))
    try:
        load_cluster(p)
    except ConfigError as e:
        assert str(e)  # a message, not a crash


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.sampled_from(list("abc:-[]{}'\"\n #&*!|>%@`,?0123456789.")), max_size=80))
def test_fuzzed_text_never_traceback(tmp_path, text):
    p = write(tmp_path, text)
    try:
        load_cluster(p)
    except ConfigError as e:
        assert str(e)


@pytest.mark.parametrize("value", ["@run1", "{a", "[a,b", '"unterminated', "%x", "`cmd`"])
def test_an_override_yaml_cannot_read_is_its_plain_string(tmp_path, value):
    """A value YAML's scanner refuses (an `@`, an open bracket or quote) is the string the user wrote, in every
    command that takes overrides; never an internal error."""
    p = write(tmp_path, "cluster_name: c\nhead: {host: localhost}\n")
    spec = load_cluster(p, [f"ray.env.NAME={value}"])
    assert spec.ray.env == {"NAME": value}
    with pytest.raises(ConfigError, match="at most"):
        load_cluster(p, ["ray.env.NAME=[" + "a" * 2_000_000])


def test_a_pipe_or_fifo_as_a_file_is_refused_not_read(tmp_path):
    """A FIFO without a writer would hang a read: refused at once, saying what to do; a directory is named so."""
    import os

    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file") as e:
        load_cluster(fifo)
    assert "save it to a file" in e.value.hint
