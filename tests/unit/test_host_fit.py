"""A run off its plan: whether the host's speed explains it (placement/check_run.host_fit). Machines of one GPU kind ran
verl's host side up to ~1.4x apart, one machine 1.2x apart within 20 minutes (docs/placement.md, "Batch R"); the plan
keeps its phases at other hosts' speeds (StepTime.by_host_factor()) and the run's phases pick the factor."""

import json
from pathlib import Path

import pytest

from tests.harness.scripts import load_script
from verl_cluster.placement import step_time
from verl_cluster.placement.check_run import host_fit
from verl_cluster.verl_logs.verl_log import vs_plan_lines

ROOT = Path(__file__).resolve().parents[2]

# a plan's phases at host factors 0.5 ... 2.0: gen all host, update_actor half host, update_weights the GPU's
TABLE = [[h, {"gen": 4.0 * h, "update_actor": 1.0 + 1.0 * h, "update_weights": 0.6}] for h in step_time.HOST_GRID]
PREDICTED = {"phases_s": dict(TABLE[2][1]), "step_s": 6.6, "by_host_factor": TABLE}


def test_a_run_on_a_faster_host_is_found_at_its_factor_and_explained():
    got = {"phases_s": {"gen": 2.8, "update_actor": 1.7, "update_weights": 0.6}, "step_s": 5.1}  # h = 0.7
    h = host_fit(PREDICTED, got)
    assert h["factor"] == pytest.approx(0.7, abs=0.011) and h["explains"]
    assert h["step_error"] == pytest.approx(6.6 / 5.1 - 1, abs=1e-3) and abs(h["step_error_at_factor"]) < 0.01
    assert set(h["phases_at_factor"]) == {"gen", "update_actor", "update_weights"}


def test_a_gpu_phase_off_is_not_the_host():
    """update_weights (no host term) measured 3x the plan's: no host factor brings it near, so it does not explain."""
    got = {"phases_s": {"gen": 4.0, "update_actor": 2.0, "update_weights": 1.8}, "step_s": 7.8}
    h = host_fit(PREDICTED, got)
    assert not h["explains"] and h["phases_at_factor"]["update_weights"] < -0.25


def test_a_factor_at_the_edge_of_the_range_explains_nothing():
    got = {"phases_s": {"gen": 0.4, "update_actor": 1.05, "update_weights": 0.6}, "step_s": 2.05}  # h = 0.1
    assert host_fit(PREDICTED, got)["factor"] == 0.5 and not host_fit(PREDICTED, got)["explains"]


def test_nothing_without_the_plans_table_or_the_runs_phases():
    assert host_fit({"phases_s": PREDICTED["phases_s"]}, {"phases_s": {"gen": 2.0}}) is None  # an older plan
    assert host_fit(PREDICTED, {"step_s": 5.0}) is None


def test_the_line_says_it_only_when_the_step_is_off():
    got = {"phases_s": {"gen": 2.8, "update_actor": 1.7, "update_weights": 0.6}}
    host = host_fit(PREDICTED, got)
    off = [{"what": "time step (s)", "predicted": 6.6, "measured": 5.1, "error": 0.294}]
    lines = vs_plan_lines(off, host)
    assert lines[-1].startswith("the host explains it") and "0.7x" in lines[-1] and "a faster host" in lines[-1]
    assert lines[-1].endswith("; the next plan on these machines starts from it (placement.host_factor: auto)")
    near = [{"what": "time step (s)", "predicted": 6.6, "measured": 6.0, "error": 0.1}]
    assert not any("host" in ln for ln in vs_plan_lines(near, host))
    worse = {**host, "explains": False, "step_error_at_factor": 0.31}
    assert vs_plan_lines(off, worse)[-1].startswith("not the host alone") and "+31%" in vs_plan_lines(off, worse)[-1]


def test_a_plan_keeps_its_phases_at_each_host_factor():
    """The plan's own step at factor 1 is its by_host_factor row 1; faster hosts give shorter phases, never longer."""
    fit = load_script("scripts/calibration/fit_plan_calibration.py")
    figures = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_runs.json").read_text())["runs"]
    _, plan, _ = fit.replays({}, {"g1fa-m4": figures["g1fa-m4"]})["g1fa-m4"]
    pred = plan.predictions()
    rows = dict((h, ph) for h, ph in pred["by_host_factor"])
    assert sorted(rows) == list(step_time.HOST_GRID)
    assert sum(rows[1.0].values()) == pytest.approx(pred["step_s"], rel=0.01)
    assert all(rows[0.5][k] <= rows[1.0][k] <= rows[2.0][k] for k in rows[1.0])


def test_the_recorded_misses_are_the_host():
    """Batch V (held out, one H100): g1fa-m4 +52% and g1ppo15b-m8 +37% off, explained at 0.65 and 0.59 (R's third
    run, +35%, at 0.78: docs/placement.md, "Batch R"). A fit run stays near 1."""
    fit = load_script("scripts/calibration/fit_plan_calibration.py")
    figures = json.loads((ROOT / "tests/fixtures/verl_runs/grid2_runs.json").read_text())["runs"]
    names = ("g1fa-m4", "g1ppo15b-m8", "g1fa-m8")
    got = {n: host_fit(plan.predictions(), meas) for n, (_, plan, meas) in
           fit.replays({}, {n: figures[n] for n in names}).items()}
    assert got["g1fa-m4"]["step_error"] > 0.45 and got["g1fa-m4"]["explains"]
    assert 0.6 <= got["g1fa-m4"]["factor"] <= 0.7 and 0.55 <= got["g1ppo15b-m8"]["factor"] <= 0.65
    assert got["g1ppo15b-m8"]["explains"] and abs(got["g1ppo15b-m8"]["step_error_at_factor"]) < 0.1
    assert 0.95 <= got["g1fa-m8"]["factor"] <= 1.05
