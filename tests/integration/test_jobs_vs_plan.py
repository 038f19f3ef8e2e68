"""`jobs --json` on the session's shared cluster: a job submitted with a plan's predictions in its metadata, whose
output is a recorded verl run's log (tests/fixtures/verl_logs), is listed with its predicted vs measured pairs.
Runs with a HOME of its own."""

import json
import time
import uuid
from pathlib import Path

import pytest

from tests.harness.cli import run_cli
from verl_cluster.config.cluster import load_cluster
from verl_cluster.records import host_speed, job_records
from verl_cluster.jobs import ray_jobs
from verl_cluster.submit.integrations import PlanInfo, plan_metadata, plan_predictions
from verl_cluster.job_list.job_pairs import pairs_of
from verl_cluster.jobs.request import RayJobRequest
from tests.harness.scripts import load_script

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures"


def test_jobs_json_carries_the_pairs_of_a_planned_job(shared_cluster, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    calib = load_script("scripts/calibration/calib_from_runs.py")
    entry = json.loads((FIX / "verl_runs/calibration_runs.json").read_text())["runs"]["fit-grpo15"]
    plan, _ = calib.replay(entry, FIX / "verl_logs", tmp_path)
    predicted = {**plan.predictions(), "machines": "k-shared"}  # as submit's plan names the machines it is for
    meta = plan_metadata(PlanInfo({}, True, {}, "placement planned", predicted=predicted))
    log = FIX / "verl_logs" / entry["logs"][0]
    want = pairs_of(log.read_text(), plan_predictions(meta))["vs_plan"]  # what the metadata kept, held to the log
    assert any(r["what"] == "time step (s)" for r in want)

    sid = f"vsplan-{uuid.uuid4().hex[:8]}"
    req = RayJobRequest(sid, ["cat", str(log)], {}, {"verl_cluster.job": "vsplan", "verl_cluster.plan": meta})
    with ray_jobs.connect(load_cluster(shared_cluster.path)) as api:
        ray_jobs.submit(api, req)
        deadline = time.monotonic() + 120
        while (status := ray_jobs.job_info(api, sid).status) not in ray_jobs.TERMINAL and time.monotonic() < deadline:
            time.sleep(0.5)
    assert status == "SUCCEEDED"

    r = run_cli("jobs", "--json", "-c", shared_cluster.path, env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr[-2000:]
    (cluster,) = json.loads(r.stdout)["clusters"]  # with -c the same shape as without (docs/cli.md)
    jobs = {j["submission_id"]: j for j in cluster["jobs"]}
    assert jobs[sid]["vs_plan"] == want and "vs_plan_reason" not in jobs[sid]
    assert jobs[sid]["plan"]["predicted"] == plan_predictions(meta)  # an object, not JSON inside a string
    assert all("vs_plan" not in j for j in jobs.values() if not (j["plan"] or {}).get("predicted"))
    # the run ended: its host factor is kept for the next plan on its machines (records/host_speed.py)
    assert jobs[sid]["vs_plan_host"]["explains"]
    assert [(e["submission_id"], e["factor"]) for e in host_speed.for_machines("k-shared", 3)] == [
        (sid, jobs[sid]["vs_plan_host"]["factor"])]
    r = run_cli("jobs", "-c", shared_cluster.path, env={"HOME": str(home), "COLUMNS": "250"})  # the table as before
    assert r.returncode == 0 and sid in r.stdout and "vs_plan" not in r.stdout, r.stderr[-2000:]

    # a log not read within --timeout: no pairs and the reason, never a traceback
    r = run_cli("jobs", "--json", "-c", shared_cluster.path, "--timeout", "0.001", env={"HOME": str(home)})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    late = next(j for j in json.loads(r.stdout)["clusters"][0]["jobs"] if j["submission_id"] == sid)
    assert late["vs_plan"] == [] and late["vs_plan_reason"] == "its log was not read within 0.001s (--timeout)"

    # without -c, every cluster known here: the same pairs in the {"clusters": [...]} form
    job_records.record_cluster(load_cluster(shared_cluster.path).cluster_name, str(shared_cluster.path))
    r = run_cli("jobs", "--json", "--timeout", "60", env={"HOME": str(home)}, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    (cluster,) = json.loads(r.stdout)["clusters"]
    assert next(j for j in cluster["jobs"] if j["submission_id"] == sid)["vs_plan"] == want
