"""verl 0.9.1's default strategy writes FSDP1 checkpoints: the real one from the H100 run is refused with the reason
and the fix, by `reshard` (exit 2) and by the check a launcher runs before resuming on another world size."""

import subprocess
import sys
from pathlib import Path

from verl_cluster.reshard import resume_world_size_problem

CKPT = Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_h100_fsdp1"


def test_resume_on_another_world_size_names_fsdp1():
    problem = resume_world_size_problem(str(CKPT), 2)
    assert problem and "cannot be resumed on 2 GPUs" in problem and "FSDP1" in problem


def test_reshard_refuses_it_with_exit_2_and_the_fix():
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "reshard", str(CKPT), "--world-size", "2",
                        "--dry-run"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "FSDP1" in r.stderr and "strategy=fsdp2" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_submit_preflight_says_it_before_any_gpu_time():
    import types

    from verl_cluster.cli.submit_cmd import resume_findings

    def sub(gpus, mode="auto"):
        keys = {"trainer.default_local_dir": str(CKPT), "trainer.resume_mode": mode}
        return types.SimpleNamespace(job=types.SimpleNamespace(get=keys.get), request=types.SimpleNamespace(
            entrypoint=f"python3 -m verl.trainer.main_ppo trainer.nnodes=1 trainer.n_gpus_per_node={gpus}"))

    (f,) = resume_findings(sub(2))
    assert f.level == "error" and f.check == "checkpoint" and "cannot be resumed on 2 GPUs" in f.message
    assert resume_findings(sub(2, mode="disable")) == []
