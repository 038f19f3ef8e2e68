"""A job's log read on a real Ray (the session's shared cluster: the head behind an SSH tunnel, its dashboard
agent reached through the head): following makes no whole-log request and each poll moves only what the job wrote
since the last one; a reader started again resumes at its stored offset; `jobs --json` keeps a finished job's
pairs in its record and does not read its log again. One job (a few MB at once, a recorded verl run's lines, then
a line a second) serves every test. Runs with a HOME of its own."""

from __future__ import annotations

import io
import json
import sys
import time
import uuid
from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.verl_logs import job_log
from verl_cluster.records import job_records
from verl_cluster.jobs import ray_jobs
from verl_cluster.submit.integrations import PlanInfo, plan_metadata, plan_predictions
from verl_cluster.job_list.job_pairs import pairs_of
from verl_cluster.jobs.request import RayJobRequest
from tests.harness.scripts import load_script

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests/fixtures"
BURST_LINES, TICKS = 30_000, 6  # ~3 MB at once, then a line a second

JOB = """
import sys, time
sys.stdout.write(("(WorkerDict pid=7) " + "n" * 80 + "\\n") * {burst})
sys.stdout.write(open({log!r}).read())
sys.stdout.flush()
for i in range({ticks}):
    time.sleep(1)
    print("tick", i, flush=True)
"""


@pytest.fixture(scope="module")
def planned_job(shared_cluster, tmp_path_factory):
    """(cluster file, submission id, the pairs its log gives) of a running job with a plan in its metadata."""
    calib = load_script("scripts/calibration/calib_from_runs.py")
    entry = json.loads((FIX / "verl_runs/calibration_runs.json").read_text())["runs"]["fit-grpo15"]
    plan, _ = calib.replay(entry, FIX / "verl_logs", tmp_path_factory.mktemp("replay"))
    meta = plan_metadata(PlanInfo({}, True, {}, "placement planned", predicted=plan.predictions()))
    log = FIX / "verl_logs" / entry["logs"][0]
    want = pairs_of(log.read_text(), plan_predictions(meta))["vs_plan"]
    sid = f"logscale-{uuid.uuid4().hex[:8]}"
    code = JOB.format(burst=BURST_LINES, log=str(log), ticks=TICKS)
    req = RayJobRequest(sid, [sys.executable, "-c", code], {}, {"verl_cluster.job": "logscale",
                                                                "verl_cluster.plan": meta})
    with ray_jobs.connect(load_cluster(shared_cluster.path)) as api:
        ray_jobs.submit(api, req)
    return shared_cluster.path, sid, want


def _finished(api, sid: str, timeout: float = 120.0) -> str:
    """The job's status once it ended: a test may run where the follow test did not, or after the module's job was
    submitted again (xdist runs the shared cluster's tests of several modules on one worker, interleaved)."""
    deadline = time.monotonic() + timeout
    while (status := ray_jobs.job_info(api, sid).status) not in ray_jobs.TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
    return status


def _record_fetches(monkeypatch) -> list[tuple[int, int, int, str]]:
    """(start, bytes, log size, job) of every range a reader fetches; the Jobs SDK's whole-log calls fail the test."""
    seen: list[tuple[int, int, int, str]] = []
    fetch = job_log.AgentLog.fetch

    def recording(self, start, limit=job_log.CHUNK):
        data, size = fetch(self, start, limit)
        seen.append((start, len(data), size, self.sid))
        return data, size

    monkeypatch.setattr(job_log.AgentLog, "fetch", recording)
    from ray.job_submission import JobSubmissionClient

    def whole(*a, **k):
        raise AssertionError("the whole log was asked for")

    monkeypatch.setattr(JobSubmissionClient, "get_job_logs", whole)
    monkeypatch.setattr(JobSubmissionClient, "tail_job_logs", whole)
    return seen


def test_following_fetches_only_what_the_job_wrote_since_the_last_poll(planned_job, home, monkeypatch):
    path, sid, _ = planned_job
    seen = _record_fetches(monkeypatch)
    out = io.StringIO()
    with ray_jobs.connect(load_cluster(path)) as api:
        res = job_log.follow(api, sid, out=out, status_out=io.StringIO(), poll_s=0.5)
    assert res.status == "SUCCEEDED", res.tail
    text = out.getvalue()
    assert text.count("n" * 80) == BURST_LINES and text.endswith(f"tick {TICKS - 1}\n")
    got = [s[:3] for s in seen if s[2] is not None and s[3] == sid]
    size = got[-1][2]
    assert res.stats.bytes == size == len(text.encode())  # every byte fetched once
    offset = 0
    for start, n, _ in got:
        assert start == offset, got  # each range starts where the last one ended: nothing read twice
        offset += n
    # a poll after one that was level with the log moves exactly what the job wrote in between (a chunk at most)
    after_level = [(n1, size1 - size0) for (s0, n0, size0), (s1, n1, size1) in zip(got, got[1:]) if s0 + n0 == size0]
    assert all(n == min(job_log.CHUNK, written) for n, written in after_level), after_level
    assert sum(1 for n, _ in after_level if 0 < n <= 64) >= TICKS - 1, after_level  # the ticks: a line each


def test_a_reader_started_again_resumes_at_its_offset(planned_job, home, monkeypatch, tmp_path):
    from verl_cluster.watch.detect import LogTracker
    from verl_cluster.watch.progress import read_progress

    path, sid, _ = planned_job
    with ray_jobs.connect(load_cluster(path)) as api:
        assert _finished(api, sid) == "SUCCEEDED"
        state = tmp_path / f"log-{sid}.json"
        first = LogTracker(job_log.AgentLog(api, sid), state)
        first.update(limit=(BURST_LINES * 100) // 2)  # half the burst, then the watcher "dies"
        first.save()
        seen = _record_fetches(monkeypatch)
        second = LogTracker(job_log.AgentLog(api, sid), state)
        assert second.resumed_at == first.follower.line_offset > 0
        while True:
            second.update()
            if not second.behind:
                break
        second.finish()
    starts = [s[0] for s in seen]
    assert min(starts) >= second.resumed_at - (256 << 10) and 0 not in starts  # never from byte 0
    log = (FIX / "verl_logs/h100_fit-grpo15.log").read_text()
    assert second.progress.steps == read_progress(log).steps and second.verl.summary()["steps"] == 3
    assert second.tail[-1] == f"tick {TICKS - 1}"


def test_jobs_json_keeps_a_finished_jobs_pairs_in_its_record(planned_job, home, monkeypatch, capsys):
    from verl_cluster.cli import main

    path, sid, want = planned_job
    spec = load_cluster(path)
    with ray_jobs.connect(spec) as api:
        assert _finished(api, sid) == "SUCCEEDED"
    job_records.record(sid, str(path), spec.cluster_name, "logscale")
    seen = _record_fetches(monkeypatch)
    assert main(["jobs", "--json", "-c", str(path)]) == 0
    jobs = {j["submission_id"]: j for j in json.loads(capsys.readouterr().out)["clusters"][0]["jobs"]}
    assert jobs[sid]["vs_plan"] == want and want
    final = job_records.lookup(sid)["vs_plan_final"]  # the pairs, and whether the host explains a miss
    assert seen and final["vs_plan"] == want and set(final) <= {"vs_plan", "vs_plan_host"}
    assert final.get("vs_plan_host") == jobs[sid].get("vs_plan_host")
    seen.clear()
    t0 = time.monotonic()
    assert main(["jobs", "--json", "-c", str(path)]) == 0
    jobs = {j["submission_id"]: j for j in json.loads(capsys.readouterr().out)["clusters"][0]["jobs"]}
    # from the record: its log not read again (other tests' planned jobs on the shared cluster may be read)
    assert jobs[sid]["vs_plan"] == want and [x for x in seen if x[3] == sid] == []
    assert time.monotonic() - t0 < 10
