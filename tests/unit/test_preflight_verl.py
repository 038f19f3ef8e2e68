"""verl's real Hydra config against our overrides (needs verl: here, or in $VC_VERL_PYTHON's environment).

verl 0.9.1 installs on CPU, but its wheel ships a top-level `tests` package that shadows this repo's, so it is
not in the test venv: point VC_VERL_PYTHON at a Python that has it (e.g. a separate venv) to run these.
"""

from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.submit.preflight import check_verl
from verl_cluster.jobs.request import effective_overrides
from verl_cluster.submit.verl_config import check_verl_config, verl_available, verl_python

ROOT = Path(__file__).resolve().parents[2]
if not verl_available(verl_python()):
    pytest.skip(f"verl is not importable by {verl_python()} (set VC_VERL_PYTHON to a Python with verl 0.9.1): "
                "verl config checks not run", allow_module_level=True)


def test_unknown_keys_get_the_nearest_valid_key():
    res = check_verl_config("verl.trainer.main_ppo", {"data.train_batch_sizee": 4,
                                                     "actor_rollout_ref.actor.optim.lrr": 1e-6,
                                                     "+my.new_key": 1})
    assert res.ran and res.error is None
    assert res.unknown == [("data.train_batch_sizee", "data.train_batch_size"),
                           ("actor_rollout_ref.actor.optim.lrr", "actor_rollout_ref.actor.optim.lr")]


def test_verl_rejections_are_reported():
    res = check_verl_config("verl.trainer.main_ppo", {"trainer.n_gpus_per_node": 2, "data.train_batch_size": 16})
    assert res.ran and not res.unknown
    assert res.error and "ppo_micro_batch_size" in res.error  # verl's own config validation ran


@pytest.mark.parametrize("name", ["gsm8k.yaml", "gsm8k_grpo.yaml", "sft_gsm8k.yaml"])
def test_shipped_jobs_compose_with_verl(name):
    path = ROOT / "launch" / name
    if not path.exists():
        pytest.skip(f"{name} not shipped yet")
    job = load_job(path)
    plan_overrides = {}
    if job.is_ray_only:  # the planner supplies micro batch sizes etc.; verl rejects the job without them
        from verl_cluster.placement import parse_gpus, plan_job

        plan_overrides = plan_job(job, parse_gpus("1x2xH100-80GB")).overrides
    findings = check_verl(job, effective_overrides(job, plan_overrides))
    assert [f.message for f in findings if f.level == "error"] == []
