"""One NVML reader (facts/nvml_node.py) for both node-side scripts: the NVML library replaying recorded machines
(2x H200 with NVLink, 1x H100 with two processes) gives back exactly the GPU facts recorded there, and the node
script's views of the same GPUs; shipped, each script carries the reader's source and runs without this package."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from verl_cluster.diagnostics import probe_node
from verl_cluster.diagnostics.gather import PROBE_SOURCE
from verl_cluster.facts import nvml_node
from verl_cluster.nodes import node_script
from verl_cluster.nodes.agent import SCRIPT
from tests.unit.nvml_replay import ReplayedNvml

FACTS = Path(__file__).parents[1] / "fixtures/facts"


def replay(monkeypatch, name, procs=None):
    facts = json.loads((FACTS / name).read_text())
    lib = ReplayedNvml(facts, procs)
    monkeypatch.setattr(nvml_node, "load_library", lambda: lib)
    return facts, lib


@pytest.mark.parametrize("name", ["h200x2_recorded.json", "h100x1.json"])
def test_the_probe_reads_back_what_was_recorded(monkeypatch, name):
    facts, _ = replay(monkeypatch, name)
    gpus, pairs, driver, cuda, error = probe_node.gpus()
    assert gpus == facts["gpus"] and pairs == facts["gpu_pairs"] and error is None
    assert (driver, cuda) == (facts["driver_version"], facts["cuda_version"])


def test_the_node_script_sees_the_same_gpus(monkeypatch):
    facts, _ = replay(monkeypatch, "h200x2_recorded.json")
    gpus, error = node_script.gpus()
    assert error is None
    assert gpus == [{k: g[k] for k in ("index", "name", "memory_total_mib", "memory_free_mib")}
                    for g in facts["gpus"]]


def test_gpu_processes_by_pid(monkeypatch):
    replay(monkeypatch, "h100x1.json", procs={0: [(2113, 24 << 30), (2150, (2**64 - 1))]})
    assert node_script.gpu_procs() == {2113: (0, 24 * 1024), 2150: (0, 0)}  # "not available" counts as 0


def test_no_driver_is_the_same_reason_everywhere(monkeypatch):
    def missing():
        raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    monkeypatch.setattr(nvml_node, "load_library", missing)
    why = "no NVIDIA driver (libnvidia-ml.so.1 not found)"
    assert probe_node.gpus() == ([], [], None, None, why)
    assert node_script.gpus() == ([], why)
    assert node_script.gpu_procs() == {} and node_script.gpu_faults(1) is None


@pytest.mark.parametrize("source,args,key", [(SCRIPT, ["gpuhealth", "0", "1"], "nvml"),
                                             (PROBE_SOURCE, [], "nvml_error")])
def test_shipped_scripts_carry_the_reader(tmp_path, source, args, key):
    # -I: no site-packages, no current directory: only what was shipped
    r = subprocess.run([sys.executable, "-I", "-c", source, *args], capture_output=True, text=True, cwd=tmp_path,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(r.stdout.strip().splitlines()[-1].split("@@VC-JSON@@", 1)[1])
    assert key in data


def test_jobprocs_opens_nvml_once_for_its_processes_and_its_gpus(monkeypatch, tmp_path, capsys):
    """A job's process left on the replayed H100: one NVML init (and one shutdown) serves both the per-process and
    the per-GPU memory in what `jobprocs` emits."""
    facts, lib = replay(monkeypatch, "h100x1.json")
    calls = {"init": 0, "shutdown": 0}
    init, shutdown = lib.nvmlInit_v2, lib.nvmlShutdown

    def counted(key, fn):
        def call(*a):
            calls[key] += 1
            return fn(*a)
        return call

    lib.nvmlInit_v2, lib.nvmlShutdown = counted("init", init), counted("shutdown", shutdown)
    temp = tmp_path / "ray-temp"  # named on the command line, as the processes of this cluster's Ray name it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(temp)],
                             env={"RAY_JOB_ID": "02000000", "PATH": "/usr/bin:/bin"})
    try:
        lib.procs = {0: [(child.pid, 3 << 30)]}
        node_script.cmd_jobprocs(str(temp), "02000000")
    finally:
        child.kill()
        child.wait()
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1].split(node_script.MARK, 1)[1])
    [left] = doc["left"]
    assert (left["pid"], left["gpu"], left["gpu_mib"]) == (child.pid, 0, 3072) and "time.sleep(60)" in left["cmd"]
    g = facts["gpus"][0]
    assert doc["gpus"] == [{"index": 0, "used_mib": g["memory_total_mib"] - g["memory_free_mib"],
                            "total_mib": g["memory_total_mib"]}]
    assert doc["gpu_procs"] == [{"pid": child.pid, "gpu": 0, "mib": 3072, "cmd": left["cmd"][:80]}]
    assert doc["killed"] == [] and set(doc) == {"hostname", "left", "killed", "gpus", "gpu_procs"}
    assert calls == {"init": 1, "shutdown": 1}
