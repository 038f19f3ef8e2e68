"""The watch loop's decisions, with fakes only where Ray would answer (an attempt's outcome, the heal, the
resubmission): what is retried, what stops the run, what the run record says."""

from pathlib import Path

import pytest

from verl_cluster.config.cluster import load_cluster
from verl_cluster.submit.job_input import JobInput
from verl_cluster.watch import runs
from verl_cluster.watch.events import Reporter
from verl_cluster.watch.failures import diagnose
from verl_cluster.watch.progress import read_progress
from verl_cluster.watch.settings import WatchSettings
from verl_cluster.watch.watcher import Outcome, Watcher

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "verl_logs"
ROOT = Path(__file__).resolve().parent.parent.parent


def _watcher(tmp_path, monkeypatch, outcomes):
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = load_cluster(str(ROOT / "cluster_configs" / "local.yaml"))
    ji = JobInput.from_words(str(ROOT / "launch" / "resumable.yaml"), [])
    st = runs.new_run("r", spec.cluster_name, str(ROOT / "cluster_configs" / "local.yaml"), ji)
    settings = WatchSettings(max_restarts=3, backoff_s=0, backoff_max_s=0, hang_after_s=60, allow_fewer_nodes=False,
                             node_wait_s=1, notify=())
    w = Watcher(st, spec, ji.job(), settings, Reporter(st.dir / "events.jsonl", say=lambda _: None))
    seq = iter(outcomes)
    monkeypatch.setattr(w, "watch_attempt", lambda sid: next(seq))
    monkeypatch.setattr(w, "heal", lambda: spec)
    monkeypatch.setattr(w, "_clean_slate", lambda sid, jid: None)

    def resubmit(spec, waited):
        sid = f"r-r{len(st.attempts)}"
        st.attempts.append({"submission_id": sid})
        st.restarts += 1
        return sid

    monkeypatch.setattr(w, "resubmit", resubmit)
    monkeypatch.setattr(w.monitor, "close", lambda: None)
    return w, st


def _failed(log: str, progress_text: str = "") -> Outcome:
    lines = log.splitlines()
    p = read_progress(progress_text or log)
    return Outcome("FAILED", diagnose(lines, "", made_progress=p.first_step is not None), tail=lines[-5:], progress=p)


def _verl(text: str, predicted=None):
    """The attempt's verl progress as the watcher's reader leaves it (fed as the log streams, steps folded)."""
    from verl_cluster.verl_logs.verl_log import KEEP_STEPS, VerlProgress

    p = VerlProgress(predicted=predicted, keep_steps=KEEP_STEPS)
    p.feed(text)
    return p


KILLED = (LOGS / "h100_grpo_tiny_worker_killed.log").read_text()
RESUMED = (LOGS / "h100_grpo_tiny_resumed.log").read_text()
STARTUP_DEATH = ("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
                 "\tclass_name: TaskRunnerV1\n\tpid: 11\n\tip: 10.0.0.2\n"
                 "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR\n")


def test_a_killed_worker_is_resumed_and_the_record_says_how(tmp_path, monkeypatch):
    w, st = _watcher(tmp_path, monkeypatch, [_failed(KILLED), Outcome("SUCCEEDED", progress=read_progress(RESUMED))])
    assert w.run() == 0
    a, b = st.attempts
    assert a["class"] == "worker-died" and a["checkpoint"] == 2 and a["steps_lost"] == 0 and a["last_step"] == 2
    assert b["resumed_from"] == 2 and b["first_step"] == 3 and b["status"] == "SUCCEEDED"
    assert st.state == "succeeded" and st.restarts == 1


def test_the_same_failure_before_any_step_stops_the_run(tmp_path, monkeypatch):
    """The first try on the GPU spent its whole budget on a failure that repeated within seconds."""
    w, st = _watcher(tmp_path, monkeypatch, [_failed(KILLED), _failed(STARTUP_DEATH), _failed(STARTUP_DEATH),
                                             pytest.fail])
    assert w.run() == 1
    assert st.state == "failed" and st.restarts == 2 and len(st.attempts) == 3
    events = (st.dir / "events.jsonl").read_text()
    assert "the same failure as the attempt before it, before any step ran" in events


def test_a_repeat_after_progress_is_retried(tmp_path, monkeypatch):
    ran = "step:3 - a:1.0\n"
    w, st = _watcher(tmp_path, monkeypatch, [_failed(STARTUP_DEATH), _failed(STARTUP_DEATH + ran, ran),
                                             Outcome("SUCCEEDED")])
    assert w.run() == 0 and st.restarts == 2


def test_verl_refusing_the_command_is_not_retried(tmp_path, monkeypatch):
    refused = (LOGS / "h100_grpo_tiny_hydra_refused.log").read_text()
    w, st = _watcher(tmp_path, monkeypatch, [_failed(refused)])
    assert w.run() == 1 and st.state == "failed" and st.restarts == 0
    assert "not retried" in (st.dir / "events.jsonl").read_text()


def test_the_budget_bounds_different_failures(tmp_path, monkeypatch):
    outs = [_failed(KILLED), _failed(KILLED.replace("step:1", "step:5").replace("step:2", "step:6"))] * 3
    w, st = _watcher(tmp_path, monkeypatch, outs)
    assert w.run() == 1 and st.state == "gave-up" and st.restarts == 3


def test_a_watched_attempt_keeps_the_lengths_verl_logged(tmp_path, monkeypatch):
    """The next plan of the job uses them (submit's follow keeps them too; a watched run never follows)."""
    from verl_cluster.records import job_records, length_store

    w, st = _watcher(tmp_path, monkeypatch, [])
    job_records.record("r-r1", st.cluster_file, "local", "gsm8k-grpo")
    w._after_attempt("r-r1", _verl(RESUMED))
    kept = length_store.lookup("gsm8k-grpo")
    assert kept and kept["response_length_mean"] > 0 and kept["prompt_length_mean"] > 60


def test_a_watched_attempt_keeps_the_host_speed_it_showed(tmp_path, monkeypatch):
    """The machines' host factor (records/host_speed.py), for the next plan on them, as submit's follow keeps it."""
    import json

    from tests.harness.scripts import load_script
    from verl_cluster.records import host_speed, job_records

    w, st = _watcher(tmp_path, monkeypatch, [])
    entry = json.loads((ROOT / "tests/fixtures/verl_runs/calibration_runs.json").read_text())["runs"]["hold-grpo3n8"]
    plan, _ = load_script("scripts/calibration/calib_from_runs.py").replay(entry, LOGS, tmp_path / "replay")
    job_records.record("r-h", st.cluster_file, "local", "grpo3n8")
    progress = _verl((LOGS / entry["logs"][0]).read_text(), {**plan.predictions(), "machines": "k-3b"})
    w._after_attempt("r-h", progress)
    (kept,) = host_speed.for_machines("k-3b", 3)
    assert kept["submission_id"] == "r-h" and kept["factor"] == progress.vs_plan_both()[1]["factor"] < 0.9


def test_a_watched_attempt_is_held_against_its_plan(tmp_path, monkeypatch):
    """As `submit`'s follow does: the plan's predictions kept in the job's metadata against what verl logged,
    one event with the pairs and a warning line for each figure off by more than 25%."""
    import json

    from verl_cluster.submit.integrations import PlanInfo, plan_metadata, plan_predictions

    w, st = _watcher(tmp_path, monkeypatch, [])
    measured = {"gen": 4.05, "old_log_prob": 0.5, "ref": 0.43, "update_actor": 1.48}  # the 1.5B GRPO run's step 3
    runs_ = json.loads((ROOT / "tests/fixtures/verl_runs/calibration_runs.json").read_text())["runs"]
    log = (LOGS / runs_["fit-grpo15"]["logs"][0]).read_text()
    predicted = {"phases_s": {**measured, "gen": 8.1}, "step_s": 10.8}  # gen twice what it was, the rest right
    meta = plan_metadata(PlanInfo({}, True, {}, "planned", predicted=predicted))
    w._after_attempt("r", _verl(log, plan_predictions(meta)))
    ev = [json.loads(x) for x in (st.dir / "events.jsonl").read_text().splitlines()]
    vs = [e for e in ev if e["action"] == "verl vs plan"]
    assert len(vs) == 1 and "time gen (s) 8.1 predicted / 4.05 measured (+100%)" in vs[0]["evidence"]
    assert vs[0]["lines"][0] == ("warning: time gen (s) is +100% off the plan (more than 25%): the plan's model "
                                 "does not hold for this run")
    assert [x.split(" is ")[0] for x in vs[0]["lines"]] == ["warning: time gen (s)", "warning: time step (s)"]
    w._after_attempt("r", _verl(log))  # a job submitted without a plan: nothing to hold it against
    assert len((st.dir / "events.jsonl").read_text().splitlines()) == len(ev)
    # a plan 1.6x over on every phase, all of it the host's: the line says the host explains it, at ~1/1.6
    slow = {k: 1.6 * v for k, v in measured.items()}
    table = [[h, {k: v * h for k, v in slow.items()}] for h in (0.5, 0.7, 1.0, 1.4, 2.0)]
    meta = plan_metadata(PlanInfo({}, True, {}, "planned", predicted={"phases_s": slow, "step_s": 10.8,
                                                                     "by_host_factor": table}))
    w._after_attempt("r2", _verl(log, plan_predictions(meta)))
    vs = [json.loads(x) for x in (st.dir / "events.jsonl").read_text().splitlines()][-1]
    assert vs["action"] == "verl vs plan" and vs["lines"][-1].startswith("the host explains it: ")
    assert "0.6" in vs["lines"][-1].split(" at ")[1][:5] and "a faster host" in vs["lines"][-1]


def test_fewer_nodes_reshards_the_checkpoint_or_is_refused_with_the_reason(tmp_path, monkeypatch):
    """verl loads the files of the world size it runs on: continuing on fewer GPUs needs the checkpoint for them.
    verl 0.9.1's default FSDP1 checkpoint (the real one from the H100, copied) is resharded for 2 GPUs; one that
    cannot be (per-rank dataloader states) makes the run wait for the node instead, and says why."""
    import dataclasses
    import shutil

    w, _ = _watcher(tmp_path, monkeypatch, [])
    ckpt = tmp_path / "ckpt"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "verl_ckpt_ws1", ckpt)
    w.job = dataclasses.replace(w.job, overrides={**w.job.overrides, "trainer.default_local_dir": str(ckpt)})
    ok, why = w._reshard_for(2)
    assert ok and "resharded the newest checkpoint to 2 GPUs" in why
    assert (ckpt / "global_step_2" / "actor" / "model_world_size_2_rank_1.pt").is_file()
    (ckpt / "global_step_2" / "data_0.pt").write_bytes(b"x")
    ok, why = w._reshard_for(3)
    assert not ok and "cannot be resumed on 3 GPUs" in why and "per-rank dataloader" in why
    assert w._reshard_for(0) == (True, "")  # a CPU run: no per-GPU files to match


def test_a_watched_attempt_says_its_time_left_from_step_2_at_most_every_10_minutes(tmp_path, monkeypatch):
    """The watcher's own loop (watch_attempt) reading the attempt's log from the agent stand-in as verl writes it:
    no 'eta' event while only step 1 is in, one at step 2 (events.jsonl, the terminal, notify), none at steps 3
    and 4 that follow within 10 minutes."""
    import json
    import threading
    import time

    from tests.unit.agent_log_server import AgentLogServer, fake_api

    monkeypatch.setenv("HOME", str(tmp_path))
    spec = load_cluster(str(ROOT / "cluster_configs" / "local.yaml"))
    ji = JobInput.from_words(str(ROOT / "launch" / "resumable.yaml"), [])
    st = runs.new_run("r", spec.cluster_name, str(ROOT / "cluster_configs" / "local.yaml"), ji)
    settings = WatchSettings(max_restarts=3, backoff_s=0, backoff_max_s=0, hang_after_s=60, allow_fewer_nodes=False,
                             node_wait_s=1, notify=(), poll_s=0.02)
    said = []
    w = Watcher(st, spec, ji.job(), settings, Reporter(st.dir / "events.jsonl", say=said.append))
    server = AgentLogServer()
    api = fake_api(server)
    info = api.client.get_job_info
    cmd = "python3 -m verl.trainer.main_ppo trainer.save_freq=3 trainer.total_training_steps=5"
    api.client.get_job_info = lambda sid: type("Info", (), {**vars(info(sid)), "entrypoint": cmd})()
    monkeypatch.setattr(w, "api", lambda: api)
    monkeypatch.setattr(w, "_alive_configured", lambda: set())
    monkeypatch.setattr(w, "_gpus", lambda: {})
    monkeypatch.setattr(w.monitor, "lost", lambda expected: None)
    text = (LOGS / "h100_fit-ppo05.log").read_text()
    at = [text.index(f"step:{k} - ") for k in (2, 3, 5)]
    server.write("r", text[:at[0]])
    done = {}
    t = threading.Thread(target=lambda: done.update(out=w.watch_attempt("r")))
    t.start()

    def eta_events():
        try:
            rows = [json.loads(x) for x in (st.dir / "events.jsonl").read_text().splitlines()]
        except OSError:
            return []
        return [e for e in rows if e["action"] == "eta"]

    def wait_for(cond):
        deadline = time.monotonic() + 10
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.02)
        return cond()

    def read_all():  # the watcher's last look found nothing new past the end of what was written
        last = server.requests[-1] if server.requests else None
        return last is not None and last[2] == 416 and int(last[1][6:].split("-")[0]) == server.size("r")

    try:
        assert wait_for(read_all)  # step 1 is in
        time.sleep(0.2)
        assert eta_events() == []
        server.write("r", text[at[0]:at[1]])
        assert wait_for(eta_events)
        server.write("r", text[at[1]:at[2]])  # steps 3 and 4: the estimate moves, but within 10 minutes
        assert wait_for(read_all)
        time.sleep(0.2)
    finally:
        api.client.status = "SUCCEEDED"
        t.join(20)
        server.close()
    assert done["out"].status == "SUCCEEDED"
    (ev,) = eta_events()
    step2 = 11.699785255000052
    assert ev["evidence"] == (f"step 2/5: {step2:.1f} s/step, ~{3 * step2:.0f} s left; 2 saves not timed yet")
    assert ev["class"] == "info" and ev["submission_id"] == "r"
    assert any(x.endswith(f"info: {ev['evidence']} -> eta") for x in said)
