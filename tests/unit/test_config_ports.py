"""Ports are judged when the cluster file loads (issue 32 item 4): a pinned port inside the worker range passed
`check` and ended in Ray's ValueError traceback at `up`."""

from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.config.cluster import load_cluster
from verl_cluster.errors import ConfigError

LOCAL = str(Path(__file__).resolve().parents[2] / "cluster_configs/local.yaml")


@pytest.mark.parametrize("over, names", [
    (["head.ray_client_port=10005"], ["head.ray_client_port", "10002-19999"]),
    (["head.dashboard_port=15000"], ["head.dashboard_port", "min_worker"]),
    (["ray.ports.node_manager=12000"], ["ray.ports.node_manager", "max_worker"]),
    (["ray.ports.min_worker=6000", "ray.ports.max_worker=7000"], ["ray.ports.node_manager 6700", "6000-7000"]),
    (["ray.ports.object_manager=6700"], ["ray.ports.object_manager", "ray.ports.node_manager", "6700"]),
    (["head.gcs_port=8265"], ["head.gcs_port", "head.dashboard_port", "8265"]),
    (["ray.ports.dashboard_metrics=6379"], ["ray.ports.dashboard_metrics", "head.gcs_port"]),
    (["ray.ports.min_worker=20000", "ray.ports.max_worker=19000"], ["min_worker (20000)", "max_worker (19000)"]),
    (["ray.ports.max_worker=70000"], ["ray.ports.max_worker is 70000"]),
    (["ssh.port=0"], ["ssh.port is 0"]),
    (["head.ray_client_port=65536"], ["head.ray_client_port is 65536"]),
])
def test_bad_ports_refused_at_load_naming_the_fields(over, names):
    with pytest.raises(ConfigError) as e:
        load_cluster(LOCAL, over)
    for n in names:
        assert n in e.value.message, (n, e.value.message)


def test_check_exits_2_with_one_line(capsys):
    assert main(["check", "-c", LOCAL, "head.ray_client_port=10005"]) == 2
    err = capsys.readouterr().err
    assert "head.ray_client_port 10005 is inside the worker port range" in err and "Traceback" not in err
    assert "hint: move head.ray_client_port outside 10002-19999" in err


def test_shipped_configs_and_moved_ports_load():
    load_cluster(LOCAL)
    load_cluster(LOCAL, ["head.ray_client_port=10101", "ray.ports.min_worker=20002", "ray.ports.max_worker=20999"])
    load_cluster(str(Path(LOCAL).with_name("reference.yaml")))
