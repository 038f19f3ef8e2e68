"""watch's reading of a verl attempt: steps, checkpoints, where it resumed, and what a failure cost; the forms a
job can be submitted in, kept for every attempt; the classes a failure falls in."""

import json

import pytest

from verl_cluster.cli import split_command
from verl_cluster.errors import ConfigError
from verl_cluster.submit.job_input import JobInput
from verl_cluster.watch.failures import actor_death, diagnose
from verl_cluster.watch.progress import read_progress, resume_verdict

P = "\x1b[36m(TaskRunnerV1 pid=3932)\x1b[0m "
FIRST = "\n".join([
    P + "INFO:2026-11-25 14:09:43,966:Training from scratch",
    P + "Checkpoint tracker file does not exist: /ckpt/latest_checkpointed_iteration.txt",
    P + "step:1 - global_seqlen/min:15590.0 - timing_s/step:47.4",
    P + "INFO:2026-11-25 14:10:40,001:Saving checkpoint to /ckpt/global_step_2",
    P + "step:2 - global_seqlen/min:15590.0 - timing_s/save_checkpoint:0.8",
    P + "step:3 - global_seqlen/min:15590.0",
])


def test_steps_and_finished_checkpoints():
    p = read_progress(FIRST)
    assert p.steps == [1, 2, 3] and p.resumed_from == 0
    assert p.saves == [(2, True)] and p.checkpoint == 2
    assert p.lost() == 1  # step 3 ran after the newest checkpoint


def test_a_save_cut_short_is_not_a_checkpoint():
    text = FIRST.rsplit("\n", 2)[0]  # killed while global_step_2 was being written
    p = read_progress(text)
    assert p.saves == [(2, False)] and p.checkpoint == 0 and p.lost() == 1


def test_numbers_in_other_lines_are_not_steps():
    p = read_progress("num_warmup_steps: 0\nTotal steps: 4\nsetting global step to 2\nhanging at step 5\nstep 6\n")
    assert p.steps == [6]


def test_resumed_attempt_and_verdicts():
    new = read_progress(P + "INFO:x:Resuming from /ckpt/global_step_2, setting global step to 2\n"
                        + P + "step:3 - a:1.0\n" + P + "step:4 - a:1.0\n")
    assert new.resumed_from == 2 and new.first_step == 3 and new.resume_path == "/ckpt/global_step_2"
    verdict, why = resume_verdict(new, 2)
    assert verdict == "resumed" and "resumed from step 2" in why and "first step 3" in why
    scratch = read_progress(P + "INFO:x:Training from scratch\n" + P + "step:1 - a:1.0\n")
    verdict, why = resume_verdict(scratch, 2)
    assert verdict == "scratch" and "global_step_2 exists" in why
    assert resume_verdict(scratch, 0)[0] == "unknown"  # nothing to resume from: fine


ACTOR_DIED = """Traceback (most recent call last):
ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunnerV1.run() (pid=3932, ip=10.0.0.2)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: create_colocated_worker_cls.<locals>.WorkerDict
\tactor_id: 6f1c
\tpid: 5552
\tname: abcWorkerDict_0:0
\tnamespace: 2f9c
\tip: 10.0.0.2
The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. There are some potential root causes.
"""


def test_a_killed_worker_on_a_live_node_is_worker_died():
    d = diagnose(ACTOR_DIED.splitlines(), "Job entrypoint command failed with exit code 1")
    assert d.cls == "worker-died" and d.retry
    assert "pid 5552 on 10.0.0.2 died: UNEXPECTED_SYSTEM_EXIT" in d.evidence
    assert "WorkerDict" in actor_death(ACTOR_DIED.splitlines())


def test_a_node_seen_dying_still_wins():
    assert diagnose(ACTOR_DIED.splitlines(), "", lost_node="10.0.0.3").cls == "node-lost"


HYDRA = """Error executing job with overrides: ['algorithm.adv_estimator=grpo', 'trainer.resume_mode=auto']
Traceback (most recent call last):
omegaconf.errors.ConfigAttributeError: Key 'no_such_key' is not in struct
    full_key: actor_rollout_ref.actor.no_such_key
"""


def test_verl_refusing_its_command_is_not_retried():
    d = diagnose(HYDRA.splitlines(), "Job entrypoint command failed with exit code 1", made_progress=False)
    assert d.cls == "user-code" and not d.retry and "no_such_key" in d.evidence


def test_the_hydra_wrapper_alone_before_any_step_is_not_retried():
    lines = ["Error executing job with overrides: ['a=1']", "Set the environment variable HYDRA_FULL_ERROR=1"]
    d = diagnose(lines, "Job entrypoint command failed with exit code 2", made_progress=False)
    assert d.cls == "user-code" and d.detail == "refused-exit-2"
    assert diagnose(lines, "Job entrypoint command failed with exit code 2", made_progress=True).cls == "unknown"


def test_same_failure_signature_ignores_pids():
    a = diagnose(ACTOR_DIED.splitlines(), "")
    b = diagnose(ACTOR_DIED.replace("5552", "6001").replace("10.0.0.2", "10.0.0.9").splitlines(), "")
    assert a.signature() == b.signature()


# ---- the forms a job is submitted in ----

def test_split_command_keeps_job_words_before_the_double_dash():
    argv, before = split_command(["submit", "watch.max_restarts=5", "--watch", "--", "python3", "-m", "verl.x", "a=1"])
    assert argv == ["submit", "--watch", "--", "python3", "-m", "verl.x", "a=1"] and before == ["watch.max_restarts=5"]
    assert split_command(["submit", "job.yaml", "a=1"]) == (["submit", "job.yaml", "a=1"], [])


def test_command_form_round_trips_through_the_record(tmp_path):
    ji = JobInput.from_words("python3", ["-m", "verl.trainer.main_ppo", "data.train_batch_size=16"],
                             ["watch.max_restarts=5"])
    assert ji.kind == "command" and ji.argv[0] == "python3" and ji.overrides == ("watch.max_restarts=5",)
    back = JobInput.from_json(json.loads(json.dumps(ji.to_json())))
    assert back == ji
    job = back.job(["trainer.resume_mode=auto"])
    assert job.watch.max_restarts == 5
    assert job.entrypoint == "verl.trainer.main_ppo"
    assert job.get("trainer.resume_mode") == "auto" and job.get("data.train_batch_size") == 16


def test_words_before_the_command_must_be_key_value():
    with pytest.raises(ConfigError, match="only key=value words"):
        JobInput.from_words("job.yaml", ["python3", "-m", "verl.trainer.main_ppo"])


def test_a_key_value_word_is_not_a_job_file():
    with pytest.raises(ConfigError, match="is not a job file"):
        JobInput.from_words("watch.max_restarts=5", ["launch/gsm8k.yaml"])


def test_spec_and_script_forms(tmp_path):
    spec = tmp_path / "j.yaml"
    spec.write_text("name: j\nentrypoint: verl.trainer.main_ppo\nmodel:\n  path: /m\n")
    ji = JobInput.from_words(str(spec), ["watch.backoff_s=2"])
    assert ji.kind == "spec" and ji.path == str(spec) and ji.job().watch.backoff_s == 2
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/bash\nset -x\npython3 -m verl.trainer.main_ppo data.train_batch_size=16 "
                      "actor_rollout_ref.model.path=/m \"$@\"\n")
    ji = JobInput.from_words(str(script), ["watch.hang_after=75s", "trainer.save_freq=2"])
    assert ji.kind == "script"
    job = JobInput.from_json(ji.to_json()).job(["trainer.resume_mode=auto"])
    assert job.watch.hang_after == "75s" and job.get("trainer.save_freq") == 2
    assert job.get("trainer.resume_mode") == "auto" and job.get("data.train_batch_size") == 16


def test_an_old_record_of_a_command_line_loads(tmp_path):
    """Records written before the forms were kept stored `python3` as the job file and the command as overrides."""
    rec = {"job_file": str(tmp_path / "python3"), "overrides": ["-m", "verl.trainer.main_ppo", "a.b=1"]}
    ji = JobInput.from_record(rec)
    assert ji.kind == "command" and ji.argv[1:] == ("-m", "verl.trainer.main_ppo", "a.b=1")


# ---- recorded on an H100 (verl 0.9.1 + vLLM 0.24.0, tiny GRPO, submit --watch), docs/BENCHMARKS.md ----

from pathlib import Path  # noqa: E402

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "verl_logs"


def _lines(name):
    return (LOGS / name).read_text().splitlines()


def test_recorded_worker_kill_is_worker_died_with_its_evidence():
    """A SIGKILLed ray::WorkerDict 2 s after global_step_2 appeared: Hydra wraps verl's ActorDiedError in 'Error
    executing job with overrides' — still a worker that died on a live node, retried (was called node-lost)."""
    lines = _lines("h100_grpo_tiny_worker_killed.log")
    p = read_progress("\n".join(lines))
    d = diagnose(lines, "Job entrypoint command failed with exit code 1", made_progress=p.first_step is not None)
    assert d.cls == "worker-died" and d.retry
    assert "WorkerDict pid 6361 on 192.0.2.2 died: SYSTEM_ERROR" in d.evidence
    assert p.steps == [1, 2] and p.checkpoint == 2 and p.resumed_from == 0 and p.lost() == 0


def test_recorded_resume_says_where_it_started():
    new = read_progress((LOGS / "h100_grpo_tiny_resumed.log").read_text())
    assert new.resumed_from == 2 and new.first_step == 3 and new.steps == [3, 4] and new.checkpoint == 4
    verdict, why = resume_verdict(new, 2)
    assert verdict == "resumed" and why.startswith("resumed from step 2 (/root/ckpt/watch/argv/global_step_2)")


def test_recorded_hydra_refusal_is_not_retried():
    lines = _lines("h100_grpo_tiny_hydra_refused.log")
    d = diagnose(lines, "Job entrypoint command failed with exit code 1", made_progress=False)
    assert d.cls == "user-code" and not d.retry
    assert "Could not override 'actor_rollout_ref.actor.no_such_key'" in d.evidence


def test_recorded_gpu_runs_ended_as_claimed():
    """The events of the two GPU scenarios kept as evidence: one restart and SUCCEEDED after a worker kill (the
    command-line form), no retry and exit 1 after verl refused an override."""
    import json as _json

    fx = LOGS.parent / "watch_gpu"
    kill = [_json.loads(x) for x in (fx / "h100_argv_kill_events.jsonl").read_text().splitlines()]
    assert [e["class"] for e in kill if e["class"] != "info"] == ["worker-died"]
    assert kill[-1]["action"] == "done: the run SUCCEEDED" and "steps 3..4" in kill[-1]["evidence"]
    assert any(e["action"] == "first step 3" and "resumed from step 2" in e["evidence"] for e in kill)
    figures = _json.loads((fx / "h100_argv_kill_figures.json").read_text())
    assert figures["rc"] == 0 and figures["states"] == ["FAILED", "SUCCEEDED"] and figures["command"][6] == "--"
    refused = _json.loads((fx / "h100_refused_figures.json").read_text())
    assert refused["rc"] == 1 and refused["states"] == ["FAILED"]
    # the same kill under a job YAML (on an H200): one restart, resumed from step 2, SUCCEEDED
    yaml_kill = [_json.loads(x) for x in (fx / "h200_yaml_kill_events.jsonl").read_text().splitlines()]
    assert [e["class"] for e in yaml_kill if e["class"] != "info"] == ["worker-died"]
    assert yaml_kill[-1]["action"] == "done: the run SUCCEEDED" and "1 restart(s)" in yaml_kill[-1]["evidence"]
    figures = _json.loads((fx / "h200_yaml_kill_figures.json").read_text())
    assert figures["rc"] == 0 and figures["states"] == ["FAILED", "SUCCEEDED"]
    assert figures["command"][4] == "launch/gsm8k_grpo.yaml" and figures["resumes"][0].startswith("resumed from step 2")


def test_recorded_script_run_hung_then_killed_resumed_twice():
    """A verl script (`submit run.sh --watch`) on the H100: a worker SIGSTOPped after global_step_2 (hang, bundle,
    resume from 2), then one SIGKILLed after global_step_4 (worker-died, resume from 4), SUCCEEDED with steps 1..6."""
    import json as _json

    fx = LOGS.parent / "watch_gpu"
    ev = [_json.loads(x) for x in (fx / "h100_script_hang_kill_events.jsonl").read_text().splitlines()]
    assert [e["class"] for e in ev if e["class"] != "info"] == ["hang", "hang", "worker-died"]
    bundle = next(e for e in ev if e["action"] == "bundle collected")
    assert "stuck: 127.0.0.1 pid 4376 (worker, stopped) ray::WorkerDict" in bundle["evidence"]
    assert bundle["lines"][0] == 'Thread 4376 (idle): "MainThread"'
    firsts = [e["evidence"] for e in ev if e["action"].startswith("first step")]
    assert [f.split(";")[0] for f in firsts] == ["resumed from step 2 (/root/ckpt/watch/script/global_step_2)",
                                                 "resumed from step 4 (/root/ckpt/watch/script/global_step_4)"]
    assert ev[-1]["action"] == "done: the run SUCCEEDED" and "2 restart(s)" in ev[-1]["evidence"]
    figures = _json.loads((fx / "h100_script_hang_kill_figures.json").read_text())
    assert figures["rc"] == 0 and figures["states"] == ["HANG", "FAILED", "SUCCEEDED"]
    assert figures["command"][4].endswith("run_tiny_grpo.sh") and "--" not in figures["command"]
    # the three attempts' logs, as the watcher reads them
    hung = read_progress((LOGS / "h100_grpo_tiny_script_hung.log").read_text())
    assert hung.steps == [1, 2] and hung.checkpoint == 2 and hung.resumed_from is None
    text = (LOGS / "h100_grpo_tiny_script_resumed_killed.log").read_text()
    r1 = read_progress(text)
    assert (r1.resumed_from, r1.steps, r1.checkpoint, r1.lost()) == (2, [3, 4], 4, 0)
    assert resume_verdict(r1, 2)[0] == "resumed"
    d = diagnose(text.splitlines(), "Job entrypoint command failed with exit code 1", made_progress=True)
    assert d.cls == "worker-died" and d.retry and "WorkerDict pid 11952" in d.evidence
    r2 = read_progress((LOGS / "h100_grpo_tiny_script_resumed_end.log").read_text())
    assert (r2.resumed_from, r2.first_step, r2.steps) == (4, 5, [5, 6])


def test_recorded_hang_bundle_names_the_stopped_worker():
    """The 24 py-spy dumps of the hung verl run, replayed: the SIGSTOPped WorkerDict is named (not the driver, not
    vLLM), with its main thread's frames only."""
    import re

    from verl_cluster.watch.bundle import _stuck

    text = (LOGS.parent / "watch_gpu" / "h100_script_hang_stacks.txt").read_text()
    head = re.compile(r"^== (\S+) pid (\d+) \((\w+), state (\S+), \d+ MiB RSS\) (.*)$", re.M)
    marks = list(head.finditer(text))
    dumps = [(m[1], {"pid": int(m[2]), "role": m[3], "state": m[4], "cmd": m[5],
                     "stack": text[m.end():marks[i + 1].start() if i + 1 < len(marks) else len(text)].strip()})
             for i, m in enumerate(marks)]
    assert len(dumps) == 24 and sum(d["state"] == "T" for _, d in dumps) == 1
    stuck, frames = _stuck(dumps)
    assert stuck == "127.0.0.1 pid 4376 (worker, stopped) ray::WorkerDict"
    assert frames == ['Thread 4376 (idle): "MainThread"', "Worker.main_loop (ray/_private/worker.py:1069)",
                      "<module> (ray/_private/workers/default_worker.py:323)"]


def test_plan_takes_the_job_words_before_the_command(capsys):
    """`plan placement.fill=0.2 -- python3 -m verl...` as submit takes it (the words were dropped)."""
    import json as _json

    from verl_cluster.cli import main

    cmd = ["--", "python3", "-m", "verl.trainer.main_ppo", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
           "+model.catalog=qwen2.5-0.5b", "data.train_batch_size=256"]
    assert main(["plan", "placement.fill=0.2", "--gpus", "1x8xH100-80GB", "--json", *cmd]) in (0, 1)
    doc = _json.loads(capsys.readouterr().out)
    assert doc["lengths"]["fill"] == 0.2, doc.get("lengths")
    assert main(["plan", "placement.fill=7", "--gpus", "1x8xH100-80GB", *cmd]) == 2  # read, and checked


def test_progress_fed_in_pieces_reads_as_the_whole_log():
    """The watcher feeds each poll's new text (lines cut anywhere) instead of reading the whole log again."""
    from tests.unit.agent_log_server import AgentLogServer, fake_api
    from verl_cluster.verl_logs.job_log import AgentLog
    from verl_cluster.watch.detect import LogTracker
    from verl_cluster.watch.progress import Progress

    text = (LOGS / "h100_grpo_tiny_worker_killed.log").read_text()
    whole = read_progress(text)
    pieces = Progress()
    for i in range(0, len(text), 777):
        pieces.feed(text[i:i + 777])
    pieces.flush()
    assert (pieces.steps, pieces.saves, pieces.resumed_from) == (whole.steps, whole.saves, whole.resumed_from)
    server = AgentLogServer()
    try:
        tracker = LogTracker(AgentLog(fake_api(server), "j"))
        server.write("j", text[:5000])
        tracker.update()
        server.write("j", text[5000:])
        tracker.update()
        assert tracker.progress.flush().steps == whole.steps == [1, 2]
        server.logs["job-driver-j.log"] = bytearray(b"step:1 - a:1.0\n")  # a shorter log: it started over
        tracker.update()
        assert tracker.progress.steps == [1] and tracker.progress.saves == []
    finally:
        server.close()
