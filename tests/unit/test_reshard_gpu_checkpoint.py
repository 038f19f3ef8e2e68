"""verl 0.9.1's default strategy writes FSDP1 checkpoints: the real one from an H100 run (world size 1) is
reshardable; a launcher resuming it on another world size is told the command, and `reshard --dry-run` lists it."""

import json
import subprocess
import sys
import types
from pathlib import Path

from verl_cluster.reshard import resume_world_size_problem

CKPT = Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_ws1"


def test_resume_on_another_world_size_names_the_reshard():
    problem = resume_world_size_problem(str(CKPT), 2)
    assert problem and "saved by 1 ranks" in problem and f"verl-cluster reshard {CKPT} --world-size 2" in problem
    assert resume_world_size_problem(str(CKPT), 1) is None


def test_reshard_dry_run_plans_the_fsdp1_model_and_extra_state(tmp_path):
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "reshard", str(CKPT), "--world-size", "2",
                        "--dry-run", "--json"], capture_output=True, text=True, timeout=120,
                       env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    actor = CKPT / "global_step_2" / "actor"
    assert plan["fsdp1"] == [str(actor)] and any("FSDP1" in n for n in plan["notes"])
    assert set(plan["reads"]) == {str(actor / "model_world_size_1_rank_0.pt"),
                                  str(actor / "extra_state_world_size_1_rank_0.pt")}
    assert {Path(w).name for w in plan["writes"]} == {"model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt",
                                                     "extra_state_world_size_2_rank_0.pt",
                                                     "extra_state_world_size_2_rank_1.pt", "fsdp_config.json"}


def test_submit_preflight_says_it_before_any_gpu_time():
    from verl_cluster.config.job_shape import JobShape
    from verl_cluster.submit.checkpoint_checks import checkpoint_findings, resume_findings

    def job(mode="auto"):
        keys = {"trainer.default_local_dir": str(CKPT), "trainer.resume_mode": mode}
        return types.SimpleNamespace(get=lambda k, d=None: keys.get(k, d))

    (f,) = resume_findings(job(), JobShape(1, 2))
    assert f.level == "error" and f.check == "checkpoint" and "verl-cluster reshard" in f.message
    assert resume_findings(job("disable"), JobShape(1, 2)) == []
    assert resume_findings(job(), JobShape(1, 1)) == []
    assert resume_findings(job(), JobShape(None, 1)) == []  # verl's one node by default: the world the ckpt has
    # the request's overrides (the plan's counts merged in) are what is judged
    assert [x.check for x in checkpoint_findings(job(), {"trainer.n_gpus_per_node": "2"})] == ["checkpoint"]
