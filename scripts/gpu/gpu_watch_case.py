#!/usr/bin/env python3
"""One `--watch` scenario on a real verl run (GPU e2e, scripts/gpu/gpu_e2e.sh steps watch-*): run the submit command,
inject a fault when the run reaches a point, keep everything that tells what happened, compute the figures.

    python3 scripts/gpu/gpu_watch_case.py OUTDIR [--fault 'gpu_fault.py args'] -- verl-cluster submit ... --watch

OUTDIR gets: submit.out/.err (the command's own output), procs.log (Ray/vLLM processes and GPU memory every 2 s),
fault.json, the run folder (run.json, events.jsonl, hang bundles), every attempt's log, Ray's actor table at the
end, small Ray session logs, and figures.json: fault -> detected (first non-info event), -> RUNNING again,
-> first new step, steps lost, restarts, the exit code and how long submit took to return after the end.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Ray's actor table at the end (which actors of which job are still alive), through the cluster's own token
ACTORS = """
import os, ray
from verl_cluster.config.cluster import load_cluster
spec = load_cluster("cluster_configs/local.yaml")
os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(spec.token_file))
ray.init(address=spec.gcs_address, logging_level="ERROR")
from ray.util.state import list_actors
for a in list_actors(limit=10000, detail=True, raise_on_missing_output=False):
    print(a.state, a.class_name, a.job_id, a.pid, a.node_id[:8], str(a.death_cause or "")[:300] if a.state == "DEAD" else "")
"""


def sample_procs(path: Path, stop: threading.Event) -> None:
    with open(path, "a") as fh:
        while not stop.is_set():
            ps = subprocess.run(["ps", "-eo", "pid,etimes,rss,stat,args", "--sort=start_time"], capture_output=True,
                                text=True).stdout.splitlines()
            rows = [r[:220] for r in ps if any(k in r for k in ("ray::", "VLLM", "main_ppo", "verl_cluster watch"))]
            try:
                smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
            except (OSError, subprocess.TimeoutExpired):
                smi = []
            fh.write(json.dumps({"t": time.time(), "procs": rows, "gpu": smi}) + "\n")
            fh.flush()
            stop.wait(2.0)


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: gpu_watch_case.py OUTDIR [--fault ARGS] [--timeout S] -- COMMAND...")
    i = argv.index("--")
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--fault", action="append", default=[],
                    help="arguments for scripts/gpu/gpu_fault.py; repeat for one fault after another (none: no fault)")
    ap.add_argument("--timeout", type=float, default=540)
    args, cmd = ap.parse_args(argv[:i]), argv[i + 1:]
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    home = Path(os.path.expanduser("~/.verl-cluster"))
    runs_before = set(glob.glob(str(home / "*" / "runs" / "*")))
    stop = threading.Event()
    sampler = threading.Thread(target=sample_procs, args=(out / "procs.log", stop), daemon=True)
    sampler.start()
    faults = [subprocess.Popen([sys.executable, str(HERE / "gpu_fault.py"), *shlex.split(a), "--out",
                                str(out / "fault.json")], stdout=subprocess.DEVNULL) for a in args.fault if a]
    t0 = time.time()
    with open(out / "submit.out", "w") as so, open(out / "submit.err", "w") as se:
        p = subprocess.Popen(cmd, stdout=so, stderr=se)
        try:
            rc = p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "timeout"
    t_end = time.time()
    for fault in faults:
        if fault.poll() is None:
            fault.kill()
    stop.set()
    sampler.join(timeout=5)
    # the run folder this command made
    new = sorted(set(glob.glob(str(home / "*" / "runs" / "*"))) - runs_before, key=os.path.getmtime)
    run_dir = Path(new[-1]) if new else None
    if run_dir:
        shutil.copytree(run_dir, out / "run", dirs_exist_ok=True)
    attempts = json.loads((run_dir / "run.json").read_text())["attempts"] if run_dir else []
    if rc == "timeout":  # the watcher was cut: stop what it left running, so the next case finds the GPU free
        for a in attempts:
            subprocess.run([sys.executable, "-m", "verl_cluster", "stop", a["submission_id"]], capture_output=True,
                           timeout=120)
    for a in attempts:
        sid = a["submission_id"]
        with open(out / f"log-{sid}.txt", "w") as fh:
            subprocess.run([sys.executable, "-m", "verl_cluster", "logs", sid], stdout=fh, stderr=subprocess.STDOUT,
                           timeout=120)
    actors = subprocess.run([sys.executable, "-c", ACTORS], capture_output=True, text=True, timeout=120)
    (out / "actors.txt").write_text(actors.stdout + actors.stderr[-3000:])
    ray_dir = sorted(glob.glob("/tmp/vc-*/*/session_latest/logs") + glob.glob("/tmp/vc-*/session_latest/logs"))
    if ray_dir:
        dst = out / "ray-logs"
        dst.mkdir(exist_ok=True)
        for f in glob.glob(ray_dir[-1] + "/*"):
            name = os.path.basename(f)
            if os.path.isfile(f) and os.path.getsize(f) < 2_000_000 and (
                    name.startswith(("raylet", "gcs_server", "python-core-worker", "worker-", "job-driver"))):
                shutil.copy(f, dst / name)
    events = []
    if run_dir and (run_dir / "events.jsonl").exists():
        events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines() if x.strip()]
    injected = [json.loads(x) for x in (out / "fault.json").read_text().splitlines() if x.strip()] \
        if (out / "fault.json").exists() else []
    injected.sort(key=lambda d: d.get("fault_at", 0))
    figures = {"command": cmd, "rc": rc, "wall_s": round(t_end - t0, 1), "attempts": len(attempts),
               "states": [a.get("status") for a in attempts], "faults": []}
    for k, f in enumerate(injected):  # each fault's figures come from the events before the next fault
        ft, nxt = f.get("fault_at"), next((g["fault_at"] for g in injected[k + 1:] if g.get("fault_at")), float("inf"))
        if not ft:
            continue
        after = [e for e in events if ft <= e["time"] < nxt]
        det = next((e for e in after if e["class"] != "info"), None)
        f["detected_s"] = round(det["time"] - ft, 1) if det else None
        f["detected_as"] = det["class"] if det else None
        for key, action in (("running_again_s", "running"), ("first_new_step_s", "first step")):
            ev = next((e for e in after if e["class"] == "info" and e["action"].startswith(action)), None)
            f[key] = round(ev["time"] - ft, 1) if ev else None
        figures["faults"].append(f)
    for e in events:
        if e["class"] == "info" and e["action"].startswith("first step"):
            figures.setdefault("resumes", []).append(e["evidence"])
        if e["action"].startswith("steps lost") or "steps lost" in e.get("evidence", ""):
            figures.setdefault("lost", []).append(e["evidence"])
    last = events[-1]["time"] if events else None
    figures["returned_after_last_event_s"] = round(t_end - last, 1) if last else None
    (out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
