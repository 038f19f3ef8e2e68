"""The step time's error bar (placement/envelope.py): the envelope the model was calibrated on, shipped as
catalog/step_time_envelope.json, and what a job inside or outside it is told, in the plan, --brief and --json."""

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.facts.measured_bus import BusMeasure
from verl_cluster.facts.model import NodeFacts, from_json
from verl_cluster.placement import envelope as env
from verl_cluster.placement import parse_gpus, plan_job
from tests.harness.scripts import load_script, shipped_fit

ROOT = Path(__file__).resolve().parents[2]
FIT = load_script("scripts/calibration/fit_plan_calibration.py")
FIGURES = json.loads(FIT.FIGURES_FILE.read_text())["runs"]
GRPO = ROOT / "launch/gsm8k_grpo.yaml"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def h200(host: str) -> NodeFacts:
    f = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h200x1_recorded.json").read_text())
    return replace(f, host=host)


def user_line(nodes: int, extra: list[str] = ()):
    """The two-node run's line (multi_gpu_runs.json 2node-grpo05): 0.5B, micro 8 / 16, enforce_eager."""
    args = list(FIGURES["2node-grpo05"]["args"]) + ["model.catalog=qwen2.5-0.5b", *extra]
    if nodes == 1:
        args = [a for a in args if not a.startswith("trainer.n")] + ["trainer.nnodes=1", "trainer.n_gpus_per_node=2"]
    return load_job(GRPO, args)


SOCKET = (BusMeasure("lab", "nccl", 2, 2, 2, 2.4, 1 << 30, time.time()),)


def test_the_shipped_envelope_is_the_fit_s():
    """Every run of both fixtures, with its role and the model's step error (what --check holds)."""
    shipped = env.read_envelope()
    _, rows, info = shipped_fit()
    made = FIT.envelope(rows, info["hosts"])
    assert shipped["runs"] == made["runs"] and shipped["hosts"] == made["hosts"]  # hosts: host_factor.py's groups
    assert env.fastest_host(shipped) == ("batch W's H100, 2026-12-07", 0.57)
    roles = {r["run"]: r["role"] for r in shipped["runs"]}
    assert roles["2node-grpo05"] == "fit" and roles["node2-grpo05"] == roles["2node-grpo-tiny"] == "seen"
    # 5 of the first grid and none of the second: its earlier runs were fitted on after the look (grid2.FITTED_ON:
    # its first 4 at the first refit, D-F and Q's two watched runs at the second), batches T and U (one H200,
    # 2026-12-02) were looked at before the third and are seen (grid2.SEEN); batches V and W (one H100 each,
    # 2026-12-07) are held out from the fourth, and X (W's PPO and 1.5B runs again on other H100s) and Y (V's micro 4
    # run again on another H100, 2026-12-08); the frozen one is a diagnosis: no entry
    assert sorted(n for n, r in roles.items() if r == "hold-out" and n.startswith("g")) == [
        "g1fa-m4", "g1fa-m4-b", "g1fa15b-m4", "g1fa15b-m4-b", "g1pad-m4", "g1pad15b-m8", "g1ppo-m4", "g1ppo-m4-b",
        "g1ppo15b-m8"]
    assert sorted(n for n, r in roles.items() if r == "seen" and n.startswith("g")) == [
        "g1fa-m16", "g1fa15b-m8", "g1fa3b-m8", "g1pad-m16", "g1ppo-m16"]
    assert sum(1 for r in roles.values() if r == "hold-out") == 14
    assert all(roles[n] == "fit" for n in ("g2ppo-m32", "g2fa-m2", "g2pad-m2", "g2ppo-m2", "g2off-m8", "g2off-m32",
                                           "g2ppo-m32-gc", "g2off-m32-gc", "g2pad-m8", "g2fa-m8", "g2ppo-m8",
                                           "g2fa-m32"))
    assert "g2ppo-m32-frz" not in roles


def test_percent_rounds_up_to_five():
    assert [env._round_up(x) for x in (0.196, -0.337, 0.01, 0.2, 0.0)] == [20, 35, 5, 20, 5]


def test_a_job_inside_the_one_h100_grid_is_calibrated():
    """GRPO 1.5B, 512 sequences, flash-attn, on one H100: the family of the grid's GRPO runs; its nearest runs not
    fitted on are hold-grpo15big (+8.6%, the same job) -> ±10% from the envelope; on batch W's host (0.57 of the fit's
    host time) this step would be +28% over -> ±30%."""
    job = load_job(GRPO, ["model.catalog=qwen2.5-1.5b", "data.train_batch_size=64", "actor_rollout_ref.rollout.n=8",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=32", "data.max_response_length=1024",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
                          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=64"])
    bar = plan_job(job, parse_gpus("1x1xH100-80GB"), fill=0.3).time["error_bar"]
    assert bar["calibrated"] and bar["pct"] == 30 and bar["runs"] == ["hold-grpo15big"]
    assert "held" not in bar["why"] and "hold-grpo15big" in bar["why"]
    assert bar["host"]["group"] == "batch W's H100, 2026-12-07" and bar["host"]["factor"] == 0.57
    assert 0.25 < bar["host"]["error"] <= 0.30 and "on the fastest host recorded (batch W's H100" in bar["why"]
    # which way: over by the fastest host's error, under by no more than the family's fit residuals
    assert bar["over"] == bar["host"]["error"] and -0.10 < bar["under"] <= 0


def test_the_two_node_line_is_calibrated_on_its_one_run():
    """The two-node family has one fit run (2node-grpo05); the nearest run not fitted on is the tiny model on the same
    two nodes (-3.8% since the fourth refit) -> ±5% from the envelope; the step is mostly the host's (an eager
    rollout, a 0.5B model), and on batch W's host it would be 35-40% over -> ±40%."""
    bar = plan_job(user_line(2), [h200("a"), h200("b")], fill=0.38, bus=SOCKET).time["error_bar"]
    assert bar["calibrated"] and bar["pct"] == 40 and bar["runs"] == ["2node-grpo-tiny"]
    assert 0.35 < bar["host"]["error"] <= 0.40
    assert bar["axes"] == {"gpu": "H200", "ranks": 2, "nodes": 2, "attention": "padded, no flash-attn",
                           "algorithm": "grpo", "offload": "none", "rollout": "eager", "micro_update": 8,
                           "micro_log_prob": 16, "params_b": 0.49}


def test_the_users_two_gpu_line_is_calibrated_by_its_family():
    """The same line on 2 GPUs of one node with CUDA graphs is the second grid's padded 2-GPU family: g2pad-m8 (+0.9%
    held out, fitted on since) and node2-grpo05 (the same job, -22.6%, seen, never fitted on) -> ±25% from the
    envelope; at this fill the generate is near one of verl's 2 s polls, and on batch W's host it would take one
    fewer, the update ~0.6x: ±65%."""
    job = user_line(1, ["actor_rollout_ref.rollout.enforce_eager=false"])
    facts = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    bar = plan_job(job, [facts], fill=0.5).time["error_bar"]
    assert bar["calibrated"] and bar["pct"] == 65 and 0.60 < bar["host"]["error"] <= 0.65
    assert bar["runs"] == ["node2-grpo05"]


def test_a_job_outside_every_family_is_uncalibrated_with_its_nearest():
    """The line on 2 GPUs of one node with an eager rollout: no family has it (the eager 2-GPU runs crossed two
    nodes); the nearest is the 2-GPU one-node family with CUDA graphs, one axis away, the one-axis tie with the
    two-node family going to the family with more runs; the bar is the largest step error on any run not fitted on
    (g1ppo-m4, +70.9%, batch W on one H100, its host 0.57 of the fit's: no second-grid run on 2 GPUs is held out)
    -> ±75%."""
    job = user_line(1)
    facts = from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h200x2_recorded.json").read_text())
    bar = plan_job(job, [facts], fill=0.5).time["error_bar"]
    assert not bar["calibrated"] and bar["pct"] == 75
    assert bar["outside"] == ["rollout"]
    assert bar["why"].startswith("uncalibrated: enforce_eager is outside the calibrated range (nearest family: H200, "
                                 "2 GPUs, 1 node, padded, no flash-attn attention, GRPO, no offload, CUDA graphs, "
                                 "micro 2-8, log-prob micro 4-16, 0.49B)")
    assert {"node2-grpo05", "g1ppo-m4"} <= set(bar["runs"]) and not any(r.startswith("g2") for r in bar["runs"])


def test_the_host_part_is_large_where_the_step_is_the_hosts_and_small_where_it_is_the_gpus():
    """One H200, GRPO at 0.5B and micro 4 (batch V's g1fa-m4 on the other card): the host binds nearly everything, so
    on W's host the step would be ~71% over, which widens its bar past the envelope's (g1fa-m4's +51.8%, its nearest
    held-out run); a 7B model on 8 H100s is the GPU's work, a few percent, and its bar the envelope's own (the largest
    of all, W's g1ppo-m4 +70.9%), carrying the host's figure."""
    job = load_job(GRPO, ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"])
    small = plan_job(job, parse_gpus("1x1xH200-141GB"), fill=0.38).time["error_bar"]
    big = plan_job(load_job(GRPO, ["model.catalog=qwen2.5-7b"]), parse_gpus("1x8xH100-80GB")).time["error_bar"]
    assert small["host"]["error"] > 0.65 and small["pct"] == 75 and "g1fa-m4" in small["runs"]
    assert big["host"]["error"] < 0.10 and big["pct"] == 75
    assert "fastest host recorded (batch W's H100" in small["why"] and "fastest host" not in big["why"]
    bar = env.error_bar({"gpu": "H100"}, doc={"runs": []}, host={"group": "g", "factor": 0.7, "error": 0.3})
    assert bar.pct == 30 and bar.to_dict()["host"]["error"] == 0.3


def test_eight_gpus_and_a_7b_model_are_outside():
    p = plan_job(load_job(GRPO, ["model.catalog=qwen2.5-7b"]), parse_gpus("1x8xH100-80GB"))
    bar = p.time["error_bar"]
    assert not bar["calibrated"] and "8 GPUs" in bar["why"] and "7.62B" in bar["why"]
    assert set(bar["outside"]) >= {"ranks", "params_b"}


def test_a_bar_whose_runs_all_came_in_over_still_allows_a_step_a_little_slower():
    """hold-padded05's axes: its nearest runs and its family's fit runs were all over or exact; the slow side
    keeps the ± bar's 5% floor, so a run 2% slower than planned is inside the range, not outside it."""
    run = next(r for r in env.read_envelope()["runs"] if r["run"] == "hold-padded05")
    bar = env.error_bar(run["axes"]).to_dict()
    assert bar["calibrated"] and bar["under"] == -0.05 and bar["over"] >= 0.05
    lo, hi = env.step_range(10.0, bar)
    assert hi == pytest.approx(10.0 / 0.95) and lo < 10.0 and env.range_text(lo, hi).endswith("-11 s")

def test_no_envelope_says_so():
    bar = env.error_bar({"gpu": "H100"}, doc={})
    assert bar.pct == 0 and not bar.calibrated and "no calibration envelope" in bar.line()
    assert env.step_range(10.0, bar.to_dict()) is None and env.step_range(10.0, None) is None  # no range to give


def test_plan_table_brief_and_json_carry_it(capsys):
    from verl_cluster.cli import main

    args = ["plan", str(GRPO), "--gpus", "1x8xH100-80GB"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert main(args + ["--json"]) == 0
    t = json.loads(capsys.readouterr().out)["time"]
    bar = t["error_bar"]
    assert bar["pct"] == 75 and bar["calibrated"] is False and bar["outside"] == ["ranks"]
    assert bar["nearest_family"].startswith("H100, 1 GPU, 1 node, packed (flash-attn) attention, GRPO")
    # which way: the held-out runs' largest over (W's PPO run, +70.9%: its host ran faster) and under (node2-grpo05,
    # -22.6%), as the seconds this step came in between on them
    assert bar["over"] == 0.709 and bar["under"] == -0.226
    lo, hi = t["step_s"] / 1.709, t["step_s"] / 0.774
    assert t["step_range_s"] == [pytest.approx(lo, abs=0.01), pytest.approx(hi, abs=0.01)]
    said = env.range_text(lo, hi)  # rounded outward: 14.1 s -> 14, 30.2 s -> 31
    assert said == f"{math.floor(lo)}-{math.ceil(hi)} s"
    assert f"s/step predicted (±75%, uncalibrated: {said})" in out
    assert "step time ±75%: uncalibrated: 8 GPUs is outside the calibrated range (nearest family: H100, 1 GPU" in out
    assert f"as those runs came in against their plans, this step would take {said}" in out
    assert main(args + ["--brief"]) == 0
    brief = " ".join(capsys.readouterr().out.split())
    assert f"(±75%, uncalibrated: {said})" in brief and "step time ±75%: uncalibrated: 8 GPUs is outside" in brief


def test_factors_still_apply_on_top(tmp_path, capsys):
    """plan --factors scales the phases (the step is their sum) and the error bar stays the model's."""
    from verl_cluster.cli import main

    factors = tmp_path / "f.json"
    factors.write_text(json.dumps({"factors": {"gen": {"factor": 2.0, "runs": 3, "enough": True}}}))
    args = ["plan", str(GRPO), "--gpus", "1x8xH100-80GB", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["time"]
    assert main(args + ["--factors", str(factors)]) == 0
    got = json.loads(capsys.readouterr().out)["time"]
    assert got["phases_s"]["gen"] == pytest.approx(2 * plain["phases_s"]["gen"], abs=0.02)
    assert got["step_s"] == pytest.approx(plain["step_s"] + plain["phases_s"]["gen"], abs=0.05)
    assert got["error_bar"] == plain["error_bar"]
    assert got["step_range_s"][0] == pytest.approx(got["step_s"] / (1 + got["error_bar"]["over"]), abs=0.01)
    assert any(n.startswith("factors from") for n in got["notes"])


def test_the_options_of_a_job_that_does_not_fit_carry_theirs(capsys):
    """1.5B on one 24 GiB card does not fit; each feasible option says its step and its bar (an RTX 4090 is outside
    every family)."""
    from verl_cluster.cli import main

    args = ["plan", str(GRPO), "--gpus", "1x1xRTX4090-24GB", "model.catalog=qwen2.5-1.5b"]
    assert main(args) == 1
    assert "s/step (±75%, uncalibrated: " in capsys.readouterr().out
    assert main(args + ["--json"]) == 1
    options = json.loads(capsys.readouterr().out)["options"]
    assert options and all(o["error_bar"]["pct"] == 75 and not o["error_bar"]["calibrated"] for o in options)
    assert all(o["step_range_s"][0] < o["step_s"] < o["step_range_s"][1] for o in options)
    assert all("RTX 4090" in o["error_bar"]["why"] for o in options)
