"""Factors from runs held against their plans: the recorded H100 runs (tests/fixtures/verl_runs, verl_logs) replayed
into the pairs `jobs --json` carries, scripts/plan_factors.py's geometric means checked by hand, and
`plan --factors` changing exactly the figures in the file."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from verl_cluster.cli import main
from verl_cluster.errors import ConfigError
from verl_cluster.job_list.job_pairs import pairs_of
from verl_cluster.placement import check_run
from verl_cluster.placement.check_run import STEP_PHASES
from verl_cluster.placement.factors import apply_factors, read_factors
from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures"


CALIB = load_script("scripts/calibration/calib_from_runs.py")
PF = load_script("scripts/plan_factors.py")
RUNS = json.loads((FIX / "verl_runs/calibration_runs.json").read_text())["runs"]
NAMES = ("fit-grpo15", "fit-ppo15", "hold-grpo3n8")  # GRPO (ref, no critic) twice, PPO (critic, no ref) once


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return {n: CALIB.replay_pairs(RUNS[n], FIX / "verl_logs", tmp_path_factory.mktemp(n)) for n in NAMES}


def row(rows, what):
    return next(r for r in rows if r["what"] == what)


def job(sid, rows, start=1):
    return {"submission_id": sid, "status": "SUCCEEDED", "start_time": start, "plan": {}, "vs_plan": rows}


def clusters(*named):
    """`jobs --json`'s document, with -c or without: (cluster name, its jobs) each."""
    return {"clusters": [{"cluster": name, "cluster_file": f"/c/{name}.yaml", "answered": True, "down": False,
                          "jobs": jobs} for name, jobs in named]}


def by_hand(*ratios):
    return math.prod(ratios) ** (1 / len(ratios))


def test_a_recorded_log_gives_the_pairs_jobs_json_carries(pairs):
    plan, _ = CALIB.replay(RUNS["fit-grpo15"], FIX / "verl_logs", Path("/nonexistent"))
    text = (FIX / "verl_logs" / RUNS["fit-grpo15"]["logs"][0]).read_text()
    got = pairs_of(text, plan.predictions())
    # the calibration replays its recorded first steps (step 1); a job's pairs leave out both warm-up steps
    steps = CALIB.progress(text.splitlines()).steps
    meas = check_run.measured(steps, (1, 2))
    assert got == {"vs_plan": check_run.pairs(plan.predictions(), meas),
                   "vs_plan_host": check_run.host_fit(plan.predictions(), meas)}
    # steps 3+ at the run's lengths: +19% over, a host faster than the fit's mix (the first H100 session's)
    assert got["vs_plan_host"]["step_error"] > 0.15 and got["vs_plan_host"]["factor"] < 0.8
    assert [r["what"] for r in got["vs_plan"]] == [r["what"] for r in pairs["fit-grpo15"]]
    assert row(got["vs_plan"], "time step (s)")["measured"] == pytest.approx(7.05 - 0.51 / 2 - 0.01, abs=0.005)
    assert row(got["vs_plan"], "time old_log_prob (s)")["measured"] == 0.5  # step 2's 1.01 s: a recompile
    first = "\n".join(line for line in text.splitlines() if "step:2 -" not in line and "step:3 -" not in line)
    assert pairs_of(first, plan.predictions())["vs_plan_reason"] == "no verl step after the first in its log yet"
    assert pairs_of("hello\n", plan.predictions()) == {"vs_plan": [], "vs_plan_reason": "no verl step in its log"}


def test_factors_are_the_geometric_mean_of_measured_over_predicted(pairs, tmp_path, capsys):
    a, b, c = (pairs[n] for n in NAMES)
    listed = tmp_path / "one.json"  # `jobs -c h100 --json`; a job without pairs is skipped
    listed.write_text(json.dumps(clusters(("h100", [job("a", a), job("b", b),
                                                     {"submission_id": "x", "status": "RUNNING"}]))))
    everywhere = tmp_path / "all.json"  # `jobs --json`: every cluster; job a is listed again, counted once
    doc = clusters(("h100", [job("a", a)]), ("a100", [job("c", c)]))
    doc["clusters"].append({"cluster": "gone", "answered": False, "down": False, "error": "no answer"})
    everywhere.write_text(json.dumps(doc))
    out = tmp_path / "factors.json"
    assert PF.main([str(listed), str(everywhere), "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads(out.read_text()) and doc["runs"] == 3
    f = doc["factors"]

    def ratio(rows, what):
        return 1 / (1 + row(rows, what)["error"])

    gen = [ratio(x, "time gen (s)") for x in (a, b, c)]
    assert f["gen"]["factor"] == pytest.approx(by_hand(*gen), abs=1e-4)
    assert (f["gen"]["runs"], f["gen"]["min"], f["gen"]["max"]) == (3, round(min(gen), 4), round(max(gen), 4))
    # the same, near enough, from the rounded seconds: fit-grpo15 4.05/4.56, fit-ppo15 3.08/4.06, grpo3n8 4.55/5.78
    assert f["gen"]["factor"] == pytest.approx(by_hand(4.05 / 4.56, 3.08 / 4.06, 4.55 / 5.78), rel=0.01)
    assert f["ref"]["runs"] == 2 and f["ref"]["enough"]  # the two GRPO runs have a ref, the PPO run none
    assert f["ref"]["factor"] == pytest.approx(by_hand(ratio(a, "time ref (s)"), ratio(c, "time ref (s)")), abs=1e-4)
    assert f["host_gib"]["factor"] == pytest.approx(
        by_hand(*(ratio(x, "host RAM per node (GiB)") for x in (a, b, c))), abs=1e-4)
    assert f["step"]["runs"] == 3
    for name in ("values", "update_critic"):  # the PPO run only: shown, not enough
        assert f[name]["runs"] == 1 and not f[name]["enough"]
    assert "save_checkpoint_s" not in f  # save_freq off in these runs
    assert PF.main([str(listed), str(everywhere)]) == 0
    text = capsys.readouterr().out
    assert "values" in text and "not enough (fewer than 2 runs)" in text and "from 3 job(s)" in text


def test_stdin_and_bad_documents(pairs, tmp_path, capsys, monkeypatch):
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps([job("a", pairs["fit-ppo15"])])))
    assert PF.main(["-", "--json"]) == 0  # a bare list: what `jobs -c X --json` printed before, still read
    assert json.loads(capsys.readouterr().out)["factors"]["gen"]["runs"] == 1
    bad = tmp_path / "bad.json"
    bad.write_text("[{]")
    assert PF.main([str(bad)]) == 2
    assert f"{bad}: invalid JSON" in capsys.readouterr().err
    bad.write_text('{"jobs": []}')
    assert PF.main([str(bad)]) == 2 and "not `verl-cluster jobs --json` output" in capsys.readouterr().err
    assert PF.main([str(tmp_path / "missing.json")]) == 2 and "cannot read" in capsys.readouterr().err
    bad.write_text('{"error": {"message": "`/x.yaml`: no such file", "hint": null, "exit_code": 2}}')
    assert PF.main([str(bad)]) == 2  # `jobs --json` that failed: its message, not "not jobs output"
    assert f"{bad}: `jobs --json` failed: `/x.yaml`: no such file" in capsys.readouterr().err


def plan_json(capsys, *extra):
    assert main(["plan", str(ROOT / "launch/gsm8k_grpo.yaml"), "--gpus", "1x1xH100", "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_with_factors_changes_exactly_the_figures_named(pairs, tmp_path, capsys):
    out = tmp_path / "factors.json"
    a, b, c = (pairs[n] for n in NAMES)
    assert PF.main([str(_doc(tmp_path, [job("a", a), job("b", b), job("c", c)])), "--out", str(out)]) == 0
    capsys.readouterr()
    f = json.loads(out.read_text())["factors"]
    before, after = plan_json(capsys), plan_json(capsys, "--factors", str(out))
    t0, t1 = before["time"], after["time"]
    assert set(t0["phases_s"]) == set(t1["phases_s"])
    for name, v in t0["phases_s"].items():
        want = v * f[name]["factor"] if name in f and f[name]["enough"] else v
        assert t1["phases_s"][name] == pytest.approx(want, abs=0.006), name
    assert t1["phases_s"]["gen"] != t0["phases_s"]["gen"]
    assert t1["step_s"] == pytest.approx(sum(t1["phases_s"].values()), abs=0.01)
    h = f["host_gib"]["factor"]
    assert after["host_gib_per_node"] == pytest.approx(before["host_gib_per_node"] * h, abs=0.01)
    assert after["host_steady_gib_per_node"] == pytest.approx(before["host_steady_gib_per_node"] * h, abs=0.01)
    note = t1["notes"][-1]
    assert note.startswith(f"factors from {out} applied: gen x{f['gen']['factor']:g} (3 runs)")
    assert "not applied, fewer than 2 runs: values, update_critic" in note and "step is the sum" in note
    # what is not time or host RAM is the same plan
    for key in ("overrides", "roles", "gpus", "feasible", "settings"):
        assert after[key] == before[key], key


def _doc(tmp_path, jobs):
    p = tmp_path / "jobs.json"
    p.write_text(json.dumps(clusters(("h100", jobs))))
    return p


def test_the_self_check_predictions_agree_with_the_plan_shown(tmp_path):
    from verl_cluster.config.job import load_job
    from verl_cluster.placement import parse_gpus, plan_job

    plan = plan_job(load_job(ROOT / "launch/gsm8k_grpo.yaml"), parse_gpus("1x1xH100"), fill=0.5)
    p = tmp_path / "f.json"
    p.write_text(json.dumps({"factors": {"update_actor": {"factor": 0.8, "runs": 4}, "host_gib": 1.25,
                                         "ref": {"factor": 3.0, "runs": 1}}}))
    got = apply_factors(plan, read_factors(str(p)), str(p))
    before, after = plan.predictions(), got.predictions()
    assert after["phases_s"]["update_actor"] == pytest.approx(before["phases_s"]["update_actor"] * 0.8, abs=0.006)
    assert after["phases_s"]["ref"] == before["phases_s"]["ref"]  # one run: not applied
    assert after["step_s"] == got.time["step_s"] == pytest.approx(sum(after["phases_s"].values()), abs=0.01)
    assert after["host_gib"] == pytest.approx(before["host_gib"] * 1.25, abs=0.01)
    for (f0, x0), (f1, x1) in zip(before["by_fill"], after["by_fill"]):  # read at the run's own lengths too
        assert f0 == f1
        assert x1["update_actor"] == pytest.approx(x0["update_actor"] * 0.8, abs=0.006)
        assert {k: v for k, v in x1.items() if k != "update_actor"} == pytest.approx(
            {k: v for k, v in x0.items() if k != "update_actor"}, abs=0.006)
    assert set(STEP_PHASES) >= set(after["phases_s"])
    # host RAM over the node's with the factor: said as a warning
    from dataclasses import replace

    tight = apply_factors(replace(plan, host_mem_gib=plan.host_gib_per_node * 1.1), read_factors(str(p)), str(p))
    assert any("with the factors applied is over the" in w for w in tight.warnings)
    assert not any("factors applied" in w for w in got.warnings)


def test_brief_names_the_factors_applied(tmp_path, capsys):
    p = tmp_path / "f.json"
    p.write_text(json.dumps({"factors": {"gen": {"factor": 2.0, "runs": 3}, "adv": {"factor": 1.5, "runs": 1}}}))
    args = ["plan", str(ROOT / "launch/gsm8k_grpo.yaml"), "--gpus", "1x1xH100", "--brief"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--factors", str(p)]) == 0
    got = capsys.readouterr()
    assert f"factors from {p} applied: gen x2 (3 runs); not applied, fewer than 2 runs: adv" in " ".join(got.err.split())
    step = [float(x.split("~")[1].split(" s/step")[0]) for x in (plain, got.out)]
    assert step[1] > step[0] * 1.2  # gen is the largest phase: doubled, the step grows with it


@pytest.mark.parametrize("text,field", [
    ("{", "invalid JSON"),
    ('{"facts": {}}', "expected an object with `factors`"),
    ('{"factors": {"gen": {"factor": -1, "runs": 3}}}', "factors.gen.factor: must be a positive number, got -1"),
    ('{"factors": {"gen": "fast"}}', 'factors.gen.factor: must be a positive number, got "fast"'),
    ('{"factors": {"gen": {"factor": 1.1, "runs": "x"}}}', "factors.gen.runs: must be a whole number"),
    ('{"factors": {"warp": 1.1}}', "factors.warp: not a figure the plan predicts"),
])
def test_bad_factors_files_are_refused_naming_the_file_and_field(tmp_path, text, field):
    p = tmp_path / "f.json"
    p.write_text(text)
    with pytest.raises(ConfigError) as e:
        read_factors(str(p))
    assert str(p) in e.value.message and field in e.value.message


def test_plan_refuses_a_bad_factors_file_with_exit_2(tmp_path):
    env_home = tmp_path / "home"
    p = tmp_path / "f.json"
    p.write_text('{"factors": {"gen": 0}}')
    for path, why in ((p, "factors.gen.factor: must be a positive number, got 0"), (tmp_path / "no.json", "not found")):
        r = subprocess.run([sys.executable, "-m", "verl_cluster", "plan", "launch/gsm8k_grpo.yaml", "--gpus",
                            "1x1xH100", "--factors", str(path)], capture_output=True, text=True, cwd=ROOT,
                           env={"HOME": str(env_home), "PATH": "/usr/bin:/bin"}, timeout=120)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and path.name in r.stderr and why in r.stderr


def test_a_job_names_its_factors_and_submit_keeps_the_scaled_predictions(tmp_path, capsys):
    """placement.factors in the job (relative to the job file): plan applies it as --factors does, and the
    predictions submit keeps with the job (integrations.placement_plan) are the scaled ones."""
    import types

    from verl_cluster.cli import main
    from verl_cluster.config.job import load_job
    from verl_cluster.submit.integrations import placement_plan

    (tmp_path / "mine.json").write_text(json.dumps({"factors": {"gen": {"factor": 1.5, "runs": 3}}}))
    job_file = tmp_path / "job.yaml"
    job_file.write_text((ROOT / "launch/gsm8k_grpo.yaml").read_text() + "\n")
    with_f = ["placement.factors=mine.json"]
    args = ["plan", str(job_file), "--gpus", "1x1xH100-80GB", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["time"]
    assert main(args + with_f) == 0
    scaled = json.loads(capsys.readouterr().out)["time"]
    assert scaled["phases_s"]["gen"] == pytest.approx(plain["phases_s"]["gen"] * 1.5, abs=0.01)
    assert scaled["phases_s"]["update_actor"] == plain["phases_s"]["update_actor"]
    assert any("mine.json applied: gen x1.5 (3 runs)" in n for n in scaled["notes"])
    # submit's plan: the facts of one H100 as recorded, the job's factors applied to what the run is held against
    from verl_cluster.facts.model import NodeFacts, from_json

    facts = [from_json(NodeFacts, (ROOT / "tests/fixtures/facts/h100x1.json").read_text())]
    job = load_job(job_file, with_f + ["data.train_files=[]"])
    spec = types.SimpleNamespace(cluster_name="none-such", nodes=())
    info = placement_plan(job, spec, facts)
    plain_info = placement_plan(load_job(job_file, ["data.train_files=[]"]), spec, facts)
    if info.predicted and plain_info.predicted:
        assert info.predicted["phases_s"]["gen"] == pytest.approx(plain_info.predicted["phases_s"]["gen"] * 1.5,
                                                                  abs=0.01)
    else:
        pytest.fail(f"no predictions: {info.note} / {plain_info.note}")
    # a job naming a missing file: a clear error, exit 2
    assert main(["plan", str(job_file), "--gpus", "1x1xH100-80GB", "placement.factors=gone.json"]) == 2
    assert "gone.json" in capsys.readouterr().err
