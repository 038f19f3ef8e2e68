"""The plan against real verl runs: GRPO (no flash-attn) and PPO with a GAE critic (flash-attn 2.8.3), Qwen2.5-0.5B
shape (random init), vLLM 0.24 rollout, 1x H100, recorded by scripts/gpu/gpu_e2e.sh + scripts/calibration/verl_memory_report.py
(tests/fixtures/verl_runs/, docs/BENCHMARKS.md "verl for real"). The planner is re-run on the same job, with the
micro batches the run used (and, for the padding-free PPO run, the sequence length it really had: plan --fill), and
each phase's predicted GPU peak must sit within 10% of what NVML measured. The rollout's sampler workspace was
fitted on the GRPO run; the PPO run checks it, the fused loss path and the shared allocator of colocated roles."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.facts.model import NodeFacts, from_json
from verl_cluster.placement import plan_job

ROOT = Path(__file__).resolve().parents[2]
RUN = json.loads((ROOT / "tests/fixtures/verl_runs/h100_grpo_0.5b.json").read_text())
TINY = json.loads((ROOT / "tests/fixtures/verl_runs/h100_grpo_tiny.json").read_text())
PPO = json.loads((ROOT / "tests/fixtures/verl_runs/h100_ppo_0.5b.json").read_text())
PPO_TINY = json.loads((ROOT / "tests/fixtures/verl_runs/h100_ppo_tiny.json").read_text())
H100 = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())  # flash-attn kit staged
H100_NO_FA = replace(H100, versions={k: v for k, v in H100.versions.items() if k != "flash_attn"})  # the GRPO runs
MICRO_KEYS = ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
              "critic.ppo_micro_batch_size_per_gpu", "critic.forward_micro_batch_size_per_gpu")


def replan(run, model_args, facts=H100_NO_FA, fill=1.0):
    """The run's job and arguments (its model by catalog shape), with the micro batches it ran with."""
    args = [a for a in run["submitted"]["args"] if not a.startswith(("model.path=", "data.", "env."))]
    args += [a for a in run["submitted"]["args"] if a.startswith("data.train_batch_size=")]
    args += model_args + [f"{k}={run['overrides'][k]}" for k in MICRO_KEYS if k in run["overrides"]]
    job = load_job(ROOT / run["submitted"]["job"], args)
    return plan_job(job, [facts], fill=fill)


def replan_ppo():
    # use_remove_padding: micro batches hold real tokens; the longest step's mean sequence was 407 of 1024
    return replan(PPO, ["model.catalog=qwen2.5-0.5b"], facts=H100, fill=PPO["verl"]["seq_tokens_mean"] / 1024)


def phase_peaks(plan):
    return {ph["phase"]: ph["peak_gib"] for r in plan.to_dict()["roles"].values() for ph in r["phases"]}


def test_the_run_is_the_recorded_one():
    assert RUN["verl"]["steps"] == 3 and RUN["model"]["params"] == 494032768
    assert RUN["hardware"]["description"].endswith("NVIDIA H100 80GB HBM3")
    assert {r["phase"] for r in RUN["rows"]} == {"generate", "actor log-prob", "ref log-prob", "actor update"}
    # the plan made before the calibration: the update 23.5% over, the rollout 6.7% under
    old = {r["phase"]: r["error"] for r in RUN["rows"]}
    assert old["actor update"] > 0.2 and old["generate"] < -0.05


@pytest.mark.parametrize("phase", ["generate", "actor log-prob", "ref log-prob", "actor update"])
def test_each_phase_within_ten_percent(phase):
    plan = replan(RUN, ["model.catalog=qwen2.5-0.5b"])
    assert plan.feasible
    measured = next(r["gpu_gib"] for r in RUN["rows"] if r["phase"] == phase)
    predicted = phase_peaks(plan)[phase]
    assert abs(predicted - measured) / measured <= 0.10, f"{phase}: predicted {predicted} GiB, measured {measured}"


def test_rollout_terms_against_vllms_own_numbers():
    plan = replan(RUN, ["model.catalog=qwen2.5-0.5b"]).to_dict()
    gen = next(ph for ph in plan["roles"]["rollout"]["phases"] if ph["phase"] == "generate")["components"]
    # KV cache: vLLM logged 37.33 GiB; weights 0.93 GiB ("Model loading took")
    assert gen["kv cache"] == pytest.approx(RUN["vllm"]["kv_cache_gib"], rel=0.05)
    assert gen["weights"] == pytest.approx(RUN["vllm"]["model_loading_gib"], abs=0.05)
    # the awake vLLM process: its context + util x capacity + the sampler workspace
    budget = plan["settings"]["gpu_memory_utilization"] * plan["hardware"]["capacity_gib_per_gpu"]
    assert 0.5 + budget + gen["sampler workspace"] == pytest.approx(RUN["vllm_awake_gib"], rel=0.03)
    # asleep it keeps ~1.2 GiB on the GPU during the training phases
    assert RUN["vllm_asleep_gib"] == pytest.approx(1.23) and RUN["vllm_asleep_gib"] <= 1.25


def test_tiny_model_rollout_within_ten_percent(tmp_path):
    # the 2-layer model of scripts/make_tiny_model.py (vocab 1024): the awake vLLM process is its context +
    # util x capacity (no sampler workspace to speak of). Its training phases last milliseconds, shorter than
    # the sampler's 0.2 s, so only the rollout is compared.
    from verl_cluster.testdata.tiny_model import write_model

    write_model(tmp_path / "tiny", "tiny", seed=0)
    predicted = phase_peaks(replan(TINY, [f"model.path={tmp_path / 'tiny'}"]))["generate"]
    measured = next(r for r in TINY["rows"] if r["phase"] == "generate")["gpu_gib"]
    assert abs(predicted - measured) / measured <= 0.10
    # over util x NVML's total: 0.3 GiB (vLLM takes util x torch's total, 0.47 GiB less): VLLM_CONTEXT_BYTES 0.5
    assert 0.2 <= TINY["vllm_awake_gib"] - 0.5 * TINY["hardware"]["capacity_gib_per_gpu"] <= 0.5


def test_the_ppo_run_is_the_recorded_one():
    assert PPO["verl"]["steps"] == 3 and PPO["settings"]["attn_implementation"] == "flash_attention_2"
    assert {r["phase"] for r in PPO["rows"]} == {"generate", "actor log-prob", "actor update", "critic values",
                                                 "critic update"}
    # the plan made on the device at the worst-case length, before this calibration: the actor 2.4x / 2.7x over
    old = {r["phase"]: r["error"] for r in PPO["rows"]}
    assert old["actor log-prob"] > 2.0 and old["generate"] > 0.15


@pytest.mark.parametrize("phase", ["generate", "actor log-prob", "actor update", "critic values", "critic update"])
def test_ppo_each_phase_within_ten_percent(phase):
    plan = replan_ppo()
    assert plan.feasible and plan.attn == "flash_attention_2"
    measured = next(r["gpu_gib"] for r in PPO["rows"] if r["phase"] == phase)
    predicted = phase_peaks(plan)[phase]
    assert abs(predicted - measured) / measured <= 0.10, f"{phase}: predicted {predicted} GiB, measured {measured}"


def test_ppo_critic_update_holds_the_log_prob_cache_beside_its_gradients():
    # was -10.5% while the carried cache was compared with the whole transient: the critic update's gradients and
    # gathered weights sit in other streams' pools, so only its default-stream part can reuse the actor
    # log-prob's cached logits; what is left of them adds on top (predicted 20.77 GiB, measured 21.96: -5.4%)
    measured = next(r["gpu_gib"] for r in PPO["rows"] if r["phase"] == "critic update")
    plan = replan_ppo().to_dict()
    update = next(ph for ph in plan["roles"]["critic"]["phases"] if ph["phase"] == "critic update")
    assert update["components"]["cached from earlier phases"] > 1.0
    assert -0.07 < (update["peak_gib"] - measured) / measured < -0.03


def test_ppo_shared_allocator_and_fused_loss_terms():
    plan = replan_ppo().to_dict()
    parts = {ph["phase"]: ph["components"] for r in plan["roles"].values() for ph in r["phases"]}
    # flash-attn's Triton cross-entropy: bf16 logits only in the old log-probs (2 B per token per logit)
    lp = next(ph for ph in plan["roles"]["actor"]["phases"] if ph["phase"] == "actor log-prob")
    assert parts["actor log-prob"]["logits"] == pytest.approx(lp["tokens"] * 151936 * 2 / 2**30, abs=0.01)
    # the critic's values phase runs in the same process after the actor's log-probs: their logits stay cached
    assert parts["critic values"]["cached from earlier phases"] > 2.5
    # the awake vLLM process: context + util x capacity + the sampler workspace of 64 sequences in flight
    gen = parts["generate"]
    budget = plan["settings"]["gpu_memory_utilization"] * plan["hardware"]["capacity_gib_per_gpu"]
    assert gen["sampler workspace"] == pytest.approx(64 * 151936 * 133 / 2**30, abs=0.01)
    assert 0.5 + budget + gen["sampler workspace"] == pytest.approx(PPO["vllm_awake_gib"], rel=0.05)
    # between phases the trainer process holds both models' params + Adam (grads freed), + ~1.4 GiB
    trainer_between = next(r["trainer_gib"] for r in PPO["rows"] if r["phase"] == "generate")
    assert trainer_between == pytest.approx(2 * (1.84 + 3.68) + 1.43, abs=0.1)


def test_tiny_ppo_rollout_within_ten_percent(tmp_path):
    from verl_cluster.testdata.tiny_model import write_model

    write_model(tmp_path / "tiny", "tiny", seed=0)
    predicted = phase_peaks(replan(PPO_TINY, [f"model.path={tmp_path / 'tiny'}"], facts=H100))["generate"]
    measured = next(r for r in PPO_TINY["rows"] if r["phase"] == "generate")["gpu_gib"]
    assert abs(predicted - measured) / measured <= 0.10
