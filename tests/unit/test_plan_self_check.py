"""The plan checks itself: its predictions kept in the Ray job's metadata, and verl's per-step metrics held against
them (predicted vs measured, a warning past 25%), on a recorded H100 log."""

from pathlib import Path

from verl_cluster.launch.integrations import PlanInfo, plan_metadata, plan_predictions
from verl_cluster.launch.verl_log import VerlProgress, describe

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


def test_follow_pairs_predicted_and_measured_after_the_first_step():
    p = VerlProgress(predicted=PREDICTED)
    first = LOG.split("\n")
    p.feed("\n".join(first[:1]) + "\n")  # step 1 only: compiling, nothing to hold against yet
    assert p.summary()["vs_plan"] == []
    p.feed("\n".join(first[1:]))
    rows = {r["what"]: r for r in p.summary()["vs_plan"]}
    assert rows["time update_actor (s)"]["measured"] == 36.98 and abs(rows["time update_actor (s)"]["error"]) < 0.01
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
