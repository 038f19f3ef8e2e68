"""The hang bundle's choice of what to show: one thread's frames of the stuck process (py-spy dumps of real, stopped
processes), and the processes of a job that get a dump (a shell that runs the driver is not one)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_cluster.facts import nvml_node
from verl_cluster.nodes import node_script
from verl_cluster.watch.bundle import _stuck, top_frames
from tests.unit.nvml_replay import ReplayedNvml

PYSPY = Path(sys.executable).parent / "py-spy"
HUNG = """
import threading, time
ev = threading.Event()
threading.Thread(target=ev.wait, name="gc-like", daemon=True).start()  # as Ray's GC thread: idle, says nothing
def hang_here():
    print("ready", flush=True)
    time.sleep(120)
hang_here()
"""


def dump_of_stopped(tmp_path) -> str:
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        os.kill(p.pid, signal.SIGSTOP)  # what the GPU hang test does to a verl worker
        r = subprocess.run([str(PYSPY), "dump", "--pid", str(p.pid), "--nonblocking"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(not PYSPY.exists(), reason="py-spy comes with ray[default]")
def test_frames_are_the_main_threads_not_a_mix(tmp_path):
    frames = top_frames(dump_of_stopped(tmp_path))
    assert frames[0].startswith("Thread ") and '"MainThread"' in frames[0], frames
    assert frames[1].startswith("hang_here (hung.py:"), frames
    # the idle helper thread's wait came after the main thread's two frames before: it is not shown now
    assert not any("Event.wait" in f or "Condition.wait" in f for f in frames), frames


def test_an_active_thread_is_preferred_and_frames_stop_at_the_next_thread():
    # py-spy's layout (as dumped on the GPU run: Ray's worker main loop idle, a compute thread busy)
    stack = """Process 4854: ray::WorkerDict
Python v3.12.3 (/opt/torch/.venv/bin/python3)

Thread 4854 (idle): "MainThread"
    Worker.main_loop (ray/_private/worker.py:1069)
    <module> (ray/_private/workers/default_worker.py:323)
Thread 4901 (active): "ThreadPoolExecutor-0_0"
    all_gather_into_tensor (torch/distributed/distributed_c10d.py:3822)
    compute_log_prob (verl/workers/fsdp_workers.py:990)
Thread 4902 (idle): "PythonGCThread"
    Condition.wait (threading.py:355)
"""
    assert top_frames(stack) == ['Thread 4901 (active): "ThreadPoolExecutor-0_0"',
                                 "all_gather_into_tensor (torch/distributed/distributed_c10d.py:3822)",
                                 "compute_log_prob (verl/workers/fsdp_workers.py:990)"]
    assert top_frames(stack.replace("(active)", "(idle)"))[:3] == [
        'Thread 4854 (idle): "MainThread"', "Worker.main_loop (ray/_private/worker.py:1069)",
        "<module> (ray/_private/workers/default_worker.py:323)"]
    assert top_frames("Error: no python found") == ["Error: no python found"]


def test_the_stopped_worker_is_named_before_the_driver():
    dumps = [("10.0.0.1", {"pid": 7, "role": "driver", "cmd": "python3 -m verl.trainer.main_ppo", "state": "S",
                           "stack": 'Thread 7 (idle): "MainThread"\n    get (ray/_private/worker.py:2900)\n'}),
             ("10.0.0.2", {"pid": 9, "role": "worker", "cmd": "ray::WorkerDict", "state": "T",
                           "stack": 'Thread 9 (idle): "MainThread"\n    main_loop (ray/_private/worker.py:1069)\n'})]
    stuck, frames = _stuck(dumps)
    assert stuck == "10.0.0.2 pid 9 (worker, stopped) ray::WorkerDict"
    assert frames == ['Thread 9 (idle): "MainThread"', "main_loop (ray/_private/worker.py:1069)"]


def test_a_shell_running_the_driver_gets_no_dump(tmp_path):
    # `submit run.sh`: Ray's job supervisor runs `bash run.sh`, which runs python; both carry the job's metadata in
    # their environment. py-spy cannot read the shell (on the GPU run it was "1 not collected"), so only python is
    # dumped. The shell's command line names the cluster's temp dir, as Ray's processes do.
    temp = tmp_path / "vc-temp"
    temp.mkdir()
    env = {**os.environ, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"metadata": {}, "job_submission_id": "sid-1"})}
    child = f"{sys.executable} -c 'import time; time.sleep(60)'"
    shell = subprocess.Popen(["bash", "-c", f"{child}; : {temp}"], env=env)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            found = node_script.job_pids(str(temp), "sid-1", "")
            if found:
                break
            time.sleep(0.1)
        assert [(role, cmd.split(" ", 1)[0]) for _, role, cmd in found] == [("driver", sys.executable)], found
        assert shell.pid not in [pid for pid, _, _ in found]
        assert node_script.job_pids(str(temp), "another-sid", "") == []
    finally:
        subprocess.run(["pkill", "-9", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()


def test_a_driver_caught_mid_exec_is_left_for_the_next_read(monkeypatch):
    # Between bash's fork and python's exec, /proc/PID/cmdline reads empty (clean-clone CI caught one: the driver
    # came back with no command). Such a process has nothing to dump yet; it is left out, not reported as ''.
    env = {b"RAY_JOB_CONFIG_JSON_ENV_VAR": b'{"job_submission_id": "sid-1"}'}
    procs = {100: (1, "bash -c run.sh; : /tmp/vc-temp"), 101: (100, ""), 102: (100, "/usr/bin/python3 main.py")}
    monkeypatch.setattr(node_script, "read_procs", lambda: procs)
    monkeypatch.setattr(node_script, "environ", lambda pid: env)
    assert node_script.job_pids("/tmp/vc-temp", "sid-1", "") == [(102, "driver", "/usr/bin/python3 main.py")]


def test_the_replayed_h100_answers_as_the_real_one_did(monkeypatch):
    # gpu_nvml_check.py on the H100 (2026-11-25): the ctypes reader and nvidia-smi agreed on the GPU, its memory
    # and a 2 GiB process; the replay the other unit tests use must answer with the same device facts
    real = json.loads((Path(__file__).parents[1] / "fixtures/gpu_health/h100_nvml_reader_vs_smi.json").read_text())
    assert real["problems"] == [] and real["gpus"]["reader"][0]["name"] == real["gpus"]["nvidia_smi"][0][1]
    facts = json.loads((Path(__file__).parents[1] / "fixtures/facts/h100x1.json").read_text())
    monkeypatch.setattr(nvml_node, "load_library", lambda: ReplayedNvml(facts))
    replayed, why = node_script.gpus()
    assert why is None
    assert [(g["name"], g["memory_total_mib"]) for g in replayed] == \
        [(g["name"], g["memory_total_mib"]) for g in real["gpus"]["reader"]]
