"""Issue 33's second grid as recorded on the device (tests/fixtures/verl_runs/grid2_results/): each measured run held
against the prediction round committed before it started (grid2.report; docs/BENCHMARKS.md, "The second grid's
first held-out runs"). The held-out runs are the ones the target counts: step ±20%, phases over half a second ±30%,
at least 6 runs in 3 families, 2 on 2 GPUs."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "calibration"))

import grid2  # noqa: E402

RESULTS = sorted((ROOT / "tests/fixtures/verl_runs/grid2_results").glob("grid2-*.json"))


def recorded() -> dict:
    rounds = json.loads(grid2.PREDICTIONS.read_text())["rounds"]
    return grid2.report([json.loads(p.read_text()) for p in RESULTS], rounds)


def test_every_recorded_run_was_predicted_before_it_ran():
    rep = recorded()
    assert {r["run"] for r in rep["runs"]} == {"g1pad-m8", "g1fa-m8", "g1ppo-m8", "g2pad-m8", "g2fa-m8", "g2ppo-m8",
                                               "g2fa-m32"}
    assert all(r["blind"] for r in rep["runs"])  # a round dated before its start: predicted first
    held = [r for r in rep["runs"] if r["role"] == "hold-out"]
    # the held-out runs were predicted at the model of the fit runs' refit (round dea32d7), before any of them ran
    assert {r["commit"][:7] for r in held} == {"dea32d7"} and all(not r["newer_rounds_before_run"] for r in held)


def test_the_held_out_runs_at_micro_8_meet_the_target():
    """2 H200 of one node, micro 8 / log-prob 16: padded +0.9%, packed +6.0%, PPO -2.1%; every phase over half a
    second within ±30% (worst: gen +23.6%, one poll of verl's replay buffer where the model adds the average wait;
    the critic's update -27.7%)."""
    by = {r["run"]: r for r in recorded()["runs"]}
    for name in ("g2pad-m8", "g2fa-m8", "g2ppo-m8"):
        r = by[name]
        assert r["meets_target"] and abs(r["step_error"]) <= 0.20, r
        assert all(p["ok"] for p in r["phases"] if p["held"]), r["phases"]


def test_the_held_out_run_at_micro_32_misses_and_the_target_is_not_met_yet():
    """g2fa-m32 (one micro batch a mini batch): the actor's update took 0.83 s where the model said 1.60 (+92%), the
    step +34.7%. With 4 held-out runs of the 6 the target needs, and this miss, the target is not met: batch P's
    profile decides the model's next form (docs/placement.md, "What the first 2-GPU held-out runs said")."""
    rep = recorded()
    r = {r["run"]: r for r in rep["runs"]}["g2fa-m32"]
    worst = max((p for p in r["phases"] if p["held"]), key=lambda p: abs(p["error"]))
    assert not r["meets_target"] and r["step_error"] > 0.20 and worst["phase"] == "update_actor"
    assert rep["target"] == {"held_out_runs": 4, "held_out_families": 3, "held_out_families_on_2_gpus": 3,
                             "held_out_runs_meeting": 3, "families_never_fitted": 3, "met": False}
