#!/usr/bin/env python3
"""The hang bundle and the clean slate on a GPU machine, through the product's own code (device run, with Ray
staged and `verl-cluster up cluster_configs/local.yaml` done):

    python3 scripts/gpu/gpu_bundle_check.py [--out FILE] [--cluster CLUSTER.yaml] [key=value ...] [--cpu]

Submits a small job whose Ray actor holds 1 GiB on the GPU and then waits in `hold_here`, SIGSTOPs that actor's
process (what the hang case does to a verl worker), collects the bundle as `watch` does (watch/bundle.py: py-spy
of every process of the job, Ray's actor table, worker logs, NVML), then lets clean_slate stop the job and wait
until Ray and NVML hold nothing of it. The actor runs in a worker Ray started before the job (no runtime_env: a
pooled worker, which carries no RAY_JOB_ID of the job), the case the actor table is there for. Prints one JSON
document; exit 1 when the bundle does not name the stopped actor with its own frames and log, or the slate is not
clean. --cpu: the same without a GPU (CI runs it on this machine's cluster: tests/integration/test_lifecycle.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from verl_cluster.config.cluster import load_cluster  # noqa: E402
from verl_cluster.jobs import ray_jobs  # noqa: E402
from verl_cluster.watch.bundle import collect  # noqa: E402
from verl_cluster.watch.clean import clean_slate  # noqa: E402

JOB = """
import os, sys, time, ray
ray.init()
GPU = sys.argv[1] == "gpu"

@ray.remote(num_gpus=1 if GPU else 0)
class Holder:
    def hold(self):
        if GPU:
            import torch
            self.x = torch.empty(2**30, dtype=torch.uint8, device="cuda")
        return os.getpid()

    def hold_here(self):
        time.sleep(900)

h = Holder.remote()
print("holder", ray.get(h.hold.remote()), flush=True)
ray.get(h.hold_here.remote())
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cluster", default="cluster_configs/local.yaml")
    ap.add_argument("overrides", nargs="*", help="cluster.yaml overrides (key=value)")
    ap.add_argument("--out")
    ap.add_argument("--cpu", action="store_true", help="no GPU: check the script itself on a CPU machine")
    args = ap.parse_args()
    spec = load_cluster(args.cluster, args.overrides)
    job = Path(tempfile.mkdtemp()) / "hold_gpu.py"
    job.write_text(JOB)
    doc: dict = {}
    with ray_jobs.connect(spec) as api:
        sid = api.call(api.client.submit_job, entrypoint=f"{sys.executable} {job} {'cpu' if args.cpu else 'gpu'}",
                       submission_id=f"bundle-check-{int(time.time())}")
        deadline, pid = time.time() + 180, None
        while time.time() < deadline and pid is None:
            for line in ray_jobs.logs(api, sid).splitlines():
                if line.startswith("holder "):
                    pid = int(line.split()[1])
            time.sleep(1)
        if pid is None:
            print(json.dumps({"error": "the actor never reported", "log": ray_jobs.logs(api, sid)[-3000:]}))
            return 1
        row = ray_jobs.job_info(api, sid)
        time.sleep(2)  # into hold_here
        os.kill(pid, signal.SIGSTOP)
        t = time.time()
        folder = Path(tempfile.mkdtemp()) / f"bundle-{sid}"
        b = collect(spec, api, sid, row.ray_job_id, folder)
        doc.update(actor_pid=pid, bundle_s=round(time.time() - t, 1), summary=b.summary, stuck=b.stuck,
                   frames=b.frames, files=sorted(p.name for p in folder.iterdir()),
                   nvml=json.loads((folder / "nvml.json").read_text()),
                   stacks=(folder / "stacks.txt").read_text()[-6000:])
        t = time.time()
        slate = clean_slate(spec, api, sid, row.ray_job_id, timeout_s=90)
        doc["clean"] = {"ok": slate.clean, "s": round(time.time() - t, 1), "gpus": slate.gpus,
                        "killed": slate.killed, "left": [*slate.actors, *slate.groups, *slate.procs],
                        "actor_alive_after": alive(pid)}
    problems = []
    if f"pid {pid} (worker, stopped)" not in b.stuck:
        problems.append(f"the stopped actor is not the one named: {b.stuck!r}")
    if not b.frames or not any("hold_here" in f for f in b.frames):
        problems.append(f"the frames are not the actor's own: {b.frames}")
    if " 0 worker log(s)" in b.summary:
        problems.append("the actor's worker log was not found")
    if not slate.clean:
        problems.append("not clean")
    elif doc["clean"]["actor_alive_after"]:
        problems.append(f"clean said, but the stopped actor (pid {pid}) is still there: {slate.gpus}")
    doc["problems"] = problems
    text = json.dumps(doc, indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
