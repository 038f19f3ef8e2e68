"""What verl did across a node boundary (tests/fixtures/multinode, recorded by scripts/gpu/gpu_multinode.py on 2x H200:
two namespace hosts, one GPU each, NCCL over sockets), held against the planner: host RAM of every node together
(the hosts share one machine, so verl's perf/cpu_memory_used_gb is all of them), and how the comparison is chosen."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from verl_cluster.submit.integrations import _with_machines
from verl_cluster.placement.check_run import pairs

ROOT = Path(__file__).resolve().parents[2]
REC = json.loads((ROOT / "tests" / "fixtures" / "multinode" / "h200x2_two_hosts.json").read_text())
# the user line the run submitted (scripts/gpu/gpu_multinode.py user_line), the model by its catalog shape
LINE = ["python3", "-m", "verl.trainer.main_ppo", "algorithm.adv_estimator=grpo", "data.train_batch_size=32",
        "data.max_prompt_length=512", "data.max_response_length=384", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B",
        "actor_rollout_ref.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.enforce_eager=true", "trainer.logger=[console]", "trainer.nnodes=2",
        "trainer.n_gpus_per_node=1", "trainer.total_training_steps=4", "trainer.save_freq=2"]


def _plan(tmp_path) -> dict:
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "plan", "--gpus", "2x1xH200", "--json",
                        "model.catalog=qwen2.5-0.5b", "--", *LINE], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_every_node_together_holds_the_machine_the_hosts_shared(tmp_path):
    plan = _plan(tmp_path)
    head, worker = plan["host_steady_gib_per_node"], plan["host_steady_gib_worker_node"]
    assert worker < head / 2  # the driver, TaskRunner and verl's agent/reward-loop actors run once per job
    assert plan["host_steady_gib_all_nodes"] == round(head + worker, 2)
    used = max(s["actor/perf/cpu_memory_used_gb"] for s in REC["s2"]["steps"])  # the whole machine, both hosts
    assert abs(plan["host_steady_gib_all_nodes"] / used - 1) <= 0.15, (plan["host_steady_gib_all_nodes"], used)
    # the per-node figure alone, as a run on one machine per node would be held against, is not this number
    assert abs(head / used - 1) > 0.15


def test_one_machine_for_several_nodes_is_held_against_all_of_them():
    predicted = {"host_gib": 26.6, "host_gib_all_nodes": 37.1, "nnodes": 2}
    facts = [SimpleNamespace(hostname="gpu-box"), SimpleNamespace(hostname="gpu-box")]
    rows = pairs(_with_machines(predicted, facts), {"host_gib": 37.67})
    assert [r["what"] for r in rows] == ["host RAM, all nodes on one machine (GiB)"] and rows[0]["predicted"] == 37.1
    apart = [SimpleNamespace(hostname="gpu-1"), SimpleNamespace(hostname="gpu-2")]
    rows = pairs(_with_machines(predicted, apart), {"host_gib": 30.0})
    assert [r["what"] for r in rows] == ["host RAM per node (GiB)"] and rows[0]["predicted"] == 26.6
    assert "shared_machine" not in _with_machines(predicted, [SimpleNamespace(hostname="gpu-box")])


def test_the_recorded_node_loss_waited_its_grace_before_deciding():
    """The events of the run whose worker host died for good (before the fix in watcher._plan_fits, which now plans
    the nodes left at their own count: tests/unit/test_watch_fewer_world.py)."""
    events = [json.loads(x) for x in
              (ROOT / "tests" / "fixtures" / "multinode" / "h200x2_node_lost_events.jsonl").read_text().splitlines()]
    lost = next(e for e in events if e["action"].startswith("stop the job"))
    grace = next(e for e in events if "watch.node_grace_s" in e["action"])
    decided = next(e for e in events if "feasible plan" in e["action"])
    assert lost["class"] == grace["class"] == "node-lost" and lost["node"] == "10.213.20.11"
    assert 55 <= decided["time"] - grace["time"] <= 90  # the grace (60 s) passed before going on without the node


WATCHED = json.loads((ROOT / "tests" / "fixtures" / "multinode" / "h200x2_watched_heal_lost_kill.json").read_text())


def _at(run: str, text: str, after: float = 0.0) -> float:
    return next(x["time"] for x in WATCHED[run]["watch"] if text in x["text"] and x["time"] >= after)


def test_the_recorded_watched_runs_load_as_runs_and_ran_every_step_once(tmp_path, monkeypatch):
    """The run folders the device kept are read by the product as its own runs: each step once, each attempt resumed
    from the checkpoint the one before it wrote."""
    from verl_cluster.watch.runs import RunState, RunStatus

    monkeypatch.setenv("HOME", str(tmp_path))
    for name, total in (("s43", 8), ("s5", 4)):
        rec = WATCHED[name]
        doc = {"run": rec["attempts"][0]["submission_id"], "cluster": name, "cluster_file": "", "attempts":
               rec["attempts"], "restarts": len(rec["attempts"]) - 1, "state": rec["state"], "nodes": rec["nodes"]}
        d = tmp_path / ".verl-cluster" / name / "runs" / doc["run"]
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps(doc))
        st = RunState.load(name, doc["run"])
        assert st is not None and st.state == RunStatus.SUCCEEDED
        steps = [s for a in st.attempts for s in range(a["first_step"], a["last_step"] + 1)]
        assert steps == list(range(1, total + 1))
        for before, after in zip(st.attempts, st.attempts[1:]):
            assert after["resumed_from"] == before["checkpoint"] == before["last_step"]
            assert before.get("steps_lost") in (0, None)
    assert [a.get("class") for a in WATCHED["s43"]["attempts"]] == ["node-lost", "node-lost", None]
    assert WATCHED["s43"]["nodes"] == 1 and WATCHED["s5"]["attempts"][0]["class"] == "worker-died"


def test_the_host_lost_for_good_was_resharded_once_and_only_then():
    """The raylet kill healed on both nodes (no reshard); the host lost for good resharded step 4 from 2 ranks to 1,
    kept verl's own files, and verl wrote 1-rank checkpoints from then on."""
    files = WATCHED["s43"]["actor_files"]
    ranks = {step: sorted({int(f.split("_world_size_")[1].split("_")[0]) for f in names})
             for step, names in files.items()}
    assert ranks == {"global_step_2/actor": [2], "global_step_4/actor": [1, 2], "global_step_6/actor": [1],
                     "global_step_8/actor": [1]}
    assert all(f"{k}_world_size_1_rank_0.pt" in files["global_step_4/actor"] for k in ("model", "optim", "extra_state"))


def test_the_recorded_times_from_each_fault_to_the_next_step():
    """Detect, heal/reshard, RUNNING again, first new step: the figures docs/BENCHMARKS.md gives, from the record."""
    heal, lost = WATCHED["s43"]["faults"]
    t = heal["killed_at"]
    assert _at("s43", "refuses connections", t) - t <= 5  # the raylet's port refuses at once
    assert _at("s43", "restarted 10.213.20.11", t) - t <= 20
    assert _at("s43", "is RUNNING", t) - t <= 35
    assert "resumed from step 2" in next(x["text"] for x in WATCHED["s43"]["watch"] if "first step 3" in x["text"])
    t = lost["killed_at"]
    seen = _at("s43", "has not answered", t)
    assert seen - t <= 15  # silent from here and from the head: no wait for the GCS health check
    ssh = _at("s43", "watch.node_grace_s", t)
    decided = _at("s43", "continue on 1 node(s) without 10.213.20.11", t)
    assert decided - ssh >= 14 and "resharded the newest checkpoint to 1 GPUs" in \
        next(x["text"] for x in WATCHED["s43"]["watch"] if x["time"] == decided and "continue on" in x["text"])
    assert _at("s43", "is RUNNING", decided) - t <= 90
    assert _at("s43", "resumed from step 4", decided) > decided
    kill = WATCHED["s5"]["faults"][0]["killed_at"]
    assert _at("s5", "worker-died", kill) - kill <= 10 and _at("s5", "is RUNNING", kill) - kill <= 25
