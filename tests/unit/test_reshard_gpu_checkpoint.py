"""verl 0.9.1's default strategy writes FSDP1 checkpoints: the real one from an H100 run (world size 1) is
reshardable; a launcher resuming it on another world size is told the command, and `reshard --dry-run` lists it."""

import json
import subprocess
import sys
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
    import types

    from verl_cluster.cli.submit_cmd import resume_findings

    def sub(gpus, mode="auto"):
        keys = {"trainer.default_local_dir": str(CKPT), "trainer.resume_mode": mode}
        return types.SimpleNamespace(job=types.SimpleNamespace(get=keys.get), request=types.SimpleNamespace(
            entrypoint=f"python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node={gpus}"))

    (f,) = resume_findings(sub(2))
    assert f.level == "error" and f.check == "checkpoint" and "verl-cluster reshard" in f.message
    assert resume_findings(sub(2, mode="disable")) == []
    assert resume_findings(sub(1)) == []
