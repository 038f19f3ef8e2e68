"""scripts/calibration/host_factor.py: the factor on the model's host terms that each recorded run's host ran at,
and one per group (docs/placement.md, "Batch V")."""

import json

import pytest

from tests.harness.scripts import load_script

HF = load_script("scripts/calibration/host_factor.py")


@pytest.fixture(scope="module")
def report():
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert HF.main(["--json"]) == 0
    doc = json.loads(buf.getvalue())
    return {r["run"]: r for r in doc["runs"]}, {g["group"]: g for g in doc["groups"]}


def test_batch_vs_host_ran_the_models_host_terms_about_1_4x_faster(report):
    """The two host-bound V runs both want ~0.66; one factor for the machine (0.71) puts all three within ±15%,
    where the model as fitted said +15%, +52% and +37%."""
    runs, groups = report
    assert 0.62 <= runs["g1fa-m4"]["factor"] <= 0.70 and 0.62 <= runs["g1ppo15b-m8"]["factor"] <= 0.70
    assert runs["g1fa-m4"]["error"] > 0.50
    v = groups["batch V's H100, 2026-12-07"]
    assert 0.68 <= v["factor"] <= 0.74 and all(abs(e) <= 0.15 for e in v["errors"].values())


def test_the_fit_runs_factors_and_the_one_h100_held_out_runs_one(report):
    runs, groups = report
    fit = [r["factor"] for r in runs.values() if r["role"] == "fit"]
    assert 0.74 <= min(fit) and max(fit) <= 1.2
    h100 = groups["the one-H100 grid's held-out runs, 3 machines, 2026-11-26"]
    assert 0.80 <= h100["factor"] <= 0.88 and all(abs(e) <= 0.10 for e in h100["errors"].values())


def test_a_factor_of_one_is_the_model_as_fitted(report):
    runs, _ = report
    done = HF.unbound_replays()
    for name in ("g2fa-m8", "hold-grpo3n8"):
        assert HF.step_error(done[name], 1.0) == pytest.approx(runs[name]["error"], abs=5e-4)
    assert HF.step_error(done["g1fa-m4"], 0.5) < HF.step_error(done["g1fa-m4"], 1.0)  # a faster host, less time


def test_an_unknown_run_is_named(capsys):
    assert HF.main(["--group", "x=g1fa-m4,no-such-run"]) == 2
    assert "no recorded run named no-such-run" in capsys.readouterr().err
