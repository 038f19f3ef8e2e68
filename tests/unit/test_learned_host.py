"""The plan learns the machines' host speed: each planned run's host factor (check_run.host_fit, when it explained the
run) is kept by the machines it ran on (records/host_speed.py), and the next plan for those machines starts from it
(placement.host_factor: auto; placement/learned_host.py). Held on batches V and W (one H100 machine each, held out,
tests/fixtures/verl_runs/grid2_runs.json): each run planned from the factors the other runs of its machine left."""

import json
import math
from pathlib import Path

import pytest

from tests.harness.scripts import load_script
from verl_cluster.cli import main
from verl_cluster.config.job import load_job
from verl_cluster.errors import ConfigError
from verl_cluster.facts.model import GpuInfo, NodeFacts
from verl_cluster.placement import check_run, parse_gpus
from verl_cluster.placement.learned_host import machines_key, stated
from verl_cluster.records import host_speed, job_records
from verl_cluster.submit.integrations import with_host_factor
from tests.unit.test_plan_host_factor import MACHINES, replays  # noqa: F401 - the machines' runs, the fixture

ROOT = Path(__file__).resolve().parents[2]
GRPO = ROOT / "launch/gsm8k_grpo.yaml"
FACTS = ROOT / "tests/fixtures/facts"


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def _node(hostname: str, uuid: str) -> NodeFacts:
    return NodeFacts(host="10.1.0.1", hostname=hostname, gpus=[GpuInfo(0, "NVIDIA H100 80GB HBM3", 81559, uuid=uuid)])


def _key_of(facts_file: str) -> str:
    from verl_cluster.cli.plan_cmd import read_facts_file

    return machines_key(read_facts_file(str(FACTS / facts_file)))


def test_each_run_planned_from_its_machines_other_runs(replays, tmp_path):
    """W's +67.5% and +70.8% come to +6.5% and -10.5%, V's +51.7% and +36.9% to +6.8% and +13.0%, V's padded 1.5B
    (the least host-bound, its own factor 0.89 against the others' 0.59-0.65) from +15.1% to -25.2%. Each measured
    step is within the plan's range (its bar widened by a machine's own drift), and the run's host fit against the
    plan made at the learned factor is the one against the calibrated hosts' plan."""
    job = load_job(GRPO, [])
    fits = {n: check_run.host_fit(plan.predictions(), got) for n, (_, plan, got) in replays.items()}
    errors = {}
    for m, runs in MACHINES.items():
        facts = [_node(f"h100-{m}", f"GPU-{m}")]
        for n in runs:
            (Path.home() / ".verl-cluster/host_speed.json").unlink(missing_ok=True)
            for other in runs:
                if other != n:
                    assert host_speed.record(machines_key(facts), other, fits[other]["factor"])
            _, plan, got = replays[n]
            (learned,), said = with_host_factor(job, facts, plan)
            t = learned.time
            want = round(math.exp(sum(math.log(fits[o]["factor"]) for o in runs if o != n) / (len(runs) - 1)), 2)
            assert t["host_factor"] == want and said == f"host factor {want:g} from " + (
                "run" if len(runs) == 2 else f"{len(runs) - 1} runs") + " on these machines"
            assert t["step_range_s"][0] <= got["step_s"] <= t["step_range_s"][1], n
            again = check_run.host_fit(learned.predictions(), got)
            assert again["factor"] == fits[n]["factor"] and again["explains"], n
            errors[n] = (plan.time["step_s"] / got["step_s"] - 1, t["step_s"] / got["step_s"] - 1)
    assert all(before > 0.35 and abs(after) < 0.14 for n, (before, after) in errors.items() if n != "g1pad15b-m8")
    assert 0.10 < errors["g1pad15b-m8"][0] < 0.20 and -0.30 < errors["g1pad15b-m8"][1] < -0.20


def test_machines_are_named_by_hostnames_and_cards_hypothetical_hardware_by_nothing():
    a, b = _node("gpu-a", "GPU-1"), _node("gpu-b", "GPU-2")
    assert machines_key([a, b]) == machines_key([b, a]) and len(machines_key([a])) == 16
    assert machines_key([a]) != machines_key([_node("gpu-a", "GPU-3")])  # another card: another machine
    assert machines_key([a]) != machines_key([a, a])
    assert machines_key(parse_gpus("2x8xH100-80GB")) is None and machines_key([]) is None


def test_the_store_keeps_the_newest_run_once_and_reads_a_damaged_file_as_none():
    assert host_speed.record("k1", "r1", 0.6, now=100.0) and host_speed.record("k1", "r2", 0.7, now=200.0)
    assert host_speed.record("k2", "r3", 1.3, now=300.0)
    assert host_speed.record("k1", "r1", 0.65, now=400.0)  # the same run read again: one entry, its first time
    assert [(e["submission_id"], e["factor"]) for e in host_speed.for_machines("k1", 3)] == [("r2", 0.7), ("r1", 0.65)]
    assert not host_speed.record("k1", "r4", math.nan) and not host_speed.record("k1", "r4", None)
    path = host_speed.store_path()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_text("{not json")
    assert host_speed.entries() == [] and host_speed.record("k1", "r5", 0.8)
    assert [e["submission_id"] for e in host_speed.entries()] == ["r5"]


def test_a_run_is_kept_only_when_its_host_explained_it_and_its_plan_named_its_machines():
    job_records.record("raysubmit_a", str(ROOT / "cluster_configs/local.yaml"), "lab", "gsm8k-grpo")
    fit = {"factor": 0.72, "explains": True, "step_error_at_factor": -0.07}
    assert not host_speed.remember("raysubmit_a", {"phases_s": {}}, fit)  # no machines: an older plan's metadata
    assert not host_speed.remember("raysubmit_a", {"machines": "k"}, {**fit, "explains": False})
    assert not host_speed.remember("raysubmit_a", {"machines": "k"}, None)
    assert host_speed.remember("raysubmit_a", {"machines": "k"}, fit)
    (e,) = host_speed.entries()
    assert (e["machines"], e["factor"], e["job"], e["cluster"]) == ("k", 0.72, "gsm8k-grpo", "lab")


def test_submits_follow_keeps_a_recorded_runs_host_factor(tmp_path):
    """The run whose log is recorded (hold-grpo15big, a faster host than the fit's) followed to its end."""
    from verl_cluster.verl_logs.job_log import _remember_lengths
    from verl_cluster.verl_logs.verl_log import VerlProgress

    calib = load_script("scripts/calibration/calib_from_runs.py")
    entry = json.loads((ROOT / "tests/fixtures/verl_runs/calibration_runs.json").read_text())["runs"]["hold-grpo15big"]
    plan, got = calib.replay(entry, ROOT / "tests/fixtures/verl_logs", tmp_path)
    job_records.record("raysubmit_big", str(ROOT / "cluster_configs/local.yaml"), "local", "grpo15big")
    prog = VerlProgress(predicted={**plan.predictions(), "machines": "k-big"})
    prog.feed((ROOT / "tests/fixtures/verl_logs" / entry["logs"][0]).read_text())
    prog.flush()
    _remember_lengths("raysubmit_big", prog)
    (e,) = host_speed.for_machines("k-big", 3)
    _, host = prog.vs_plan_both()  # what `submit` and `jobs --json` say of the run (vs_plan_host)
    assert e["submission_id"] == "raysubmit_big" and e["factor"] == host["factor"] and host["explains"]
    assert e["factor"] < 0.8 and abs(e["factor"] - check_run.host_fit(plan.predictions(), got)["factor"]) < 0.05
    job_records.record("raysubmit_big2", str(ROOT / "cluster_configs/local.yaml"), "local", "grpo15big")
    _remember_lengths("raysubmit_big2", prog, prog.summary())  # at the run's end, from the summary follow made
    assert [(x["submission_id"], x["factor"]) for x in host_speed.for_machines("k-big", 3)] == [
        ("raysubmit_big2", e["factor"]), ("raysubmit_big", e["factor"])]


def _plan_json(capsys, *words: str) -> dict:
    assert main(["plan", str(GRPO), *words, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["time"]


def test_plan_starts_from_the_speed_kept_for_its_machines(capsys, tmp_path):
    facts = ["--facts", str(FACTS / "h100x1.json")]
    plain = _plan_json(capsys, *facts)
    assert "host_factor" not in plain  # nothing kept yet: the calibrated hosts' speed, the fastest host in the bar
    host_speed.record(_key_of("h100x1.json"), "r1", 0.6, now=100.0)
    host_speed.record(_key_of("h100x1.json"), "r2", 0.7, now=200.0)
    host_speed.record(_key_of("h200x1_recorded.json"), "r3", 1.9, now=300.0)  # another machine's run counts not
    got = _plan_json(capsys, *facts)
    f = round(math.sqrt(0.6 * 0.7), 2)
    assert got["host_factor"] == f and got["step_s"] < plain["step_s"] and "host" not in got["error_bar"]
    note = next(n for n in got["notes"] if n.startswith("host factor"))
    assert note.startswith(f"host factor {f:g} from the last 2 runs on these machines (r2 at 0.7, r1 at 0.6)")
    assert "placement.host_factor=off plans for the calibrated hosts" in note
    assert main(["plan", str(GRPO), *facts, "--brief"]) == 0
    assert f"host factor {f:g} from 2 runs on these machines" in " ".join(capsys.readouterr().err.split())

    assert _plan_json(capsys, *facts, "placement.host_factor=off") == plain
    assert "host_factor" not in _plan_json(capsys, "--gpus", "1x1xH100-80GB")  # hypothetical: nothing ran there
    said = _plan_json(capsys, *facts, "placement.host_factor=1.4")
    assert said["host_factor"] == 1.4 and said["step_s"] > plain["step_s"]
    assert any(n.startswith("host factor 1.4 from placement.host_factor") for n in said["notes"])
    file = tmp_path / "f.json"  # a factors file is the user's own word: it wins over what was learned
    file.write_text(json.dumps({"factors": {"host_factor": {"factor": 0.9, "runs": 2}}}))
    assert _plan_json(capsys, *facts, "--factors", str(file))["host_factor"] == 0.9


@pytest.mark.parametrize("value", ["fast", "3", "0.3", "nan", "-1"])
def test_a_bad_host_factor_is_bad_input_naming_the_line(value, tmp_path, capsys):
    job = tmp_path / "job.yaml"
    text = GRPO.read_text().replace("placement:\n  strategy: auto\n",
                                    f"placement:\n  strategy: auto\n  host_factor: \"{value}\"\n")
    job.write_text(text)
    line = text.splitlines().index(f"  host_factor: \"{value}\"") + 1
    with pytest.raises(ConfigError) as e:
        stated(load_job(job, []))
    assert e.value.message.startswith(f"{job}:{line}: placement.host_factor must be auto, off or a number from 0.5 "
                                      f"to 2, got {value!r}") and "vs_plan_host" in e.value.hint
    assert main(["plan", str(job), "--gpus", "1x1xH100-80GB"]) == 2
    assert "placement.host_factor must be" in capsys.readouterr().err
    assert stated(load_job(GRPO, ["placement.host_factor=OFF"])) == "off"
    assert stated(load_job(GRPO, ["placement.host_factor=0.7"])) == 0.7


def test_submits_plan_is_made_at_the_learned_factor_and_keeps_its_machines(tmp_path):
    """What `submit` keeps in the job's metadata: the phases at the learned factor (what the run is held against),
    the calibrated hosts' table, the factor and the machines (so the run's own host fit is kept for the next plan)."""
    import types

    from verl_cluster.facts.model import from_json
    from verl_cluster.submit.integrations import placement_plan, plan_metadata, plan_predictions

    facts = [from_json(NodeFacts, (FACTS / "h100x1.json").read_text())]
    spec = types.SimpleNamespace(cluster_name="none-such", nodes=())
    job = load_job(GRPO, ["data.train_files=[]"])
    plain = placement_plan(job, spec, facts)
    assert plain.predicted["machines"] == machines_key(facts) and "host_factor" not in plain.predicted
    host_speed.record(machines_key(facts), "r1", 0.6)
    info = placement_plan(job, spec, facts)
    assert info.note.startswith("placement planned") and info.note.endswith("; host factor 0.6 from run on these machines")
    kept = plan_predictions(plan_metadata(info))
    assert kept["host_factor"] == 0.6 and kept["machines"] == machines_key(facts)
    assert kept["by_host_factor"] == plain.predicted["by_host_factor"]
    assert kept["step_s"] < plain.predicted["step_s"]
    off = placement_plan(load_job(GRPO, ["data.train_files=[]", "placement.host_factor=off"]), spec, facts)
    assert off.predicted == plain.predicted and "host factor" not in off.note


def test_a_run_off_a_plan_made_at_its_machines_factor_is_told_against_that_factor(replays):
    """V's micro 4 run planned at 1.3 (a machine whose earlier runs were slow): the host explains the miss, and the
    line says the host was faster than the factor the plan was made at, not than the calibration."""
    from verl_cluster.placement.factors import HOST_FACTOR, apply_factors
    from verl_cluster.verl_logs.verl_log import host_line

    _, plan, got = replays["g1fa-m4"]
    slow = apply_factors(plan, {HOST_FACTOR: (1.3, 2, True)}, "runs here")
    fit = check_run.host_fit(slow.predictions(), got)
    assert fit["planned_at"] == 1.3 and fit["explains"] and fit["step_error"] > 0.8 and fit["factor"] < 0.8
    assert "a faster host than the 1.3 the plan was made at (placement.host_factor)" in host_line(fit)
    assert "planned_at" not in check_run.host_fit(plan.predictions(), got)
    assert "than the plan's calibration" in host_line(check_run.host_fit(plan.predictions(), got))


def test_a_plan_without_phases_at_host_factors_says_nothing_of_the_host():
    """A plan with no step time (a Megatron job's) or none kept at host factors: the learned factor is neither applied
    nor named (a factors file's note would say it was not applied; here nothing was asked for)."""
    from dataclasses import replace

    from verl_cluster.placement import plan_job

    facts = [_node("gpu-a", "GPU-1")]
    host_speed.record(machines_key(facts), "r1", 0.6)
    job = load_job(GRPO, [])
    plan = plan_job(job, facts)
    assert with_host_factor(job, facts, plan)[1] == "host factor 0.6 from run on these machines"
    for bare in (replace(plan, time=None), replace(plan, time={k: v for k, v in plan.time.items()
                                                               if k != "by_host_factor"})):
        assert with_host_factor(job, facts, bare) == ((bare,), "")


def test_runs_ending_at_once_are_all_kept():
    """Processes recording at the same moment (two shells following runs, `watch` beside `jobs --json`)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=host_speed.record, args=("k", f"r{i}", 0.6 + i / 100)) for i in range(12)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(e["submission_id"] for e in host_speed.entries()) == sorted(f"r{i}" for i in range(12))
