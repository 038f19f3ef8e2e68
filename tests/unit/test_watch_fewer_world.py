"""Going on with fewer nodes when the job states its own world: a verl user line carries trainer.nnodes=2, and
the user's keys win over the planner's. Seen on real verl across two namespace hosts (docs/BENCHMARKS.md, "verl
across a node boundary"): the plan for the node left was refused ("the job pins trainer.nnodes=2 x
trainer.n_gpus_per_node=1, but only 1 node(s) ..."), so the run waited for a node that was gone for good."""

from dataclasses import replace
from pathlib import Path

from verl_cluster.config.cluster import load_cluster
from verl_cluster.submit import integrations
from verl_cluster.submit.integrations import PlanInfo
from verl_cluster.submit.job_input import JobInput
from verl_cluster.watch import runs
from verl_cluster.watch.events import Reporter
from verl_cluster.watch.settings import WatchSettings
from verl_cluster.watch.watcher import Watcher

ROOT = Path(__file__).resolve().parent.parent.parent
LINE = ["python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
        "trainer.default_local_dir=/shared/ckpt/run"]


def _two_nodes(tmp_path):
    path = tmp_path / "two.yaml"
    # loopback addresses: nothing here may connect anywhere else (the head's checkpoint look is recorded below)
    path.write_text("cluster_name: two\nhead:\n  host: 127.0.0.2\n  gpus: 1\nworkers:\n  - host: 127.0.0.3\n"
                    "    gpus: 1\n")
    return str(path), load_cluster(str(path))


def test_the_plan_for_the_nodes_left_carries_their_count(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    path, spec = _two_nodes(tmp_path)
    ji = JobInput.from_words(LINE[0], LINE[1:])
    st = runs.new_run("r", spec.cluster_name, path, ji)
    settings = WatchSettings(max_restarts=3, backoff_s=0, backoff_max_s=0, hang_after_s=60, allow_fewer_nodes=True,
                             node_wait_s=1, notify=())
    w = Watcher(st, spec, ji.job(), settings, Reporter(st.dir / "events.jsonl", say=lambda _: None))
    planned = []

    def plan(job, cluster, facts=None):  # the planner's verdict needs the nodes' facts: record what it is asked
        planned.append((job.get("trainer.nnodes"), 1 + len(cluster.workers)))
        return PlanInfo({"trainer.nnodes": 1 + len(cluster.workers)}, True, {}, "placement planned")

    monkeypatch.setattr(integrations, "placement_plan", plan)
    looked = []  # the head's look at the newest checkpoint (integration: test_watch.py, node-local checkpoints)
    monkeypatch.setattr("verl_cluster.watch.shared_dir.missing_ranks",
                        lambda spec, folder, gone: looked.append((folder, tuple(gone))) or "")
    monkeypatch.setattr(w, "_reshard_for", lambda world: (True, ""))
    fewer = replace(spec, workers=[])
    ok, _ = w._plan_fits(fewer)
    assert ok and planned == [(1, 1)]  # planned on one node as one node, not as the line's 2
    assert looked == [("/shared/ckpt/run", ("127.0.0.3",))]
    # and the resubmission sends the same world (resubmit's words), so verl asks for no placement group on the gone node
    st.nodes = 1
    assert "trainer.nnodes=1" in st.job_input(["trainer.nnodes=1"]).overrides
    # a job that leaves the world to the planner is planned as it is
    planned.clear()
    yaml_job = JobInput.from_words(str(ROOT / "launch" / "gsm8k_grpo.yaml"), [])
    w.job = yaml_job.job()
    w.st = runs.new_run("r2", spec.cluster_name, path, yaml_job)
    w._plan_fits(fewer)
    assert planned == [(None, 1)]
