"""scripts/gpu/gpu_mem_sampler.py's host side on this machine's real /proc: the node's used RAM as psutil reports it,
/dev/shm, and per-role RSS/PSS of real child processes whose memory the test controls."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]


S = load_script("scripts/gpu/gpu_mem_sampler.py")
MIB = 2**20
HELD = 96 * MIB
# a child that holds HELD bytes of its own (filled, so resident), starts a grandchild with a plain title, says ready
CHILD = ("import subprocess, sys, time; b = b'\\x01' * int(sys.argv[1]); "
         "g = subprocess.Popen(['sleep', '300']); print(g.pid, flush=True); time.sleep(300)")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def worker():
    """A real process titled as verl's trainer worker (argv[0] `ray::WorkerDict.probe`), holding HELD bytes."""
    p = subprocess.Popen(["ray::WorkerDict.probe", "-c", CHILD, str(HELD)], executable=sys.executable,
                         stdout=subprocess.PIPE, text=True)
    grandchild = int(p.stdout.readline())
    yield p.pid, grandchild
    os.kill(grandchild, 9)
    p.kill()
    p.wait()


def test_used_is_what_the_installed_psutil_reports(tmp_path):
    """A frozen copy of this machine's /proc/meminfo, read by psutil (7.2: total - available) and by the sampler."""
    psutil = pytest.importorskip("psutil")
    shutil.copy("/proc/meminfo", tmp_path / "meminfo")
    old = psutil.PROCFS_PATH
    psutil.PROCFS_PATH = str(tmp_path)
    try:
        vm = psutil.virtual_memory()
    finally:
        psutil.PROCFS_PATH = old
    m = S.read_meminfo(str(tmp_path / "meminfo"))
    new, legacy = S.used_bytes(m)
    assert m["MemAvailable"] == vm.available and m["MemTotal"] == vm.total
    assert (new if S.uses_available(psutil.__version__) else legacy) == vm.used
    assert new == vm.total - vm.available  # psutil >= 7.1
    assert legacy == vm.total - vm.free - vm.buffers - vm.cached  # psutil < 7.1 (cached includes SReclaimable)
    assert legacy != new  # the two definitions differ on a live machine (page cache, shmem)


@pytest.mark.parametrize("version,expected", [("7.1.0", True), ("7.2.2", True), ("8.0", True), ("7.0.0", False),
                                              ("5.9.8", False), (None, True), ("weird", True)])
def test_which_definition_a_psutil_version_uses(version, expected):
    assert S.uses_available(version) is expected


def test_a_child_process_rss_and_pss_land_in_its_role(worker):
    pid, grandchild = worker
    procs = {p["pid"]: p for p in S.scan_processes(with_pss=True)}
    me = procs[pid]
    assert me["role"] == "worker_dict" and me["title"].startswith("ray::WorkerDict.probe")
    assert HELD <= me["anon"] <= me["rss"] < HELD + 64 * MIB
    assert HELD <= me["pss"] <= me["rss"]
    # the grandchild (`sleep`, no role of its own) is counted with its ancestor's role
    assert procs[grandchild]["title"] == "sleep 300" and procs[grandchild]["role"] == "worker_dict"
    roles = S.by_role(list(procs.values()))
    assert roles["worker_dict"]["n"] == 2
    assert roles["worker_dict"]["rss"] >= HELD / MIB
    assert sum(r["n"] for r in roles.values()) == len(procs)
    without = S.scan_processes(with_pss=False)
    assert all(p["pss"] is None for p in without)
    assert S.by_role(without)["worker_dict"]["pss"] is None


@pytest.mark.parametrize("title,role", [
    ("ray::TaskRunnerV1.run", "task_runner"), ("ray::WorkerDict.actor_rollout_ref_compute_log_prob", "worker_dict"),
    ("ray::vLLMHttpServer.wake_up", "vllm_server"), ("VLLM::EngineCore", "vllm_engine"),
    ("VLLM::Worker_TP0", "vllm_worker"), ("ray::AgentLoopWorkerTQ.generate_sequences", "agent_loop"),
    ("ray::IDLE", "ray_idle"), ("/x/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "ray_system"),
    ("/x/ray/core/src/ray/raylet/raylet --raylet_socket_name=", "ray_system"), ("ray::DashboardAgent", "ray_system"),
    ("ray::TransferQueueController", "other_actor"), ("/usr/bin/python -m verl.trainer.main_ppo a=1", "driver"),
    ("python3 -m verl_cluster submit launch/gsm8k.yaml", "client"), ("/usr/sbin/sshd -D", None),
])
def test_roles_by_title(title, role):
    assert S.role_of(title) == role


def test_dev_shm_in_use_counts_a_file_written_there():
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    before = S.dir_used_bytes("/dev/shm")
    path = f"/dev/shm/vc-sampler-test-{os.getpid()}"
    try:
        with open(path, "wb") as f:
            f.write(b"\x01" * (32 * MIB))
        during = S.dir_used_bytes("/dev/shm")
    finally:
        os.unlink(path)
    assert during - before >= 30 * MIB  # other users of /dev/shm may change it a little meanwhile


def test_the_sampler_records_host_lines_and_peaks_without_a_gpu(worker, tmp_path):
    pid, _ = worker
    out, stop = tmp_path / "host.jsonl", tmp_path / "stop"
    p = subprocess.Popen([sys.executable, str(ROOT / "scripts/gpu/gpu_mem_sampler.py"), str(out), "--no-gpu",
                          "--host-interval", "0.3", "--stop-file", str(stop)])
    deadline = time.time() + 20
    while time.time() < deadline and (not out.exists() or out.read_text().count("\n") < 3):
        time.sleep(0.1)
    stop.touch()
    assert p.wait(timeout=20) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    host = [d["host"] for d in lines if "host" in d]
    assert len(host) >= 3 and "summary" in lines[-1]
    assert not any("procs" in d for d in lines)  # no GPU lines without NVML
    new_psutil = S.uses_available(S.psutil_version())
    for h in host:
        assert h["used"] == h["used_available" if new_psutil else "used_legacy"]
        assert 0 < h["used"] < h["total"] and 0 < h["available"] < h["total"]
        assert h["roles"]["worker_dict"]["rss"] >= HELD / MIB
    s = lines[-1]["summary"]
    assert s["peak_gpu_mib"] == [] and s["peak_proc"] == []
    hs = s["host"]
    assert hs["used_is"] == ("total - available" if new_psutil else "total - free - buffers - cached")
    assert hs["node"]["used"] == max(h["used"] for h in host)
    assert hs["node"]["min_available"] == min(h["available"] for h in host)
    assert hs["roles"]["worker_dict"]["rss"] == max(h["roles"]["worker_dict"]["rss"] for h in host)
    assert any(q["pid"] == pid and q["role"] == "worker_dict" for q in hs["procs"])


def test_gpu_line_readers_skip_host_lines(tmp_path):
    """scripts/calibration/verl_memory_report.py reads the GPU lines of the same file: host lines and the summary are skipped."""
    report = load_script("scripts/calibration/verl_memory_report.py")
    f = tmp_path / "nvml.jsonl"
    gpu = {"t": 1.0, "gpus": [1000], "procs": [[0, 7, 900, "ray::WorkerDict.update_actor"]]}
    f.write_text("\n".join(json.dumps(d) for d in (
        gpu, {"t": 1.5, "host": {"used": 1, "roles": {}}}, {"summary": {"peak_gpu_mib": [1000], "host": {}}})) + "\n")
    assert report.read_samples(f) == [gpu]
