"""torchrun over SSH on two namespace hosts: torch CPU + gloo all-reduce for real; a node killed mid-run."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.wait import wait_for


pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

ALLREDUCE = '''
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1
for step in range(steps):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2, t
    print(f"step {step} rank {rank} sum {t.item():g} ifname {os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
    if steps > 1:
        time.sleep(0.5)
print(f"ALLREDUCE OK rank {rank} world {world}", flush=True)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def hosts(module_lab):
    pytest.importorskip("torch", reason="torch CPU is needed (pip install torch==2.13.0)")
    lab = module_lab
    a, b = lab.add_host("n0"), lab.add_host("n1")
    path = lab.cluster_yaml(a, [b], name=f"tr{lab.n}", extra="network:\n  interface: eth0\n")
    code = lab.dir / "code"
    code.mkdir()
    (code / "allreduce.py").write_text(ALLREDUCE)
    yield lab, path, a, b, code


def job(lab, code, steps, port):
    p = lab.dir / f"tr{steps}.yaml"
    p.write_text(f"name: allreduce\nlauncher: torchrun\ncommand: [python, allreduce.py]\nargs: ['{steps}']\n"
                 f"working_dir: {code}\ntorchrun: {{nproc_per_node: 1, master_port: {port}}}\n")
    return p


def test_allreduce_across_two_hosts(hosts):
    lab, path, a, b, code = hosts
    r = subprocess.run([sys.executable, "-m", "verl_cluster", "submit", str(job(lab, code, 1, 29511)), "-c", str(path)],
                       capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ALLREDUCE OK rank 0 world 2" in r.stdout  # rank 0 streamed
    assert "step 0 rank 0 sum 3 ifname eth0" in r.stdout  # the backend env reached the workers
    assert "rank 1" not in r.stdout  # other ranks are not streamed
    assert "every node exited 0" in r.stderr


def test_node_killed_mid_run_stops_the_other_and_reports_both(hosts):
    lab, path, a, b, code = hosts
    proc = subprocess.Popen([sys.executable, "-m", "verl_cluster", "submit", str(job(lab, code, 400, 29512)),
                             "-c", str(path), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)
    seen = []
    deadline = time.monotonic() + 120
    for line in proc.stderr:  # with --json, rank 0's lines go to stderr
        seen.append(line)
        if "step 3 rank 0" in line or time.monotonic() > deadline:
            break
    assert any("step 3 rank 0" in s for s in seen), "".join(seen)[-2000:]
    t0 = time.monotonic()
    lab.stop(b)
    out, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 1, err[-2000:]
    res = json.loads(out)
    states = {n["rank"]: n for n in res["nodes"]}
    assert states[1]["state"] == "lost" and states[1]["rc"] is None, res
    assert states[0]["state"] in ("exited", "stopped")
    if states[0]["state"] == "exited":
        assert states[0]["rc"] not in (0, None)
    assert states[0]["last_lines"]
    assert elapsed < 60
    assert "rank 1" in err and "lost" in err and "rank 0" in err
    # nothing of the job is left on the surviving host
    wait_for(lambda: not a.pids("allreduce.py"), 10, "the surviving host's ranks to exit")
