#!/usr/bin/env python3
"""Submit -> RUNNING latency: `verl-cluster submit --no-follow` vs `ray job submit --no-wait`, same cluster, same run.

Needs root (namespace hosts, as the integration tests). Starts head + 1 worker with `verl-cluster up`, then
alternates the two submitters ROUNDS times with the same program (launch/smoke_job.py, working_dir launch/).
 - ours: wall time of `verl-cluster submit launch/smoke.yaml --no-follow` (it returns once the job is RUNNING;
   that includes preflight, backend env detection and opening its own SSH tunnel to the head's dashboard).
 - ray:  wall time of `ray job submit --no-wait` through an already-open tunnel (Ray's CLI cannot tunnel), then
   polling the job status every 50 ms until RUNNING.
    sudo .venv/bin/python scripts/bench/bench_submit.py [--rounds 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from ray.job_submission import JobSubmissionClient

    from tests.harness import NetnsLab, integration_ready
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.jobs.ray_jobs import auth_headers
    from verl_cluster.launchers import runner_for
    from verl_cluster.lifecycle.down import down
    from verl_cluster.lifecycle.up import up

    reason = integration_ready()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2
    ray_bin = str(Path(sys.executable).with_name("ray"))
    ours, theirs = [], []
    with NetnsLab() as lab:
        head, worker = lab.add_host("head"), lab.add_host("w1")
        path = lab.cluster_yaml(head, [worker], name="bench", extra="network:\n  interface: eth0\n")
        spec = load_cluster(path)
        rep = up(spec)
        if not rep.healthy:
            print(f"up failed: {rep.to_json()}", file=sys.stderr)
            return 1
        runner = runner_for(spec, spec.head)
        tunnel = runner.open_tunnel("127.0.0.1", spec.head.dashboard_port)
        client = JobSubmissionClient(tunnel.url, headers=auth_headers(spec))
        ray_env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(spec.token_file)}
        sleep_env = {"SMOKE_MIN_NODES": "1"}
        try:
            for i in range(args.rounds):
                for who in (("ours", "ray") if i % 2 == 0 else ("ray", "ours")):
                    t0 = time.monotonic()
                    if who == "ours":
                        r = subprocess.run([sys.executable, "-m", "verl_cluster", "submit", str(ROOT / "launch/smoke.yaml"),
                                            "--no-follow", "--json", "-c", str(path)], capture_output=True, text=True,
                                           cwd=ROOT, timeout=120)
                        dt = time.monotonic() - t0
                        if r.returncode != 0:
                            print(r.stderr[-2000:], file=sys.stderr)
                            return 1
                        sid = json.loads(r.stdout)["submission_id"]
                        ours.append(dt)
                    else:
                        sid = f"bench-ray-{i}-{int(time.time())}"
                        r = subprocess.run([ray_bin, "job", "submit", "--no-wait", "--address", tunnel.url,
                                            "--submission-id", sid, "--working-dir", str(ROOT / "launch"),
                                            "--runtime-env-json", json.dumps({"env_vars": sleep_env,
                                                                              "excludes": ["*.parquet"]}),
                                            "--", str(Path(sys.executable).with_name("python")), "smoke_job.py"],
                                           capture_output=True, text=True, env=ray_env, cwd=ROOT, timeout=120)
                        if r.returncode != 0:
                            print(r.stderr[-2000:], file=sys.stderr)
                            return 1
                        while str(client.get_job_status(sid).value) == "PENDING":
                            time.sleep(0.05)
                        dt = time.monotonic() - t0
                        theirs.append(dt)
                    print(f"round {i} {who:>4}: {dt:.2f}s -> RUNNING", flush=True)
                    # let it finish so both always start on an idle cluster
                    while str(client.get_job_status(sid).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
                        time.sleep(0.2)
        finally:
            tunnel.close()
            runner.close()
            down(spec)
    mo, mt = statistics.median(ours), statistics.median(theirs)
    result = {"rounds": args.rounds, "ours_s": ours, "ray_s": theirs, "ours_median_s": round(mo, 3),
              "ray_median_s": round(mt, 3), "ratio": round(mo / mt, 3)}
    print(f"median submit->RUNNING: verl-cluster {mo:.2f}s, ray job submit {mt:.2f}s, ratio {mo / mt:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
