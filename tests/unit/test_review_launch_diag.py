"""Review fixes in launch/ and diagnostics/: each test names the defect it pins."""

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.config.job import JobSpec
from verl_cluster.errors import RunnerError
from verl_cluster.submit import preflight
from verl_cluster.submit.pipeline import preflight_exit_code

PPO = JobSpec(name="t", entrypoint="verl.trainer.main_ppo")


def _two_nodes(tmp_path):
    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: r1\nhead: {host: 10.0.0.1}\nworkers: [{host: 10.0.0.2}]\n")
    return load_cluster(c)


def test_unreachable_node_in_preflight_is_a_cluster_problem_not_bad_input(tmp_path, monkeypatch):
    """A node the file probe cannot reach is the cluster's problem (exit 1), and the files/model were not
    checked there, so no 'on every node' line may claim they were."""
    spec = _two_nodes(tmp_path)
    good = {"data": [{"path": "/d/t.parquet", "exists": True, "size": 1, "parquet": True,
                      "schema": {"prompt": {"kind": "list", "item": {"kind": "struct", "fields": {
                          "role": {"kind": "string"}, "content": {"kind": "string"}}}},
                          "data_source": {"kind": "string"},
                          "reward_model": {"kind": "struct", "fields": {"ground_truth": {"kind": "string"}}}}}],
            "model": {"path": "/m", "kind": "dir", "config": True, "tokenizer": ["tokenizer.json"]}}
    monkeypatch.setattr(preflight, "probe_node_files", lambda spec, files, model, **kw: {
        "10.0.0.1": good, "10.0.0.2": RunnerError("10.0.0.2", "SSH connection refused")})
    found = preflight.check_files(spec, PPO, {"data.train_files": "/d/t.parquet", "actor_rollout_ref.model.path": "/m"})
    report = preflight.PreflightReport(found)
    assert [f.message for f in report.errors] == ["10.0.0.2: cannot check files there: SSH connection refused"]
    assert not [f for f in found if f.level == "ok"], found  # nothing was checked on 10.0.0.2
    assert preflight_exit_code(report) == 1


class _FakeRunner:
    def __init__(self, host):
        self.host, self.closed = host, False

    def run(self, argv, *, env=None, timeout=60.0, stdin=None):
        raise RunnerError(self.host, "SSH connection refused")

    def close(self):
        self.closed = True


def test_gather_facts_closes_the_runners_it_opened(tmp_path, monkeypatch):
    """gather_facts(spec) without runners (env_cache.backend_env, cluster_facts.gather_node_facts) closes the SSH
    connection it opened to each node; runners passed in stay the caller's to close."""
    from verl_cluster.diagnostics import gather

    spec = _two_nodes(tmp_path)
    made = {}

    def make(spec):
        made.update({n.host: _FakeRunner(n.host) for _, n in spec.nodes()})
        return dict(made)

    monkeypatch.setattr(gather, "make_runners", make)
    got = gather.gather_facts(spec)
    assert all(isinstance(v, RunnerError) for v in got.values())
    assert made and all(r.closed for r in made.values())
    mine = {n.host: _FakeRunner(n.host) for _, n in spec.nodes()}
    gather.gather_facts(spec, mine)
    assert not any(r.closed for r in mine.values())


def test_consistency_flags_ray_or_verl_missing_on_one_node():
    """check's drift test ignored a node without Ray (or verl) at all: `a=2.60.0, b=missing` was never
    reported, so `check` said OK for a worker that `up` cannot start."""
    from dataclasses import replace

    from verl_cluster.diagnostics.verdicts import ERROR, consistency_verdicts
    from verl_cluster.facts.model import NodeFacts

    a = NodeFacts(host="a", python_version="3.11.7", versions={"ray": "2.60.0", "verl": "0.9.1"})
    b = replace(a, host="b", versions={"verl": "0.9.1"})
    ps = [p for p in consistency_verdicts({"a": a, "b": b}) if p.severity == ERROR]
    assert [p.what for p in ps] == ["ray differs between nodes: a=2.60.0, b=missing"]
    # a package that is there but fails to import is node_verdicts' finding; an interrupted probe knows nothing
    broken = replace(a, host="b", versions={"verl": "0.9.1"}, import_errors={"ray": "ImportError: x"})
    assert consistency_verdicts({"a": a, "b": broken}) == []
    partial = replace(a, host="b", versions={}, import_errors={"import": "importing ray took over 60s"})
    assert consistency_verdicts({"a": a, "b": partial}) == []


def test_torchrun_nproc_defaults_to_the_nodes_gpu_count(tmp_path, monkeypatch):
    """`torchrun.nproc_per_node: null  # default: the nodes' GPU count` - but a torchrun submit never had a
    status to read GPU counts from, so a cluster file without `gpus:` ran one process per 8-GPU node."""
    from verl_cluster.config.job import load_job
    from verl_cluster.diagnostics import gather
    from verl_cluster.facts.model import GpuInfo, NodeFacts
    from verl_cluster.submit import pipeline as submit
    from verl_cluster.submit.integrations import BackendEnv

    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: r2\nhead: {host: 10.0.0.1}\nworkers: [{host: 10.0.0.2}]\n")
    j = tmp_path / "j.yaml"
    j.write_text("name: t\ncommand: [python, train.py]\nlauncher: torchrun\n")
    job = load_job(j)
    monkeypatch.setattr(submit, "cached_backend_env", lambda spec, refresh=False: BackendEnv({}, "none"))
    eight = [GpuInfo(i, "H100", 81559) for i in range(8)]
    monkeypatch.setattr(gather, "gather_facts", lambda spec, *a, **k: {
        "10.0.0.1": NodeFacts(host="10.0.0.1", gpus=eight), "10.0.0.2": NodeFacts(host="10.0.0.2", gpus=eight)})
    sub = submit.plan_submission(job, str(c), run_checks=False)
    assert sub.launcher == "torchrun" and sub.request.nproc_per_node == 8
    # the job's own nproc_per_node, or the config's head gpus, still win without probing
    monkeypatch.setattr(gather, "gather_facts", lambda *a, **k: (_ for _ in ()).throw(AssertionError("probed")))
    c.write_text("cluster_name: r2\nhead: {host: 10.0.0.1, gpus: 4}\nworkers: [{host: 10.0.0.2, gpus: 4}]\n")
    assert submit.plan_submission(job, str(c), run_checks=False).request.nproc_per_node == 4


def test_torchrun_ctrl_c_does_not_blame_another_node(monkeypatch):
    """On Ctrl-C every node was marked '(stopped by verl-cluster after another node failed)': no node failed."""
    import io
    import threading
    import types

    from verl_cluster.jobs import torchrun
    from verl_cluster.jobs.request import NodeLaunch, TorchrunRequest
    from verl_cluster.runners import LocalRunner

    class InterruptingEvent(threading.Event):
        def wait(self, timeout=None):
            if threading.current_thread() is threading.main_thread():
                super().wait(0.3)  # let both nodes start
                raise KeyboardInterrupt
            return super().wait(timeout)

    monkeypatch.setattr(torchrun, "threading", types.SimpleNamespace(
        Event=InterruptingEvent, Thread=threading.Thread, Lock=threading.Lock))
    runners = {"a": LocalRunner("a"), "b": LocalRunner("b")}
    req = TorchrunRequest("r", "127.0.0.1", 29500, 1,
                          [NodeLaunch(h, i, ["sleep", "30"], {}) for i, h in enumerate(runners)])
    res = torchrun._run(runners, req, io.StringIO(), 15.0, None)
    assert res.interrupted and [n.state for n in res.nodes] == ["stopped", "stopped"]
    tails = [line for n in res.nodes for line in n.tail]
    assert not any("another node failed" in line for line in tails), tails
    assert all(any("interrupted" in line for line in n.tail) for n in res.nodes)


def test_check_rejects_a_non_positive_connect_timeout(tmp_path, monkeypatch, capsys):
    """`check --connect-timeout 0` ran, and every TCP connect failed at once (a non-blocking socket), so every
    port was reported blocked with a firewall fix: bad input must be refused (exit 2) before anything runs."""
    from verl_cluster.cli import main
    from verl_cluster.diagnostics import check

    monkeypatch.setattr(check, "run_check", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    c = tmp_path / "c.yaml"
    c.write_text("cluster_name: r3\nhead: {host: localhost}\n")
    for bad in ("0", "-1", "nan"):
        assert main(["check", str(c), "--connect-timeout", bad]) == 2
        assert "--connect-timeout" in capsys.readouterr().err


def test_follow_turns_a_refused_log_stream_into_one_line():
    """`logs ID --follow` for a job Ray keeps no log of (a driver job listed by `jobs`: its log websocket answered
    'Can only get logs of submission type jobs', HTTP 400, and that was an internal error): one line saying why."""
    import io
    import types

    import pytest

    from verl_cluster.errors import ClusterError
    from verl_cluster.verl_logs import job_log
    from verl_cluster.jobs import ray_jobs

    class Client:
        def get_job_info(self, job_id):
            return types.SimpleNamespace(submission_id=None, job_id=job_id, status="SUCCEEDED", entrypoint="",
                                         start_time=None, end_time=None, message="", metadata={})

    api = ray_jobs.JobsApi(Client(), "http://127.0.0.1:8265")
    with pytest.raises(ClusterError) as e:
        job_log.follow(api, "02000000", out=io.StringIO(), status_out=io.StringIO())
    assert "02000000 was not submitted through the Jobs API" in e.value.message and e.value.hint


def test_jobs_client_times_out_on_a_dashboard_that_never_answers(monkeypatch):
    """Ray's JobSubmissionClient sends requests without a timeout; ours always has one."""
    import socket
    import threading
    import time

    from verl_cluster.jobs import ray_jobs

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    stop = threading.Event()

    def accept_and_say_nothing():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept_and_say_nothing, daemon=True).start()
    monkeypatch.setattr(ray_jobs, "REQUEST_TIMEOUT_S", 1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(ray_jobs._api_errors()):
            ray_jobs.client_class()(f"http://127.0.0.1:{server.getsockname()[1]}")
        assert time.monotonic() - t0 < 15
    finally:
        stop.set()
        for c in held:
            c.close()
        server.close()
