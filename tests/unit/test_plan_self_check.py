"""The plan checks itself: its predictions kept in the Ray job's metadata, and verl's per-step metrics held against
them (predicted vs measured, a warning past 25%), on a recorded H100 log."""

from pathlib import Path

from verl_cluster.submit.integrations import PlanInfo, plan_metadata, plan_predictions
from verl_cluster.verl_logs.verl_log import VerlProgress, describe

ROOT = Path(__file__).resolve().parents[2]
LOG = (ROOT / "tests/fixtures/verl_logs/h100_grpo_0.5b_succeeded.log").read_text()
# what the plan predicts for that run (tests/unit/test_plan_time_host.py replays it), with one figure far off
PREDICTED = {"phases_s": {"gen": 10.25, "old_log_prob": 11.96, "ref": 12.06, "update_actor": 36.87,
                          "update_weights": 0.5}, "step_s": 71.8, "save_checkpoint_s": 10.78, "host_gib": 10.0}


def test_predictions_round_trip_through_the_job_metadata():
    info = PlanInfo({"trainer.nnodes": 1}, True, {}, "placement planned", predicted=PREDICTED)
    assert plan_predictions(plan_metadata(info)) == PREDICTED
    assert plan_predictions(plan_metadata(PlanInfo({}, None, {}, "no plan"))) is None
    assert plan_predictions("not json") is None and plan_predictions(None) is None



def test_metadata_over_its_limit_stays_json_and_keeps_what_matters_most():
    """A long note and the phases by fill and by host factor past the limit: the note is cut to 300 characters
    first, then the phases by host factor go, then those by fill; the text is never cut mid-JSON (that kept no
    predictions at all)."""
    import json

    rows = lambda xs: [[x, dict(PREDICTED["phases_s"])] for x in xs]  # noqa: E731
    full = {**PREDICTED, "fill": 1.0, "tokens_full": 98304, "by_fill": rows((0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)),
            "by_host_factor": rows((0.5, 0.7, 1.0, 1.4, 2.0))}
    info = PlanInfo({"trainer.nnodes": 1}, True, {}, "why " * 400, predicted=full)
    text = plan_metadata(info, limit=1000)
    assert len(text) <= 1000 and json.loads(text)["note"].startswith("why why") and len(json.loads(text)["note"]) == 300
    kept = plan_predictions(text)
    assert "by_fill" not in kept and "by_host_factor" not in kept and kept["phases_s"] == PREDICTED["phases_s"]
    roomier = plan_predictions(plan_metadata(info, limit=1500))  # the note cut and the host table gone: room enough
    assert "by_fill" in roomier and "by_host_factor" not in roomier
    assert "by_fill" in info.predicted and "by_host_factor" in info.predicted  # the caller's plan is left whole
    assert plan_predictions(plan_metadata(info, limit=1900)) == full  # the note cut made room for both tables
    assert plan_predictions(plan_metadata(info)) == full  # under the usual limit everything is kept
    assert json.loads(plan_metadata(info))["note"] == "why " * 400


def test_follow_pairs_predicted_and_measured_after_the_warm_up():
    """Step 1 compiles: nothing to hold against. Step 2 alone is held to the plan until a later step comes; from
    then on the means leave out both warm-up steps (update_actor 36.65, 37.71, 36.24 s in steps 1-3)."""
    p = VerlProgress(predicted=PREDICTED)
    lines = LOG.split("\n")
    at = [i for i, x in enumerate(lines) if "step:" in x]
    p.feed("\n".join(lines[:at[1]]) + "\n")
    assert p.summary()["vs_plan"] == []
    p.feed("\n".join(lines[at[1]:at[2]]) + "\n")
    rows = {r["what"]: r for r in p.summary()["vs_plan"]}
    assert rows["time update_actor (s)"]["measured"] == 37.71
    p.feed("\n".join(lines[at[2]:]))
    rows = {r["what"]: r for r in p.summary()["vs_plan"]}
    assert rows["time update_actor (s)"]["measured"] == 36.24 and abs(rows["time update_actor (s)"]["error"]) < 0.02
    assert rows["host RAM per node (GiB)"]["measured"] == 29.75
    lines = describe(p.summary())
    assert any(x.startswith("verl vs plan: ") for x in lines)
    warned = [x for x in lines if x.startswith("warning:")]
    assert len(warned) == 1 and "host RAM per node" in warned[0] and "-66%" in warned[0]


def test_no_predictions_no_pairs():
    p = VerlProgress()
    p.feed(LOG)
    s = p.summary()
    assert "vs_plan" not in s and not any("vs plan" in x for x in describe(s))


def test_follow_says_time_is_held_at_the_runs_lengths():
    """A plan made at the worst case, kept with its phases by fill: the summary's lines say the fill the run had
    and hold the time there (the grid's 1.5B GRPO run: +130% against the worst case, +19% at its lengths)."""
    import json

    runs = json.loads((ROOT / "tests/fixtures/verl_runs/calibration_runs.json").read_text())["runs"]
    log = (ROOT / "tests/fixtures/verl_logs" / runs["fit-grpo15"]["logs"][0]).read_text()
    phases = {"gen": 9.0, "old_log_prob": 1.5, "ref": 1.5, "adv": 0.1, "update_actor": 3.5, "update_weights": 0.3}
    half = {k: v / 2 for k, v in phases.items()}
    predicted = {"phases_s": phases, "step_s": sum(phases.values()), "fill": 1.0, "tokens_full": 16 * 4 * 1536,
                 "by_fill": [[0.05, {k: v / 20 for k, v in phases.items()}], [0.5, half], [1.0, phases]]}
    p = VerlProgress(predicted=predicted)
    p.feed(log)
    rows = {r["what"]: r for r in p.summary()["vs_plan"]}
    fill = rows["time gen (s)"]["at_fill"]
    assert 0.25 < fill < 0.4  # 26-33k tokens a step of 98k at the worst case
    w = (fill - 0.05) / 0.45
    assert rows["time gen (s)"]["predicted"] == round(9.0 / 20 + w * (4.5 - 9.0 / 20), 2)
    lines = describe(p.summary())
    assert any(x.startswith(f"verl vs plan (time at the run's lengths, fill {fill:.2g}): ") for x in lines)


def test_the_warm_up_is_the_two_steps_from_the_first_logged():
    from verl_cluster.placement.check_run import warmup

    assert warmup(1, [1, 2]) == (1,)  # a two-step run is still held to the plan, on its second step
    assert warmup(1, [1, 2, 3]) == (1, 2) and warmup(1, range(1, 200)) == (1, 2)
    assert warmup(7, [7, 8, 9]) == (7, 8)  # a run resumed at step 7 compiles again


def test_a_phase_under_half_a_second_is_no_warning():
    """Batch Y's run on one H100 (2026-12-08): update_weights 0.30 s planned, 0.21 measured (+44%), warned as 'the
    plan's model does not hold' beside a step within 8%. A timing under half a second on both sides is left out of
    the warnings (its percent is jitter; the calibration target leaves it out too); the pair stays in the line, and
    a short phase that grows past half a second is still warned."""
    from verl_cluster.verl_logs.verl_log import vs_plan_lines

    def row(what: str, predicted: float, measured: float) -> dict:
        return {"what": what, "predicted": predicted, "measured": measured, "error": predicted / measured - 1}

    rows = [row("time gen (s)", 3.95, 4.08), row("time update_weights (s)", 0.3, 0.21),
            row("time adv (s)", 0.11, 0.6), row("time step (s)", 21.37, 19.75),
            row("host RAM per node (GiB)", 0.4, 0.2)]
    lines = vs_plan_lines(rows)
    assert "time update_weights (s) 0.3 predicted / 0.21 measured (+43%)" in lines[0]
    assert [x.split(" is ")[0] for x in lines[1:]] == ["warning: time adv (s)", "warning: host RAM per node (GiB)"]
