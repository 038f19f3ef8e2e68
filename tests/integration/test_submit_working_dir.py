"""`submit -- python -m mymod` typed in the folder that holds mymod.py, on the session's shared cluster (real Ray on
namespace hosts; the hosts do not see this machine's /tmp): without `--working-dir .` it fails with the command that
ships the module and exit 1, and `--watch` does not retry it; with `--working-dir .` it runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.cli import ROOT

pytestmark = pytest.mark.integration


def cli_in(folder, *args, timeout=180):
    """The CLI as a user types it in `folder` (run_cli types it in the repository's root)."""
    return subprocess.run([sys.executable, "-m", "verl_cluster", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture
def here(tmp_path):
    (tmp_path / "mymod.py").write_text("import sys\nprint('mymod ran with', sys.argv[1:], flush=True)\n")
    return tmp_path


def test_module_here_not_shipped_says_how_then_runs_when_shipped(shared_cluster, here):
    path = shared_cluster.path
    r = cli_in(here, "submit", "-c", path, "--", "python", "-m", "mymod", "steps=2")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAILED" in r.stderr and "No module named mymod" in r.stderr, r.stderr[-3000:]
    said = " ".join(r.stderr.split())  # rich wraps long lines
    assert f"mymod.py is in {here}" in said, said[-2000:]
    assert "verl-cluster submit --working-dir . -- python -m mymod ..." in said, said[-2000:]
    r = cli_in(here, "submit", "-c", path, "--working-dir", ".", "--", "python", "-m", "mymod", "steps=2")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mymod ran with ['steps=2']" in r.stdout and "SUCCEEDED" in r.stderr


def test_watch_does_not_retry_a_module_that_was_not_shipped(shared_cluster, here):
    ckpt = shared_cluster.lab.dir / f"ckpt-not-shipped-{here.name}"  # a watched run names its checkpoints' folder
    r = cli_in(here, "submit", "-c", shared_cluster.path, "watch.max_restarts=2", "watch.backoff_s=0.2", "--watch",
               "--", "python", "-m", "mymod", f"trainer.default_local_dir={ckpt}", timeout=240)
    assert r.returncode == 1, r.stderr[-3000:]
    sid = next(line.split()[1].rstrip(";") for line in r.stderr.splitlines() if line.startswith("submitted "))
    (run,) = Path.home().glob(f".verl-cluster/*/runs/{sid}/run.json")
    st = json.loads(run.read_text())
    assert st["state"] == "failed" and st["restarts"] == 0 and len(st["attempts"]) == 1, st
    assert st["attempts"][0]["class"] == "user-code"
    events = [json.loads(x) for x in (run.parent / "events.jsonl").read_text().splitlines()]
    stop = next(e for e in events if e["action"].startswith("not retried"))
    assert "No module named mymod" in stop["evidence"] and "--working-dir . -- python -m mymod" in stop["evidence"]


GC_PROBE = """import gc, json, os, ray
ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})  # as verl's main_ppo calls it


@ray.remote(num_cpus=0)
class Probe:
    def heap(self, n):
        self.x = [[i] for i in range(n)]
        for a in self.x:
            a.append(a)
        gc.collect()
        return {"gc": os.environ.get("VERL_CLUSTER_GC"), "frozen": gc.get_freeze_count()}


print("probe", json.dumps(ray.get(Probe.remote().heap.remote(200000))), flush=True)
"""


def test_gc_freeze_reaches_the_workers_of_a_job_that_calls_ray_init_itself(shared_cluster, tmp_path):
    """The default (python_gc: auto, no flag): Ray runs the shipped set-up in the job's actors (the hosts have no
    copy of it), through the driver's own ray.init(runtime_env=...) as verl's; their full collection froze the
    survivors."""
    (tmp_path / "gcprobe.py").write_text(GC_PROBE)
    r = cli_in(tmp_path, "submit", "-c", shared_cluster.path, "--working-dir", ".",
               "env.VERL_CLUSTER_GC_FREEZE_MIN_S=0", "--", "python", "-m", "gcprobe")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(next(ln.split("probe ", 1)[1] for ln in r.stdout.splitlines() if "probe {" in ln))
    assert got["gc"] == "freeze" and got["frozen"] >= 200000, got
