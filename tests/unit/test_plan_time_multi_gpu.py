"""Step time on more than one GPU: the plan against the verl 0.9.1 runs kept as figures
(tests/fixtures/verl_runs/multi_gpu_runs.json; docs/BENCHMARKS.md "Step time off the grid").

All of them were recorded before issue 33's terms were written and were looked at while writing them: the one fitted
on is tagged "fit", the two that were not are tagged "seen" (not fitted on, not blind: no hold-out). Their bounds are
what the model achieves there, with a margin; the seen runs' misses are named."""

import json
from pathlib import Path

import pytest

from verl_cluster.placement.check_run import pairs
from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
FIT = load_script("scripts/calibration/fit_plan_calibration.py")
FIGURES = json.loads(FIT.FIGURES_FILE.read_text())["runs"]


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


def rows_of(name, tmp_path):
    plan, got = FIT.replay_figures(FIGURES[name], tmp_path)
    return {r["what"][5:-4]: r for r in pairs(plan.predictions(), got) if r["what"].startswith("time ")}


def test_the_fixture_says_what_each_run_is():
    """Recorded before the model's change: fit or seen, never hold-out."""
    assert {n: r["time"] for n, r in FIGURES.items()} == {"2node-grpo05": "fit", "2node-grpo-tiny": "seen",
                                                          "node2-grpo05": "seen"}
    assert all(r["recorded_before_the_model"] for r in FIGURES.values())
    assert all(("steps" in r) != ("means" in r) for r in FIGURES.values())


def test_the_two_node_run_fitted_on(tmp_path):
    """GRPO 0.5B across two nodes (NCCL over a socket, 2.4 GB/s), micro 8 / 16, enforce_eager: before issue 33's
    terms the plan said 22.7 s (gen 3.90, update_actor 12.82, update_weights 0.52) against 27.5 s measured (steps
    2-4); +7.9% after those terms, +1.0% at the refit on the second grid; every phase within 19% (the LM head's host
    work taken as serial beside FSDP's rate-limited gathers, step_time.overlapped)."""
    rows = rows_of("2node-grpo05", tmp_path)
    assert abs(rows["step"]["error"]) <= 0.08, rows
    assert all(abs(r["error"]) <= 0.19 for p, r in rows.items() if r["measured"] >= 0.5), rows
    before = FIGURES["2node-grpo05"]["plan_before"]
    assert before["step"] / rows["step"]["measured"] - 1 < -0.15  # what the model missed


@pytest.mark.parametrize("name,step,phases", [
    # tiny model on two nodes, means over steps 1-2 (step 1's warm-up in them): -3.2%; update_weights -57.5%
    # (1.41 s: the ranks' fixed cost is larger than the 0.5B run's says), ref -11.5%, update_actor +32.8% (the LM
    # head's per-micro-batch host cost is less behind the tiny model's 128-wide head)
    ("2node-grpo-tiny", 0.20, {"update_weights": 0.60, "ref": 0.35, "update_actor": 0.60}),
    # 2 H200 of one node, step 2 only: -22.7%; old_log_prob -36.6% (3.2 s, above the two-node run's 2.3-2.9 s over
    # a slower link), gen -36.7% (4.1 s: two of verl's 2 s polls), update_weights -32.9%
    ("node2-grpo05", 0.25, {"old_log_prob": 0.50, "gen": 0.40, "update_weights": 0.35}),
])
def test_the_runs_seen_not_fitted(name, step, phases, tmp_path):
    """Not fitted on; their misses are the model's largest off the one-H100 grid and set the uncalibrated error
    bar (placement/envelope.py). Phases not named within ±25%."""
    rows = rows_of(name, tmp_path)
    assert abs(rows["step"]["error"]) <= step, rows
    for p, r in rows.items():
        if p != "step" and r["measured"] >= 0.5:
            assert abs(r["error"]) <= phases.get(p, 0.25), (p, r)
