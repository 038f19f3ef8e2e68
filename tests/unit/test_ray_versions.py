"""Which Ray versions work here and together: the supported range, drift between nodes, this machine vs the head."""

from pathlib import Path

from verl_cluster.diagnostics import ray_versions as rv
from verl_cluster.diagnostics.verdicts import ERROR, WARNING

ROOT = Path(__file__).resolve().parents[2]


def test_parse_and_range():
    assert rv.parse("2.52.1") == (2, 52, 1)
    assert rv.parse("2.60.0rc1") == (2, 60, 0)
    assert rv.parse("2.61.0.dev0") == (2, 61, 0)
    assert rv.parse("missing") is None and rv.parse(None) is None
    assert [rv.supported(v) for v in ("2.51.2", "2.53.0", "2.54.0", "2.60.0", "2.61.0", None)] == [
        False, False, True, True, False, None]
    assert not rv.has_token_auth("2.51.2") and rv.has_token_auth("2.52.0") and rv.has_token_auth(None)
    # 2.52 and 2.53 have token auth, but their dashboard agent takes jobs without it (tried: docs/security.md)
    assert [rv.agent_checks_token(v) for v in ("2.52.1", "2.53.0", "2.54.0", "2.60.0", None)] == [
        False, False, True, True, True]


def test_the_pin_in_pyproject_is_the_supported_range():
    assert f'"{rv.PIN}"' in (ROOT / "pyproject.toml").read_text()
    # the oldest-Ray test venv (scripts/setup.sh --test) is the floor's minor
    [pin] = [ln for ln in (ROOT / ".ci/requirements-ray-oldest.txt").read_text().splitlines() if ln.startswith("ray")]
    assert rv.parse(pin.split("==")[1])[:2] == rv.OLDEST


def test_drift_names_every_node_and_the_version_to_install():
    [p] = rv.drift({"a": "2.60.0", "b": "2.54.1", "c": "2.60.0"})
    assert p.severity == ERROR and p.node == "cluster"
    assert p.what == "ray differs between nodes: a=2.60.0, b=2.54.1, c=2.60.0"
    assert "pip install 'ray[default]==2.60.0'" in p.fix and "2.54 to 2.60" in p.fix
    assert rv.drift({"a": "2.60.0", "b": "2.60.0"}) == []
    # a version outside the range is never the one suggested
    [p] = rv.drift({"a": "2.49.0", "b": "2.54.1"})
    assert "==2.54.1'" in p.fix
    [p] = rv.drift({"a": "2.53.0", "b": "2.54.1"})
    assert "==2.54.1'" in p.fix
    [p] = rv.drift({"a": "2.52.1", "b": "2.53.0"})
    assert "==2.60.0'" in p.fix


def test_a_node_without_token_auth_is_an_error_only_with_token_auth_on():
    [p] = rv.range_verdicts({"old": "2.51.2", "ok": "2.54.0"}, token_auth=True)
    assert p.node == "old" and p.severity == ERROR and "no token auth" in p.what and "security.auth: none" in p.fix
    [p] = rv.range_verdicts({"old": "2.51.2"}, token_auth=False)
    assert p.severity == WARNING and "older than verl-cluster supports" in p.what
    [p] = rv.range_verdicts({"new": "2.61.0"}, token_auth=True)
    assert p.severity == WARNING and "newer than verl-cluster was tested" in p.what


def test_a_node_whose_agent_takes_jobs_without_the_token_is_refused_with_token_auth_on():
    """Ray 2.52 and 2.53 start with token auth, but their dashboard agent runs a job POSTed without the token."""
    [p] = rv.range_verdicts({"open": "2.53.0", "ok": "2.54.0"}, token_auth=True)
    assert (p.node, p.severity) == ("open", ERROR)
    assert p.what.startswith("Ray 2.53.0 is older than verl-cluster supports (2.54 to 2.60): its dashboard agent runs "
                             "jobs sent to its HTTP port (ray.ports.dashboard_agent_listen) without the token")
    assert p.fix == "pip install 'ray[default]>=2.54,<2.61' there"
    [p] = rv.range_verdicts({"open": "2.52.1"}, token_auth=False)  # nothing checks a token anyway: only the range
    assert p.severity == WARNING and p.what == "Ray 2.52.1 is older than verl-cluster supports (2.54 to 2.60)"
    why = rv.start_refusal("2.53.0", None, True)
    assert why.startswith("Ray 2.53.0 there is older than verl-cluster supports (2.54 to 2.60)")
    assert "without the token" in why and why.endswith("fix: pip install 'ray[default]>=2.54,<2.61' in that node's "
                                                       "environment")
    assert rv.start_refusal("2.52.1", "2.52.1", True).startswith("Ray 2.52.1 there is older")  # before the head check
    assert rv.start_refusal("2.53.0", None, False) is None
    assert rv.start_refusal("2.54.0", None, True) is None


def test_this_machine_against_the_head():
    assert rv.client_verdicts("2.60.0", "2.60.0") == []
    assert rv.client_verdicts(None, "2.60.0") == []
    [p] = rv.client_verdicts("2.54.1", "2.60.0")
    assert p.severity == WARNING and p.node == "this machine"
    assert "2.60.0 differs from the cluster's 2.54.1: supported" in p.what and "nothing to do" in p.fix
    [p] = rv.client_verdicts("2.53.0", "2.60.0")
    assert "untested" in p.what and f"pip install '{rv.PIN}' here and on every node" in p.fix
    [p] = rv.client_verdicts("2.60.0", "2.49.0")
    assert "untested" in p.what and "pip install 'ray[default]==2.60.0' here" in p.fix
    # ray_verdicts takes the head's version by host
    ps = rv.ray_verdicts({"h": "2.54.1", "w": "2.54.1"}, "h", "2.60.0", True)
    assert [p.node for p in ps] == ["this machine"]


def test_up_refuses_a_node_that_cannot_join():
    assert rv.start_refusal("2.60.0", None, True) is None
    assert rv.start_refusal("2.60.0", "2.60.0", True) is None
    why = rv.start_refusal("2.51.2", None, True)
    assert "no token auth" in why and "fix: pip install 'ray[default]>=2.54,<2.61'" in why
    assert rv.start_refusal("2.51.2", None, False) is None
    why = rv.start_refusal("2.54.1", "2.60.0", True)
    assert why.startswith("Ray 2.54.1 there, 2.60.0 on the head") and "==2.60.0'" in why
    assert rv.start_refusal(None, "2.60.0", True) is None  # unknown: `ray start` speaks for itself


def test_doctor_says_when_this_machines_ray_is_outside_the_range():
    from verl_cluster.diagnostics.doctor import diagnose
    from verl_cluster.facts.model import NodeFacts

    whats = [p.what for p in diagnose(NodeFacts(host="me", versions={"ray": "2.51.2"})).problems]
    assert any("Ray 2.51.2 has no token auth" in w for w in whats)
    whats = [p.what for p in diagnose(NodeFacts(host="me", versions={"ray": "2.54.0"})).problems]
    assert not any("Ray 2.54.0" in w for w in whats)
    [p] = [p for p in diagnose(NodeFacts(host="me", versions={"ray": "2.53.0"})).problems if "Ray 2.53.0" in p.what]
    assert p.severity == ERROR and "dashboard_agent_listen" in p.what and rv.PIN in p.fix


def test_up_refuses_nodes_whose_agent_takes_jobs_without_the_token(tmp_path, monkeypatch):
    """`up`'s own step, before any `ray start`: with token auth on, a 2.53 node is failed with the fix."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.nodes.agent import Probe
    from verl_cluster.lifecycle.up import NodeAction, _Up

    monkeypatch.setenv("HOME", str(tmp_path))  # the token file `up` makes lands here
    for auth, refused in (("token", True), ("none", False)):
        cfg = tmp_path / f"{auth}.yaml"
        cfg.write_text("cluster_name: c\nhead: {host: 10.9.0.1}\nworkers: [{host: 10.9.0.2}]\n"
                       f"security: {{auth: {auth}}}\n")
        run = _Up(load_cluster(cfg), False, None, None)
        run.probes = {h: Probe(h, "/home/u", "/usr/bin/python3", "2.53.0") for h in ("10.9.0.1", "10.9.0.2")}
        run.refuse_incompatible()
        for h in ("10.9.0.1", "10.9.0.2"):
            o = run.out[h]
            if refused:
                assert o.action == NodeAction.FAILED and h not in run.probes
                assert o.reason.startswith("Ray 2.53.0 there is older than verl-cluster supports (2.54 to 2.60)")
                assert "pip install 'ray[default]>=2.54,<2.61'" in o.reason
            else:
                assert o.action != NodeAction.FAILED and h in run.probes
