"""watch: failure classes from recorded log tails (texts from real NCCL/PyTorch/Ray/NVIDIA issue threads),
settings, back-off, events and the one-watcher-per-run lock."""

import json
import subprocess
import sys

import pytest

from verl_cluster.config.job import load_job
from verl_cluster.errors import ClusterError, ConfigError
from verl_cluster.watch.events import Event, Reporter, read_events
from verl_cluster.watch.failures import FailureClass, diagnose
from verl_cluster.watch.runs import FINAL, RunLock, RunState, RunStatus
from verl_cluster.watch.settings import check_watchable, parse_duration, settings_for

# pytorch/pytorch#118369, hiyouga/LlamaFactory#7396
NCCL = """[rank0]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, Timeout(ms)=600000) ran for 600060 milliseconds before timing out.
[rank0]:[E321 02:07:08.465150152 ProcessGroupNCCL.cpp:1664] [PG 1 Rank 0] Exception (either an error or timeout) detected by watchdog at work: 1580, last enqueued NCCL work: 1582, last completed NCCL work: 1579.
Traceback (most recent call last):
RuntimeError: NCCL communicator was aborted"""
# lllyasviel/FramePack#369
OOM = """Traceback (most recent call last):
  File "train.py", line 10, in step
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.29 GiB. GPU 0 has a total capacity of 10.74 GiB of which 3.69 GiB is free. Including non-PyTorch memory, this process has 6.68 GiB memory in use."""
# NVIDIA/NVSentinel#155
XID = """[ 1843.308145] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus.
RuntimeError: CUDA error: unspecified launch failure"""
# ray-project/ray#44680
RAY_NODE = """2024-04-11 16:38:16,464\tWARNING worker.py:2037 -- The node with node id: 4c44 and address: 10.4.3.95 and node name: 10.4.3.95 has been marked dead because the detector has missed too many heartbeats from it. This can happen when a \t(1) raylet crashes unexpectedly (OOM, preempted node, etc.)"""
# hiyouga/EasyR1#324
RAY_OWNER = """Traceback (most recent call last):
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
The actor is dead because its owner has died. Owner Id: 01000000ffff Owner Ip address: 172.21.160.9 Owner worker exit type: SYSTEM_ERROR Worker exit detail: Owner's node has crashed."""
USER = """step 2
Traceback (most recent call last):
  File "resumable_job.py", line 70, in main
    raise ValueError(f"bad value at step {step}")
ValueError: bad value at step 3"""


@pytest.mark.parametrize("text,cls", [(NCCL, "nccl-timeout"), (OOM, "oom"), (XID, "gpu-fault"),
                                      (RAY_NODE, "node-lost"), (RAY_OWNER, "node-lost"), (USER, "user-code"),
                                      ("step 1\nstep 2\n", "unknown")])
def test_log_tails_classified(text, cls):
    d = diagnose(text.splitlines())
    assert d.cls == cls, d
    assert d.retry == (cls != "user-code")


def test_every_log_kind_folds_into_a_failure_class_written_as_its_text():
    from verl_cluster.verl_logs.verl_log import FAILURES
    from verl_cluster.watch import failures

    for kind, *_ in FAILURES:
        assert kind in failures._USER or kind in {c.value for c in FailureClass}, kind
    ev = Event("r", "sid", diagnose(OOM.splitlines()).cls, "re-plan")
    assert json.loads(json.dumps(ev.to_json()))["class"] == "oom" and f"{ev.cls}" == "oom"


def test_user_error_names_the_exception_line():
    assert diagnose(USER.splitlines()).evidence == "ValueError: bad value at step 3"


def test_missing_package_is_not_retried():
    d = diagnose(["ModuleNotFoundError: No module named 'flash_attn'"])
    assert d.cls == "user-code" and d.detail == "missing-package" and not d.retry


def test_a_node_seen_dying_wins_over_the_peers_tracebacks():
    d = diagnose(USER.splitlines(), lost_node="raylet port 10.0.0.3:6700 refuses connections")
    assert d.cls == "node-lost" and d.retry


def test_ray_message_about_the_driver():
    d = diagnose(["step 4"], ray_message="Job supervisor actor died: the node it ran on died")
    assert d.cls == "node-lost"


@pytest.mark.parametrize("text,s", [("90", 90), (45, 45), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1.5m", 90)])
def test_durations(text, s):
    assert parse_duration(text, "watch.hang_after", "j.yaml") == s


@pytest.mark.parametrize("text", ["soon", "-5", "0", "5d"])
def test_bad_duration_names_the_field(text):
    with pytest.raises(ConfigError, match=r"j.yaml: `watch.hang_after` must be a duration"):
        parse_duration(text, "watch.hang_after", "j.yaml")


def test_settings_from_the_job_and_backoff(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("name: j\ncommand: [python, x.py]\nwatch:\n  hang_after: 2m\n  backoff_s: 5\n  backoff_max_s: 30\n")
    job = load_job(p, ["watch.max_restarts=5", "watch.notify=[cat]"])
    s = settings_for(job)
    assert (s.max_restarts, s.hang_after_s, s.notify) == (5, 120.0, ("cat",))
    assert [s.backoff(n) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 30, 30]
    with pytest.raises(ConfigError, match="trainer.default_local_dir"):
        check_watchable(job)
    assert check_watchable(load_job(p, ["trainer.default_local_dir=/shared/ck"])).max_restarts == 3


def test_unknown_watch_key_names_file_and_line(tmp_path):
    p = tmp_path / "j.yaml"
    p.write_text("name: j\ncommand: [python, x.py]\nwatch:\n  max_restart: 2\n")
    with pytest.raises(ConfigError, match=r"j.yaml:4: unknown key `watch.max_restart`") as e:
        load_job(p)
    assert "max_restarts" in e.value.hint


def test_events_go_to_file_terminal_and_notify(tmp_path):
    got = tmp_path / "notified"
    said = []
    notify = (sys.executable, "-c", f"import sys; open({str(got)!r}, 'a').write(sys.stdin.read())")
    rep = Reporter(tmp_path / "events.jsonl", notify, say=said.append)
    rep.emit(Event("run1", "run1", "node-lost", "heal", "GCS marks it dead", "10.0.0.3", ["last line"]))
    (doc,) = read_events(tmp_path / "events.jsonl")
    assert doc["class"] == "node-lost" and doc["node"] == "10.0.0.3" and doc["action"] == "heal"
    assert json.loads(got.read_text())["evidence"] == "GCS marks it dead"
    assert "node-lost 10.0.0.3: GCS marks it dead -> heal" in said[0] and said[1].endswith("last line")
    Reporter(tmp_path / "e2.jsonl", ("false",), say=said.append).emit(Event("r", "r", "info", "x"))
    assert "notify command exited 1" in said[-1]  # reported, the watcher goes on


def test_a_run_state_is_kept_as_its_text_and_read_back_typed(tmp_path, monkeypatch):
    monkeypatch.setattr("verl_cluster.watch.runs.RUNS_ROOT", str(tmp_path))
    st = RunState("run-2", "c", "/c.yaml", "/j.yaml", attempts=[{"submission_id": "run-2"}], state=RunStatus.GAVE_UP)
    st.save()
    assert json.loads((st.dir / "run.json").read_text())["state"] == "gave-up"
    back = RunState.load("c", "run-2")
    assert back.state is RunStatus.GAVE_UP and back.state in FINAL


def test_one_watcher_per_run(tmp_path, monkeypatch):
    monkeypatch.setattr("verl_cluster.watch.runs.RUNS_ROOT", str(tmp_path))
    st = RunState("run-1", "c", "/c.yaml", "/j.yaml", attempts=[{"submission_id": "run-1"}])
    st.save()
    assert RunState.load("c", "run-1").current == "run-1"
    lock = RunLock(st).acquire()
    assert RunLock(st).is_held()
    # a second process is refused with who holds it
    code = ("import sys; sys.path.insert(0, '.'); from verl_cluster.watch import runs; "
            f"runs.RUNS_ROOT = {str(tmp_path)!r}; st = runs.RunState.load('c', 'run-1'); runs.RunLock(st).acquire()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 1 and "already watched (pid" in r.stderr
    lock.release()
    assert not RunLock(st).is_held()
    held = RunLock(st).acquire()
    with pytest.raises(ClusterError):  # in-process too, while held
        RunLock(st).acquire()
    held.release()
